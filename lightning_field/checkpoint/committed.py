"""``CommittedCheckpoint``: a ModelCheckpoint whose every save goes through the commit protocol.

This is the save half of :class:`~lightning_field.checkpoint.manifest_checkpoint.ManifestCheckpoint`: where
checkpoints go (the :class:`~lightning_field.checkpoint.stores.CheckpointStore`), how a save is run (synchronously, or
on the writer thread through :class:`~lightning_field.checkpoint.async_controller.AsyncSaves`), and what
ModelCheckpoint's retention and ``save_last`` count: committed checkpoints only, and never the last recoverable one.
What a checkpoint *holds* and *when* training meets it is the subclass's: it supplies :meth:`capture_save`, the
:class:`~lightning_field.checkpoint.commit.SaveJob` of one save, and opens the run's event log.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any
from weakref import proxy

import fsspec
import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from typing_extensions import override

from lightning_field.checkpoint.async_controller import AsyncSaves
from lightning_field.checkpoint.async_save import Stager
from lightning_field.checkpoint.checkpointer import Checkpointer
from lightning_field.checkpoint.commit import SaveJob
from lightning_field.checkpoint.options import SaveErrorPolicy, StorageConfig
from lightning_field.checkpoint.stores import CheckpointStore, CheckpointWriter
from lightning_field.checkpoint.stores.local import name_file
from lightning_field.core.distributed import broadcast_object
from lightning_field.core.events import EventLog
from lightning_field.core.manifest import SHARED_STATE_FILE, StopRecord
from lightning_field.core.storage import Location, as_location, fs_options, same_location

__all__ = ["CommittedCheckpoint"]


class CommittedCheckpoint(ModelCheckpoint):
    """ModelCheckpoint's scheduling and retention, with saves committed through a store.

    Not used on its own: :class:`~lightning_field.checkpoint.manifest_checkpoint.ManifestCheckpoint`
    is the callback, and documents every argument. ``model_checkpoint_args`` are ModelCheckpoint's.
    The private ModelCheckpoint members it overrides or reads are listed, with why, in
    ``lightning_field/compat/lightning_checkpoint.py``.

    Raises:
        ValueError: ``on_save_error`` is not ``"stop"`` or ``"warn"``.
        TypeError: ``store`` does not implement :class:`~lightning_field.checkpoint.stores.CheckpointStore`.
    """

    def __init__(
        self,
        *,
        storage: StorageConfig | None = None,
        **model_checkpoint_args: Any,
    ) -> None:
        storage = storage or StorageConfig()
        # Before ModelCheckpoint's __init__, which sets dirpath on it and whose first filesystem
        # handle already needs the storage options.
        self._checkpointer = Checkpointer(
            store=storage.store,
            storage_options=storage.options,
            upload_part_bytes=storage.upload_part_bytes,
            upload_concurrency=storage.upload_concurrency,
        )
        self.storage_options = self._checkpointer.storage_options
        super().__init__(**model_checkpoint_args)
        self._configured_every_n_train_steps = self._every_n_train_steps
        self.async_save = storage.async_save
        self.last_committed: tuple[str, int] | None = None  # (path, step) of the newest commit by this run
        self.last_blocking_seconds: float | None = None  # how long that save held training up
        self._events: EventLog | None = None
        self._saves = AsyncSaves(
            storage.on_save_error,
            advertise=self._advertise,
            remove=self._remove_checkpoint,
            not_saved_message=self._checkpointer.not_saved_message,
            events=self._current_events,
            agreement_step=self._is_agreement_step,
            stager=self.make_stager(),
        )
        self._last_copy: str | None = None
        self._pending_last_name: tuple[str, str] | None = None  # (checkpoint, its "last" name), made at its commit
        self._last_named: str | None = None
        # Set at setup where saves go through Trainer.save_checkpoint (every strategy but a sharded one).
        self.routes_saves = False
        # Set at setup: whether a committed checkpoint's file can take a second name (a hard link, on a
        # local disk, unsharded), as save_last's "last.ckpt" does; else "last" is the step's own path.
        self.names_files_twice = True
        self._capturing = False
        self._captured: dict[str, Any] | None = None
        self._force_sync = False
        self._stopped: StopRecord | None = None  # save_now's, for the save it makes
        # save_now's resume points (stop, end, preemption) here and in attempts resumed: retired at a newer commit.
        self._resume_points: list[str] = []

    def make_stager(self) -> Stager | None:
        """The async saves' host copy: a subclass may return its own ``Stager`` (None: a ``HostSnapshot``)."""
        return None

    def capture_save(
        self,
        trainer: pl.Trainer,
        final: Location,
        start: float,
        store: CheckpointWriter | None = None,
        checkpoint: dict[str, Any] | None = None,
    ) -> SaveJob:
        """All a save's commit through ``store`` (default: this callback's) needs, taken on the training
        thread; ``checkpoint``: the dict Trainer.save_checkpoint built for it, if it went through there."""
        raise NotImplementedError

    def _is_agreement_step(self, trainer: pl.Trainer) -> bool:
        """Whether ranks agree on a background-save failure at this step (every step by default)."""
        return True

    @override
    def _monitor_candidates(self, trainer: pl.Trainer) -> dict[str, Any]:
        # A logged "step" (a logger's x-axis) would name it for a step its manifest does not hold: refused.
        candidates = super()._monitor_candidates(trainer)
        candidates["step"] = torch.tensor(trainer.global_step)
        return candidates

    # ------------------------------------------------------------------ public state
    @property
    def on_save_error(self) -> SaveErrorPolicy:
        """What a failed background save does: ``"stop"`` or ``"warn"`` (settable between saves)."""
        return self._saves.on_save_error

    @on_save_error.setter
    def on_save_error(self, policy: SaveErrorPolicy) -> None:
        self._saves.on_save_error = policy  # checked there

    @property
    def save_failures(self) -> int:
        """How many background saves failed in this process (``checkpoint/save_failures``)."""
        return self._saves.save_failures

    @property
    def last_save_error(self) -> str | None:
        return self._saves.last_save_error

    @property
    def copies_everything_first(self) -> bool:
        """Whether async saves copy all state before returning, since a deferred copy saw a write in place."""
        return self._saves.copies_everything_first

    @property
    def async_saves(self) -> AsyncSaves:
        """The background save's controller: what is in flight, its host buffers, its waits."""
        return self._saves

    def _current_events(self) -> EventLog | None:  # a method, not a closure: ddp_spawn pickles the callback
        """The run's event log on global rank 0 while fitting (None elsewhere), for sibling callbacks."""
        return self._events

    events = property(_current_events)

    @property
    def last_saved_step(self) -> int:
        """The global step of this callback's newest save in this process (committed, or in flight under
        ``async_save``); -1 before the first."""
        return int(self._last_global_step_saved)

    @property
    def every_n_train_steps(self) -> int:
        return self._every_n_train_steps

    @property
    def configured_every_n_train_steps(self) -> int | None:
        """The step interval given at construction (None if none was), not the live one that
        ``CheckpointCadence`` may have retuned since. Lightning stores "no step interval" as 0."""
        steps = int(self._configured_every_n_train_steps or 0)
        return steps if steps > 0 else None

    def persistent_interval_seconds(self, trainer: pl.Trainer, step_s: float) -> float | None:
        """The seconds between this callback's persistent saves at ``step_s`` a step: the shortest of its
        step, time and epoch intervals; None where none is due before the run's end (an epoch without
        a length, ``every_n_epochs=0``)."""
        intervals: list[float] = []
        if self._every_n_train_steps > 0:
            intervals.append(self._every_n_train_steps * step_s)
        if self._train_time_interval is not None:
            intervals.append(self._train_time_interval.total_seconds())
        batches = trainer.num_training_batches
        if self._every_n_epochs and self._every_n_train_steps == 0 and math.isfinite(batches) and batches > 0:
            steps = math.ceil(batches / max(trainer.accumulate_grad_batches, 1))
            intervals.append(self._every_n_epochs * steps * step_s)
        return min(intervals) if intervals else None

    def set_every_n_train_steps(self, steps: int) -> None:
        """Change the step interval of saves from now on (used by ``CheckpointCadence``). Every rank
        must set the same value at the same step, or ranks would disagree about when to save."""
        if steps < 1:
            raise ValueError(f"every_n_train_steps must be >= 1, got {steps}")
        self._every_n_train_steps = int(steps)

    @property
    @override
    def state_key(self) -> str:
        # Keyed by the *configured* interval: a cadence controller that retunes it mid-run must not
        # orphan this callback's state in the checkpoints it already wrote.
        return f"{type(self).__qualname__}{self._state_key_settings()!r}"

    def _state_key_settings(self) -> dict[str, Any]:
        """What the state key names, in ``ModelCheckpoint.state_key``'s order."""
        return {
            "monitor": self.monitor,
            "mode": self.mode,
            "every_n_train_steps": self._configured_every_n_train_steps,
            "every_n_epochs": self._every_n_epochs,
            "train_time_interval": self._train_time_interval,
        }

    @property
    def model_checkpoint_state_key(self) -> str:
        """The key a ``ModelCheckpoint`` of the same settings keeps its state under."""
        return f"{ModelCheckpoint.__qualname__}{self._state_key_settings()!r}"

    def share_state_with_model_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Saving: this callback's state also under ``ModelCheckpoint``'s key (unless a ModelCheckpoint in the
        same Trainer keeps its own there), so that a run switched back to it keeps the bookkeeping."""
        states = checkpoint.get("callbacks")
        if isinstance(states, dict) and self.state_key in states:
            states.setdefault(self.model_checkpoint_state_key, states[self.state_key])

    def adopt_model_checkpoint_state(self, checkpoint: dict[str, Any], callbacks: list[Any]) -> None:
        """Loading: the state under ``ModelCheckpoint``'s key is this callback's, unless a ModelCheckpoint
        of the same settings in this Trainer takes it itself. A checkpoint ModelCheckpoint wrote (a run
        switched to this callback) gives its best and top-k bookkeeping; in one this callback wrote it
        is the copy :meth:`share_state_with_model_checkpoint` made. Either way it leaves that key, as the
        load hands the dict to Lightning (the CheckpointIO calls this): a state no callback takes makes
        Lightning warn that a ModelCheckpoint is missing from the Trainer, which would be wrong here."""
        states = checkpoint.get("callbacks")
        shared = self.model_checkpoint_state_key
        taken = any(type(c) is ModelCheckpoint and c.state_key == shared for c in callbacks)
        if isinstance(states, dict) and shared in states and not taken:
            states.setdefault(self.state_key, states.pop(shared))

    # ------------------------------------------------------------------ where saves go
    @property
    def checkpointer(self) -> Checkpointer:
        """The Lightning-free core this callback drives: store, commit, retention, resolution, verification."""
        return self._checkpointer

    @property
    def dirpath(self) -> Any:
        return self._checkpointer.dirpath

    @dirpath.setter
    def dirpath(self, dirpath: Any) -> None:
        # ModelCheckpoint sets it in __init__ and again when setup resolves it: one source of truth.
        self._checkpointer.dirpath = dirpath

    @property
    def _store(self) -> CheckpointWriter:
        """How this callback's ``dirpath`` commits: the store given, else a rename on a local disk
        and a manifest PUT under a URL."""
        return self._checkpointer.store

    def store_at(self, location: str | os.PathLike[str]) -> CheckpointStore:
        """What reads (and removes) the checkpoints at ``location``: the store given, where it reads,
        else the default one for its kind, with this callback's storage options."""
        return self._checkpointer.store_at(location)

    @property
    def _fs(self) -> Any:
        return self._field_fs

    @_fs.setter
    def _fs(self, fs: Any) -> None:
        # ModelCheckpoint re-creates its filesystem from the bare URL (in __init__ and setup); a URL
        # needs this callback's storage options (an endpoint, credentials) on every access.
        protocol = fs.protocol[0] if isinstance(fs.protocol, (tuple, list)) else fs.protocol
        if protocol in ("file", "local"):
            self._field_fs = fs
            return
        self._field_fs = fsspec.filesystem(protocol, **fs_options(self.storage_options))

    # ------------------------------------------------------------------ saving
    def save_now(
        self,
        trainer: pl.Trainer,
        name: str | None = "manual-{step}",
        *,
        blocking: bool = False,
        unless_saved: bool = False,
        as_resume_point: bool = False,
        stopped: StopRecord | None = None,
    ) -> str | None:
        """Save a checkpoint of this step now, named from ``name`` like ``filename``.

        Collective: every rank calls it at the same step (preemption, a straggler stop, the end of
        training do). The save obeys the callback's settings (``async_save``, the store, the
        manifest); retention counts it like a scheduled one.

        Args:
            trainer: the Trainer being fitted.
            name: the checkpoint's name template, e.g. ``"preempted-{step}"`` (None: ModelCheckpoint's own
                default, ``"{epoch}-{step}"``).
            blocking: commit before returning, even under ``async_save`` (an in-flight background
                save commits first).
            unless_saved: when this step is already saved, name that checkpoint instead of saving again.
            as_resume_point: the checkpoint only bridges to the next attempt (a stop, a preemption):
                unless ``save_top_k=-1``, retention retires it once a newer checkpoint commits, in this
                attempt or a later one; with ``save_top_k=1`` and no monitor it is the one kept, as
                ModelCheckpoint keeps its newest.
            stopped: why training stops at this step, recorded in the manifest (``Manifest.stopped``).

        Returns:
            The path of the checkpoint (committed when ``blocking`` or not ``async_save``).

        Raises:
            CheckpointSaveError: a synchronous save failed on some rank; nothing was committed.
        """
        if blocking:
            self._saves.settle(trainer)
        if unless_saved and self._last_checkpoint_saved and self._last_global_step_saved == trainer.global_step:
            return self._last_checkpoint_saved
        filepath = self.format_checkpoint_name(self._monitor_candidates(trainer), name)
        replaced = None
        if as_resume_point and self.monitor is None and self.save_top_k == 1:
            # As ModelCheckpoint's own newest-only chain: set before the save, whose state holds it.
            replaced, self.best_model_path = self.best_model_path, filepath
        # Listed before the save, so the checkpoint's own state names it and the next attempt retires it.
        listed = as_resume_point and self.save_top_k != -1 and filepath not in self._resume_points
        if listed:
            self._resume_points.append(filepath)
        self._force_sync, self._stopped = blocking, stopped
        try:
            self._save_checkpoint(trainer, filepath)
        except BaseException:
            if listed:
                self._resume_points.remove(filepath)
            raise
        finally:
            self._force_sync, self._stopped = False, None
        if replaced and self._should_remove_checkpoint(trainer, replaced, filepath):
            self._remove_checkpoint(trainer, replaced)
        return self._last_checkpoint_saved

    def wait_for_snapshot_copy(self) -> None:
        """Block until the in-flight async save has copied the parameters and optimizer state.

        Training calls it before every optimizer step and at every hook outside the training
        batch. Call it yourself before writing parameters or optimizer state in place anywhere
        else (a batch-level hook, the forward pass) while an async save or a snapshot may be pending.
        """
        self._saves.wait_for_snapshot_copy()

    @override
    def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        start = time.perf_counter()
        # At most one save in flight: the previous one commits (and is advertised and pruned for)
        # before this one snapshots into the same buffers. Every rank reaches this point together.
        self._saves.settle(trainer)
        final = self.checkpoint_folder(filepath)
        if self._events is not None:
            self._events.emit("ckpt_save_start", step=trainer.global_step, payload={"path": str(final)})
        if trainer.model is None:
            raise AttributeError("Saving a checkpoint is only possible if a model is attached to the Trainer.")
        checkpoint = None
        if self.routes_saves:
            checkpoint = self._dump_through_trainer(trainer, filepath)
            if checkpoint is None:
                # Trainer.save_checkpoint is replaced by one that never reached the strategy (a mock, an override
                # that saves elsewhere): ModelCheckpoint's bookkeeping, as for its own save; nothing to commit.
                self._last_global_step_saved = trainer.global_step
                self._last_checkpoint_saved = filepath
                return
        job = self.capture_save(trainer, final, start, checkpoint=checkpoint)
        job.stopped = self._stopped
        if final != as_location(filepath):
            job.advertised_suffix = self.FILE_EXTENSION
        # ModelCheckpoint's own bookkeeping (no double save of a step, "last" as an alias of this
        # step's save). What others see (events, loggers, last_committed, pruning) waits for the commit.
        if not self.async_save or self._force_sync:
            self._checkpointer.commit(job)
            self._last_global_step_saved = job.step
            self._last_checkpoint_saved = filepath
            self._advertise(trainer, job, time.perf_counter() - start)
            self._retire_resume_points(trainer, filepath)
            return
        self._saves.submit(trainer, job, start)
        self._last_global_step_saved = job.step
        self._last_checkpoint_saved = filepath
        self._retire_resume_points(trainer, filepath)

    def _dump_through_trainer(self, trainer: pl.Trainer, filepath: str) -> dict[str, Any] | None:
        """The checkpoint dict ``Trainer.save_checkpoint`` handed the strategy for this save (None where
        it handed none), which the commit writes instead: an override of ``Trainer.save_checkpoint``
        sees each save, as ModelCheckpoint's."""
        self._capturing, self._captured = True, None
        try:
            trainer.save_checkpoint(filepath, self.save_weights_only)
        finally:
            captured, self._capturing, self._captured = self._captured, False, None
        return captured

    def take_checkpoint(self, checkpoint: dict[str, Any]) -> bool:
        """The strategy's save, offered the dict (``compat.lightning.intercept_strategy_save``): taken
        while this callback's own save is under way, else left to the strategy."""
        if not self._capturing:
            return False
        self._captured, self._capturing = checkpoint, False
        return True

    def checkpoint_folder(self, filepath: str | os.PathLike[str]) -> Location:
        """The checkpoint folder behind a path ModelCheckpoint's naming made: ``<name>`` for
        ``<name>.ckpt`` where its ``state.pt`` takes that name after the commit (``FILE_EXTENSION``
        is emptied at setup where it cannot: a sharded checkpoint, an object store)."""
        location = as_location(filepath)
        extension = self.FILE_EXTENSION
        if not extension:
            return location
        if not isinstance(location, Path):  # an object store's <prefix>/state.pt
            return location.removesuffix(extension)
        stem = location.name.removesuffix(extension)
        return location.with_name(stem) if stem and stem != location.name else location

    def _retire_resume_points(self, trainer: pl.Trainer, newest: str) -> None:
        # Removals wait for the commit of ``newest`` under async_save (``_remove_checkpoint``).
        for point in [p for p in self._resume_points if p != newest]:
            self._resume_points.remove(point)
            if not self.retains(point) and self._should_remove_checkpoint(trainer, point, newest):
                self._remove_checkpoint(trainer, point)

    def _advertise(self, trainer: pl.Trainer, job: SaveJob, blocking: float, commit_s: float | None = None) -> None:
        """Only now, after its commit, does a checkpoint exist for anyone else."""
        self.last_committed = (str(job.final), job.step)
        self.last_blocking_seconds = blocking
        if self._events is not None:
            payload: dict[str, Any] = {"path": str(job.final), "blocking_s": blocking}
            if commit_s is not None:
                payload.update({"async": True, "commit_s": commit_s})
            self._events.emit("ckpt_committed", step=job.step, payload=payload)
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))
        pending = self._pending_last_name
        if pending is not None and same_location(self.checkpoint_folder(pending[0]), job.final):
            self._name_last(trainer)

    # ------------------------------------------------------------------ save_last, retention, resolution
    @override
    def _save_last_checkpoint(self, trainer: pl.Trainer, monitor_candidates: dict[str, Any]) -> None:
        if not self.save_last:
            return
        saved_now = bool(self._last_checkpoint_saved) and self._last_global_step_saved == trainer.global_step
        if saved_now and not self.names_files_twice:
            # A sharded or object-store checkpoint has no file to give a second name: "last" is this
            # step's checkpoint itself, not a second full commit of it.
            self.last_model_path = self._last_checkpoint_saved
            self._retire_last_copy(trainer, name_moves=True)
            return
        filepath = self.format_checkpoint_name(monitor_candidates, self.CHECKPOINT_NAME_LAST)
        version = self.STARTING_VERSION
        while self._enable_version_counter and self.file_exists(filepath, trainer) and filepath != self.last_model_path:
            filepath = self.format_checkpoint_name(monitor_candidates, self.CHECKPOINT_NAME_LAST, ver=version)
            version += 1
        previous, self.last_model_path = self.last_model_path, filepath
        named_before = self._last_named
        if saved_now and filepath != self._last_checkpoint_saved:
            # ModelCheckpoint writes this step a second time (or links it, for "link"). Here "last" is a
            # second name of the file this step's commit advertises: the same bytes, at no cost, named
            # once that commit is done (under async_save, when it is).
            self._retire_last_copy(trainer, name_moves=True)
            self._pending_last_name = (self._last_checkpoint_saved, filepath)
            committed = self.last_committed is not None and same_location(
                self.last_committed[0], self.checkpoint_folder(self._last_checkpoint_saved)
            )
            if committed:
                self._name_last(trainer)
            if self.save_last is True:
                self._last_checkpoint_saved = filepath  # as ModelCheckpoint's own save of it would
        else:
            self._save_checkpoint(trainer, filepath)
            self._retire_last_copy(trainer, name_moves=False)
            self._last_copy = filepath
        if previous and previous != filepath and previous == named_before:
            self._remove_checkpoint(trainer, previous)  # a name an earlier step's "last" had: the name alone goes

    def _retire_last_copy(self, trainer: pl.Trainer, name_moves: bool) -> None:
        """Remove the checkpoint an earlier step wrote solely to serve as "last" (top-k ones keep their own
        rules), unless this save replaced it in place. By its folder: its name may be about to name another."""
        copy, self._last_copy = self._last_copy, None
        if not copy or (copy == self.last_model_path and not name_moves):
            return
        folder = str(self.checkpoint_folder(copy))
        if self._should_remove_checkpoint(trainer, folder, self.last_model_path):
            self._remove_checkpoint(trainer, folder)

    def _name_last(self, trainer: pl.Trainer) -> None:
        """Give the committed checkpoint ``save_last`` names its "last" name: the symbolic link
        ``save_last="link"`` asks for, else a hard link to its ``state.pt``."""
        assert self._pending_last_name is not None
        target, name = self._pending_last_name
        self._pending_last_name = None
        self._last_named = name
        if not trainer.is_global_zero:
            return
        symbolic = self.save_last == "link"
        source = Path(target) if symbolic else Path(self.checkpoint_folder(target)) / SHARED_STATE_FILE
        try:
            name_file(source, Path(name), symbolic=symbolic, durable=getattr(self.store_at(name), "durable", True))
        except OSError as err:
            rank_zero_warn(f"lightning_field: {target} is committed, but could not also be named {name}: {err}")

    @override
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "resume_points": list(self._resume_points)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        points = state_dict.get("resume_points", [])
        if state_dict.get("dirpath", self.dirpath) == self.dirpath and isinstance(points, list):
            # Read back from storage others can write: only names of checkpoints in this dirpath are
            # ever removed, whatever the saved list says.
            self._resume_points = [
                p for p in points if isinstance(p, str) and self._checkpointer.is_own(self.checkpoint_folder(p))
            ]

    @override
    def _should_remove_checkpoint(self, trainer: pl.Trainer, previous: str, current: str) -> bool:
        # ModelCheckpoint keeps a run's resumed-from checkpoint forever, lest a crash before the next save leave
        # nothing; here it counts in save_top_k: removals wait for the commit and spare ``protection_reason``'s.
        return previous != current and self._checkpointer.is_own(self.checkpoint_folder(previous))

    @override
    def _remove_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        if self._saves.defer_removal(filepath):
            return
        reason = broadcast_object(self.protection_reason(filepath) if trainer.is_global_zero else None)
        if reason is not None:
            rank_zero_info(f"Keeping {filepath}: {reason}")
            return
        super()._remove_checkpoint(trainer, filepath)

    def protection_reason(self, filepath: str) -> str | None:
        """Why retention must keep ``filepath`` (``Checkpointer.protection_reason``), else None."""
        return self._checkpointer.protection_reason(self.checkpoint_folder(filepath))

    def retains(self, filepath: str | os.PathLike[str]) -> bool:
        """Whether ModelCheckpoint's own retention still keeps ``filepath`` (every one under ``save_top_k=-1``)."""
        kept = [self.best_model_path, self.last_model_path, self._last_checkpoint_saved, *self.best_k_models]
        folder = self.checkpoint_folder(filepath)
        return self.save_top_k == -1 or any(
            p and same_location(self.checkpoint_folder(p), folder) for p in [*kept, *self._resume_points]
        )
