"""``ManifestCheckpoint``: Lightning's ModelCheckpoint, made complete, atomic, verified and honest.

It takes every ModelCheckpoint argument and keeps its scheduling (``every_n_train_steps``,
``train_time_interval``, ``save_top_k``, ``monitor``, ``save_last``...). What changes is what a
checkpoint *is*: a directory with the complete Lightning state, each rank's own RNG and data
position, and a manifest written last that makes it visible. Only checkpoints that hold everything
needed for an exact continuation are marked recoverable, and only those are resumed from.
"""

from __future__ import annotations

import datetime
import logging
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import fsspec
import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.data import extract_batch_size
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from typing_extensions import override

from lightning_field.checkpoint import commit, resume_policy, sharded
from lightning_field.checkpoint.async_save import (
    BackgroundSave,
    DeferredCopies,
    HostSnapshot,
    SaveOutcome,
    optimizer_written_storages,
)
from lightning_field.checkpoint.components import missing_components, present_components
from lightning_field.checkpoint.io import FIELD_KEY, ManifestCheckpointIO, attach_rank_state
from lightning_field.checkpoint.object_store import DEFAULT_CONCURRENCY, DEFAULT_PART_BYTES, ObjectStore
from lightning_field.checkpoint.preemption import (
    DEFAULT_SIGNALS,
    PREEMPTED_EXIT_CODE,
    PreemptionWatcher,
    TrainingPreempted,
    requeue_slurm_job,
)
from lightning_field.checkpoint.resolver import committed_checkpoints, latest_recoverable
from lightning_field.checkpoint.store import CheckpointStore
from lightning_field.checkpoint.verify import CheckpointCorruptError
from lightning_field.compat import lightning as internals
from lightning_field.core.distributed import (
    all_gather_objects,
    broadcast_object,
    elastic_restart_hazard,
    new_host_group,
)
from lightning_field.core.events import EventLog
from lightning_field.core.manifest import SHARED_STATE_FILE, Manifest, is_checkpoint_dir, rank_state_file, read_manifest
from lightning_field.core.storage import Location, as_location, basename, fs_options, is_url, parent
from lightning_field.state import provenance, reshard
from lightning_field.state.data_position import restore_sampler_generators
from lightning_field.state.epoch_metrics import LoggedValueMerge, restore_torchmetrics
from lightning_field.state.loaders import Adoption
from lightning_field.state.rank_state import capture_rank_state
from lightning_field.state.rng import capture_rng_state, restore_rng_state

log = logging.getLogger(__name__)

_SUPPORTED_STRATEGIES = (SingleDeviceStrategy, DDPStrategy)
_SAVE_ERROR_POLICIES = ("stop", "warn")


class NoRecoverableCheckpointError(RuntimeError):
    """``ckpt_path="last"`` found committed checkpoints, but none that resumes exactly.

    Training from step 0 instead would silently throw the run's work away, so it is refused; the
    message lists every checkpoint with what it lacks, and the ways out.
    """


def _unusable_dirpath(dirpath: str | None) -> str | None:
    """Why checkpoints cannot be written under a local ``dirpath``, or None (URLs are the store's)."""
    if not dirpath or is_url(str(dirpath)):
        return None
    path = Path(dirpath)
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        return f"{existing} is a file, not a directory"
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable by this process"
    return None


class ManifestCheckpoint(ModelCheckpoint):
    """Drop-in replacement for :class:`~lightning.pytorch.callbacks.ModelCheckpoint`.

    Args (beyond ModelCheckpoint's own):
        generators: named ``torch.Generator`` objects the run draws from, captured per rank.
        config: the run's resolved configuration (e.g. a Hydra ``DictConfig`` as a dict); defaults to
            the module's and datamodule's hparams. Recorded (secrets redacted) and compared on resume.
        allow_resume_mismatch: provenance differences to accept on resume, by dotted name or prefix,
            e.g. ``["world_size", "code.git_commit", "config"]``.
        preemption_signals: signals that trigger a save at the next step boundary, after which the
            attempt ends with :class:`TrainingPreempted` (exit status 75 when uncaught). Under
            SLURM with Lightning's auto-requeue, its requeue signal is watched too, and global rank
            0 runs ``scontrol requeue`` once the checkpoint is committed.
        preemption_check_every_n_steps: in multi-rank runs, how often ranks agree on a pending
            signal with one small all-reduce. Default: every step on CPU (a host-side op), every 10
            steps on accelerators, where reading the result synchronises the device. Single-process
            runs check every step for free.
        code_dir: where the user's code lives, for the git commit; defaults to the git repository of
            the LightningModule's own source folder, then the main script's, then the working
            directory's, so every entry point names the same code for the same model.
        save_on_train_end: also commit the state training ends with, unless that step is already
            saved. Step-interval checkpoints otherwise leave the last steps unsaved, and rerunning a
            finished job (a requeue after the end) would redo them.
        storage_options: fsspec options for a ``dirpath`` URL such as ``s3://bucket/run/ckpts``
            (e.g. ``{"endpoint_url": ..., "key": ...}``). On object stores the manifest object is the
            commit; see :mod:`lightning_field.checkpoint.object_store`.
        upload_part_bytes, upload_concurrency: multipart part size and parts in flight per file for
            uploads and downloads to an object store.
        async_save: a background thread runs the commit. The save itself copies only what training
            may change next into reusable host buffers (pinned where CUDA is present); on CPU the
            parameters and optimizer state are copied by the writer thread while the next batch's
            forward and backward run, and training waits for that copy (if at all) just before the
            optimizer updates them, or at the next hook outside the training batch. A write to them
            in place before then (a batch hook or forward pass that edits weights) is detected and
            fails that save, after which saves copy everything first. At most one save is in
            flight; a checkpoint is advertised, resolvable and counted for retention only once
            committed.
        on_save_error: what a failed background save does, once reported in the log, the
            ``checkpoint/save_failures`` metric and the event log: ``"stop"`` (raise
            :class:`CheckpointSaveError` on every rank) or ``"warn"`` (keep training).
        store: where the checkpoints go and how a save commits there, a
            :class:`~lightning_field.checkpoint.store.CheckpointStore` (default: a ``LocalStore``
            for a path, an ``ObjectStore`` for a URL); a test double or a backend of your own.
        resume_inexact: when ``ckpt_path="last"`` finds checkpoints but none is recoverable, resume
            the newest one's weights, optimizer and loop state anyway instead of raising
            :class:`NoRecoverableCheckpointError`. Every later manifest of the run then records
            ``provenance.inexact_resume`` (the checkpoint and what it lacked): this continuation is
            not exact, and no evidence may say it is.

    Raises:
        ValueError: ``on_save_error`` is not ``"stop"`` or ``"warn"``, or
            ``preemption_check_every_n_steps`` is below 1; at setup, ``dirpath`` is unusable on any
            rank (under a file, not writable), which every rank raises alike.
        TypeError: ``store`` does not implement :class:`~lightning_field.checkpoint.store.CheckpointStore`.
        NotImplementedError: at setup, a strategy other than single-device, DDP or ModelParallel.
        ResumeMismatchError: on ``fit(ckpt_path=...)``, the checkpoint is not recoverable or was
            written by a different run (code, config, data, model or world size), before anything
            is unpickled.
        NoRecoverableCheckpointError: on ``fit(ckpt_path="last")``, checkpoints exist but none
            resumes exactly (see ``resume_inexact``).

    Example::

        from lightning.pytorch import Trainer
        from lightning_field import ManifestCheckpoint

        checkpoint = ManifestCheckpoint(dirpath="ckpts", every_n_train_steps=500, save_top_k=2)
        trainer = Trainer(max_steps=10_000, callbacks=[checkpoint])
        # Resumes exactly from the newest recoverable checkpoint, or refuses with the reason.
        trainer.fit(model, datamodule=data, ckpt_path="last")
    """

    FILE_EXTENSION = ""

    def __init__(
        self,
        dirpath: str | os.PathLike[str] | None = None,
        filename: str | None = None,
        monitor: str | None = None,
        verbose: bool = False,
        save_last: bool | Literal["link"] | None = None,
        save_top_k: int = 1,
        save_on_exception: bool = False,
        save_weights_only: bool = False,
        mode: str = "min",
        auto_insert_metric_name: bool = True,
        every_n_train_steps: int | None = None,
        train_time_interval: datetime.timedelta | None = None,
        every_n_epochs: int | None = None,
        save_on_train_epoch_end: bool | None = None,
        enable_version_counter: bool = True,
        *,
        generators: Mapping[str, torch.Generator] | None = None,
        config: Mapping[str, Any] | None = None,
        allow_resume_mismatch: Iterable[str] = (),
        preemption_signals: Sequence[int] = DEFAULT_SIGNALS,
        preemption_check_every_n_steps: int | None = None,
        code_dir: str | os.PathLike[str] | None = None,
        save_on_train_end: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        upload_part_bytes: int = DEFAULT_PART_BYTES,
        upload_concurrency: int = DEFAULT_CONCURRENCY,
        async_save: bool = False,
        on_save_error: str = "stop",
        resume_inexact: bool = False,
        store: CheckpointStore | None = None,
    ) -> None:
        if on_save_error not in _SAVE_ERROR_POLICIES:
            raise ValueError(f"on_save_error must be one of {_SAVE_ERROR_POLICIES}, got {on_save_error!r}")
        if store is not None and not isinstance(store, CheckpointStore):
            raise TypeError(
                f"store must implement lightning_field.checkpoint.store.CheckpointStore (writes_in_place, prepare,"
                f" write, staging, upload, publish, discard, remove, clean_leftovers); got {type(store).__name__}"
            )
        # Set before ModelCheckpoint's __init__, whose first filesystem handle already needs them.
        self.storage_options = dict(storage_options or {})
        self._object_store = (
            store if isinstance(store, ObjectStore) else ObjectStore(self.storage_options, upload_part_bytes,
                                                                     upload_concurrency)
        )  # fmt: skip
        self._local_store = commit.LocalStore()
        self._given_store = store
        super().__init__(
            dirpath=dirpath,
            filename=filename,
            monitor=monitor,
            verbose=verbose,
            save_last=save_last,
            save_top_k=save_top_k,
            save_on_exception=save_on_exception,
            save_weights_only=save_weights_only,
            mode=mode,
            auto_insert_metric_name=auto_insert_metric_name,
            every_n_train_steps=every_n_train_steps,
            train_time_interval=train_time_interval,
            every_n_epochs=every_n_epochs,
            save_on_train_epoch_end=save_on_train_epoch_end,
            enable_version_counter=enable_version_counter,
        )
        if preemption_check_every_n_steps is not None and preemption_check_every_n_steps < 1:
            raise ValueError(f"preemption_check_every_n_steps must be >= 1, got {preemption_check_every_n_steps}")
        self._configured_every_n_train_steps = self._every_n_train_steps
        self.generators = dict(generators or {})
        self.config = config
        self.allow_resume_mismatch = tuple(allow_resume_mismatch)
        self.preemption_check_every_n_steps = preemption_check_every_n_steps
        self.code_dir = code_dir
        self.save_on_train_end = save_on_train_end
        self._watcher = PreemptionWatcher(preemption_signals, on_first=self._forward_signal)
        self._trainer: pl.Trainer | None = None
        self._pending_rng: dict[str, Any] | None = None
        self._samples_seen = 0
        self._tokens_seen: int | None = None
        self._static_provenance: dict[str, Any] = {}
        self._data_fingerprint: dict[str, Any] | None = None
        self._resumed_manifest: Manifest | None = None
        self._resharded_from: dict[str, Any] | None = None
        self._events: EventLog | None = None
        self._prefetch_hook_installed = False
        self.preempted_checkpoint: str | None = None
        self._requeue_signal: int | None = None
        self.last_committed: tuple[str, int] | None = None  # (path, step) of the newest commit by this run
        self.last_blocking_seconds: float | None = None  # how long that save held training up
        self._last_copy: str | None = None
        self._undo_loader_patch: Callable[[], None] | None = None
        self._rng_before_validation: dict[str, Any] | None = None
        self._deferred_batch_end: tuple[Any, Any, int] | None = None
        self._deferred_validation_end = False
        self._resumed_epoch_closed = False
        self._loaded_loader_states: list[Any] | None = None
        self._loaded_sampler_state: list[dict[str, Any]] = []
        self._loaded_epoch_metrics: dict[str, Any] | None = None
        self._logged_value_merge: LoggedValueMerge | None = None
        self._adoptions: list[Adoption] = []
        self._told_adopted = False
        self._told_unresumable = False
        self.async_save = async_save
        self.on_save_error = on_save_error
        self.save_failures = 0
        self.last_save_error: str | None = None
        self._background = BackgroundSave()
        self._snapshot: HostSnapshot | None = None
        self._pending: _PendingSave | None = None
        self._host_group: Any = None
        self._force_sync = False
        self._copy_everything_first = False  # set once a deferred copy saw its state written in place
        self._step_hooks: dict[int, Any] = {}
        self._copy_gate: _SnapshotCopyGate | None = None
        self.resume_inexact = resume_inexact
        self._inexact_resume: dict[str, Any] | None = None
        self._show_hint_again: Callable[[], None] | None = None

    # ------------------------------------------------------------------ setup
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage == "fit":
            # Every rank checks and every rank learns of any rank's problem (collective), so a bad
            # dirpath stops the job before its first step instead of at its first save.
            problems = [p for p in all_gather_objects(_unusable_dirpath(self.dirpath)) if p]
            if problems:
                raise ValueError(f"ManifestCheckpoint(dirpath={self.dirpath!r}) is unusable: {problems[0]}")
        if self._show_hint_again is not None:
            self._show_hint_again()
            self._show_hint_again = None
        hazard = elastic_restart_hazard(os.environ)
        if hazard is not None:
            rank_zero_warn(f"lightning_field: {hazard}")
        if sharded.is_sharded(trainer.strategy):
            sharded.check_supported(trainer.strategy)
            # It loads without the CheckpointIO: verification must sit in front of its own loader.
            internals.wrap_strategy_load(trainer.strategy, self._load_sharded)
        elif not isinstance(trainer.strategy, _SUPPORTED_STRATEGIES):
            raise NotImplementedError(
                f"ManifestCheckpoint supports single-device, DDP and ModelParallel strategies;"
                f" {type(trainer.strategy).__name__} (FSDP, DeepSpeed) is not supported yet. For sharded state"
                " use ModelParallelStrategy with torch's fully_shard, whose checkpoints go through DCP."
            )
        self._trainer = trainer
        if self.async_save and trainer.world_size > 1 and self._host_group is None:
            self._host_group = new_host_group()  # every rank runs setup: the group creation is collective
        if self.async_save and self._copy_gate not in trainer.callbacks:
            # First in the list: its hooks run before every other callback's, which is where
            # callbacks like WeightAveraging write the weights a pending copy still reads.
            self._copy_gate = _SnapshotCopyGate(self)
            trainer.callbacks.insert(0, self._copy_gate)
        if not isinstance(trainer.strategy.checkpoint_io, ManifestCheckpointIO):
            trainer.strategy.checkpoint_io = ManifestCheckpointIO(
                trainer.strategy.checkpoint_io, self._check_resume, self._object_store
            )
        self._static_provenance = {
            "code": provenance.code_provenance(self.code_dir, model=pl_module),
            "config": provenance.config_provenance(self._run_config(trainer, pl_module)),
            "environment": provenance.environment_provenance(trainer),
        }
        if trainer.is_global_zero:
            for leftover in self._store.clean_leftovers(as_location(self.dirpath)):
                log.info("Removed leftover from an interrupted save: %s", leftover)
            self._events = EventLog(trainer.default_root_dir, world_size=trainer.world_size)
        if stage == "fit":
            self._prefetch_hook_installed = internals.install_before_fetch(trainer, self._before_train_fetch)
            self._undo_loader_patch = internals.patch_train_loaders(trainer, self._note_adoptions)

    def _note_adoptions(self, adoptions: list[Adoption]) -> None:
        """What the train loaders became when Lightning asked for them (every time it asks)."""
        self._adoptions = adoptions
        adopted = [a for a in adoptions if a.adopted]
        if adopted and not self._told_adopted:
            self._told_adopted = True
            rank_zero_info(
                f"lightning_field: {len(adopted)} plain train DataLoader(s) re-created as torchdata"
                " StatefulDataLoader (same dataset, sampler, collate_fn, workers and generator), so every"
                " checkpoint holds the exact data position."
            )

    def _run_config(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> Any:
        if self.config is not None:
            return dict(self.config)
        config: dict[str, Any] = {"model": dict(pl_module.hparams)}
        datamodule = trainer.datamodule
        if datamodule is not None and getattr(datamodule, "hparams", None):
            config["datamodule"] = dict(datamodule.hparams)
        return config

    @property
    def _store(self) -> CheckpointStore:
        """How this callback's ``dirpath`` commits: the store given, else a rename on a local disk
        and a manifest PUT under a URL."""
        if self._given_store is not None:
            return self._given_store
        return self._object_store if is_url(self.dirpath or "") else self._local_store

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

    @property
    @override
    def state_key(self) -> str:
        # Keyed by the *configured* interval: a cadence controller that retunes it mid-run must not
        # orphan this callback's state in the checkpoints it already wrote.
        return self._generate_state_key(
            monitor=self.monitor,
            mode=self.mode,
            every_n_train_steps=self._configured_every_n_train_steps,
            every_n_epochs=self._every_n_epochs,
            train_time_interval=self._train_time_interval,
        )

    @property
    def every_n_train_steps(self) -> int:
        return self._every_n_train_steps

    def set_every_n_train_steps(self, steps: int) -> None:
        """Change the step interval of saves from now on (used by ``CheckpointCadence``). Every rank
        must set the same value at the same step, or ranks would disagree about when to save."""
        if steps < 1:
            raise ValueError(f"every_n_train_steps must be >= 1, got {steps}")
        self._every_n_train_steps = int(steps)

    @property
    def events(self) -> EventLog | None:
        """The run's event log on global rank 0 while fitting (None elsewhere), for sibling callbacks."""
        return self._events

    # ------------------------------------------------------------------ training hooks
    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._requeue_signal = internals.slurm_requeue_signal(trainer)
        if self._requeue_signal is not None and self._requeue_signal not in self._watcher.signals:
            self._watcher.signals = (*self._watcher.signals, self._requeue_signal)
        self._watcher.install()
        resumed_from = all_gather_objects(str(trainer.ckpt_path) if trainer.ckpt_path else None)
        if len(set(resumed_from)) > 1:
            raise RuntimeError(f"Ranks resumed from different checkpoints {resumed_from}; pass an explicit ckpt_path.")
        loaders = list(internals.iter_loaders(trainer.train_dataloader))
        fingerprint = None
        if trainer.is_global_zero:
            fingerprint = provenance.data_provenance(trainer.datamodule, loaders[0] if loaders else None)
        self._data_fingerprint = broadcast_object(fingerprint)
        if self._resumed_manifest is not None:
            saved = self._resumed_manifest.provenance.get("data")
            if saved is not None:
                resume_policy.refuse_on_differences(
                    {"data": saved}, {"data": self._data_fingerprint}, self.allow_resume_mismatch,
                    self._resumed_manifest.name,
                )  # fmt: skip
        if self._resharded_from is not None:
            old, new = self._resharded_from["world_size"], self._resharded_from["to_world_size"]
            # Logged like the RNG and position notes of the remap itself (a warnings filter must not hide it).
            for warning in reshard.order_warnings(loaders, old, new) if trainer.is_global_zero else []:
                log.warning("Resharded resume from %s: %s", self._resharded_from["checkpoint"], warning)
        # Saved at an epoch's end, Lightning either replays that end (then builds the next epoch's
        # iterator itself) or goes straight on with the iterator it built over the finished position,
        # which yields nothing: an epoch would be lost. Either way the next epoch draws its order,
        # and its workers' seeds, from the generators as they were saved, so those come first.
        restarted_at_epoch_end = trainer.fit_loop.restarted_on_epoch_end
        # Our own checkpoints say so themselves (and were rewritten to resume as the next epoch);
        # Lightning's stage covers checkpoints written before that.
        resumed_after_epoch_end = trainer.fit_loop.resumed_on_epoch_end or self._resumed_epoch_closed
        self._resumed_epoch_closed = False
        internals.undo_epoch_end_double_count(trainer)
        states, self._loaded_loader_states = self._loaded_loader_states, None
        samplers, self._loaded_sampler_state = self._loaded_sampler_state, []
        # A loader built before the restore (estimated_stepping_batches) never got Lightning's.
        unapplied = internals.unapplied_loader_states(trainer)
        internals.rebuild_resumed_iterator(trainer, states or [], samplers, force=unapplied)
        if unapplied:
            internals.forget_loader_states(trainer)
        if samplers:
            restore_sampler_generators(loaders, samplers)
        saved_metrics = (self._loaded_epoch_metrics or {}).get("callback_metrics")
        self._restore_epoch_metrics(trainer, pl_module, restarted_at_epoch_end or resumed_after_epoch_end)
        if restarted_at_epoch_end or resumed_after_epoch_end or not self._prefetch_hook_installed:
            self._before_train_fetch()
            self._pending_rng = None
        if resumed_after_epoch_end and states:
            internals.start_next_epoch_iterator(trainer)
        if resumed_after_epoch_end and saved_metrics:
            internals.step_plateau_schedulers_missed_at_epoch_end(trainer, saved_metrics)
        if self._events is not None:
            self._events.emit("fit_start", step=trainer.global_step)

    def _restore_epoch_metrics(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, resumed_at_epoch_end: bool
    ) -> None:
        saved, self._loaded_epoch_metrics = self._loaded_epoch_metrics, None
        if not saved:
            return
        skip = saved.get("reset_at_epoch_end", []) if resumed_at_epoch_end else []
        gone = restore_torchmetrics(pl_module, saved.get("torchmetrics", {}), skip)
        if gone:
            rank_zero_warn(f"Saved torchmetrics state for {gone} has no metric to go to in this module")
        # A closed epoch's values were logged by the attempt that closed it: nothing to carry over.
        mid_epoch = not resumed_at_epoch_end and trainer.fit_loop.epoch_loop.batch_progress.current.ready > 0
        if mid_epoch and saved.get("logged"):
            self._logged_value_merge = LoggedValueMerge(saved["logged"])

    def _before_train_fetch(self) -> None:
        # Restored before every fetch *attempt* until a batch actually arrives: a resumed epoch
        # that is already exhausted attempts one fetch that only raises StopIteration.
        if self._pending_rng is not None:
            unrestored = restore_rng_state(self._pending_rng, self.generators)
            if unrestored:
                rank_zero_warn(f"Could not restore RNG state for {unrestored}: the continuation may differ")

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._pending_rng = None

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._count_batch(batch)
        if self._logged_value_merge:
            self._logged_value_merge.merge(trainer)
        self._check_background_save(trainer)
        # Host-side copy (~50 µs, no device sync): validation may follow this batch, and its loader
        # draws from the global generators before any validation hook runs.
        self._rng_before_validation = capture_rng_state(self.generators)
        if internals.is_last_batch_of_epoch(trainer):
            # Lightning 2.6 restores a checkpoint taken at the last batch's end as an unfinished
            # epoch and then counts that epoch twice, which shifts every epoch-seeded sampler. The
            # same step saved at the epoch's end restores cleanly, and nothing trains in between.
            self._deferred_batch_end = (outputs, batch, batch_idx)
            return
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self._maybe_save_on_preemption(trainer)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        deferred, self._deferred_batch_end = self._deferred_batch_end, None
        if deferred is not None:
            super().on_train_batch_end(trainer, pl_module, *deferred)
            self._maybe_save_on_preemption(trainer)
        if self._deferred_validation_end:
            self._deferred_validation_end = False
            super().on_validation_end(trainer, pl_module)
        super().on_train_epoch_end(trainer, pl_module)
        # After this epoch's save (which must hold the schedulers as they were before their step).
        internals.let_resumed_epoch_step_schedulers(trainer)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Every rank gets here at the same step, so the collective save is safe.
        if (
            self.save_on_train_end
            and not trainer.sanity_checking
            and self._last_global_step_saved != trainer.global_step
        ):
            self._save_checkpoint(
                trainer, self.format_checkpoint_name(self._monitor_candidates(trainer), "final-{step}")
            )
        self._settle_background_save(trainer)
        super().on_train_end(trainer, pl_module)

    def _count_batch(self, batch: Any) -> None:
        # Shapes are host metadata: counting does not synchronise the device.
        try:
            self._samples_seen += extract_batch_size(batch)
        except Exception:  # an exotic batch without a discoverable size is simply not counted
            return
        if isinstance(batch, Mapping) and isinstance(batch.get("input_ids"), torch.Tensor):
            self._tokens_seen = (self._tokens_seen or 0) + int(batch["input_ids"].numel())

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Validation inside fit leaves the training RNG streams as it found them, so whether a run
        # validated between a checkpoint and the next batch cannot change the continuation.
        fitting = trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking
        if fitting and self._rng_before_validation is not None:
            restore_rng_state(self._rng_before_validation, self.generators)
            self._rng_before_validation = None
        if fitting and internals.is_last_batch_of_epoch(trainer):
            # A save here sits inside the epoch's last batch, and resumes like one saved at that
            # batch's end (see on_train_batch_end): it is taken at the epoch's end instead.
            self._deferred_validation_end = True
            return
        super().on_validation_end(trainer, pl_module)

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._watcher.uninstall()
        self._remove_step_hooks()
        if self._pending is not None and trainer.world_size == 1:
            # Its snapshot is consistent: let it commit. (With peers, they may be gone and its
            # receipt exchange would wait on them; it stays uncommitted, which is safe.)
            self._collect_background_save(trainer, block=True)
            self._pending = None
        if self._undo_loader_patch is not None:
            self._undo_loader_patch()
            self._undo_loader_patch = None
        if self._events is not None:
            status = "preempted" if isinstance(exception, TrainingPreempted) else f"failed: {type(exception).__name__}"
            self._events.end(status, step=trainer.global_step)
            self._events = None
        super().on_exception(trainer, pl_module, exception)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._watcher.uninstall()
        if self._pending is not None:
            self._collect_background_save(trainer, block=True)
            self._pending = None
        self._remove_step_hooks()
        if self._undo_loader_patch is not None:
            self._undo_loader_patch()
            self._undo_loader_patch = None
        if self._events is not None:
            self._events.end("finished", step=trainer.global_step)  # a preemption ends in on_exception
            self._events = None
        super().teardown(trainer, pl_module, stage)

    # ------------------------------------------------------------------ preemption
    def _forward_signal(self, signum: int) -> None:
        # With Lightning's subprocess launcher only rank 0 may receive the signal; pass it on.
        launcher = getattr(self._trainer.strategy, "launcher", None) if self._trainer else None
        if launcher is not None and hasattr(launcher, "kill"):
            launcher.kill(signum)

    def _is_agreement_step(self, trainer: pl.Trainer) -> bool:
        """Whether ranks agree on pending signals (and background-save failures) at this step."""
        every = self.preemption_check_every_n_steps
        if every is None:
            every = 1 if trainer.strategy.root_device.type == "cpu" else 10
        return trainer.global_step % every == 0

    def _maybe_save_on_preemption(self, trainer: pl.Trainer) -> None:
        if trainer.world_size > 1:
            if not self._is_agreement_step(trainer):
                return
            agreed = trainer.strategy.reduce_boolean_decision(self._watcher.requested, all=False)
        else:
            agreed = self._watcher.requested
        if not agreed:
            return
        # An in-flight background save commits first; the final save then blocks until committed.
        self._settle_background_save(trainer)
        if self._last_global_step_saved != trainer.global_step or not self._last_checkpoint_saved:
            candidates = self._monitor_candidates(trainer)
            filepath = self.format_checkpoint_name(candidates, "preempted-{step}")
            self._force_sync = True
            try:
                self._save_checkpoint(trainer, filepath)
            finally:
                self._force_sync = False
        self.preempted_checkpoint = self._last_checkpoint_saved
        trainer.should_stop = True
        sig = self._watcher.received
        name = signal.Signals(sig).name if sig is not None else "a peer rank's signal"
        if self._events is not None:
            self._events.emit(
                "preempted", step=trainer.global_step, payload={"signal": name, "path": self.preempted_checkpoint}
            )
        rank_zero_info(
            f"Preempted ({name}): saved recoverable checkpoint {self.preempted_checkpoint} at step"
            f" {trainer.global_step}; ending this attempt with TrainingPreempted (exit status"
            f" {PREEMPTED_EXIT_CODE} unless caught). Resume with trainer.fit(..., ckpt_path='last')."
        )
        if sig is not None and sig == self._requeue_signal and trainer.is_global_zero:
            requeue_slurm_job()
        # Where plain Lightning raises SIGTERMException: nothing after fit() runs on this model, and
        # the launcher sees an unfinished attempt.
        raise TrainingPreempted(self.preempted_checkpoint, trainer.global_step, name)

    # ------------------------------------------------------------------ saving
    @override
    def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        start = time.perf_counter()
        # At most one save in flight: the previous one commits (and is advertised and pruned for)
        # before this one snapshots into the same buffers. Every rank reaches this point together.
        self._settle_background_save(trainer)
        final = as_location(filepath)
        if self._events is not None:
            self._events.emit("ckpt_save_start", step=trainer.global_step, payload={"path": str(final)})
        if trainer.model is None:
            raise AttributeError("Saving a checkpoint is only possible if a model is attached to the Trainer.")
        job = self._prepare_save(trainer, final, start)
        if not self.async_save or self._force_sync:
            error = self._commit(job, group=None)
            if error is not None:
                raise commit.CheckpointSaveError(self._not_saved_message(job.final, error))
            self._last_global_step_saved = job.step
            self._last_checkpoint_saved = str(final)
            self._advertise(trainer, job, blocking=time.perf_counter() - start)
            return
        snapshot = self._snapshot or HostSnapshot()
        self._snapshot = snapshot
        # Sharded saves copy everything now: DCP's write is collective, so a rank whose deferred
        # copy failed could not skip it alone.
        deferrable = None
        if job.shards is None and not self._copy_everything_first:
            deferrable = optimizer_written_storages(trainer.lightning_module, trainer.optimizers)
            self._hook_optimizer_steps(trainer)
        # One take for both: its buffers are keyed by position in what it copies.
        (job.files, shards), copies = snapshot.take((job.files, job.shards), deferrable, _label_in_files)
        if shards is not None:
            job.shards, job.model_state = shards, shards["state_dict"]
        job.blocking_seconds = time.perf_counter() - start
        group = self._host_group
        def copy_then_commit() -> str | None:
            job.snapshot_error = copies.run()
            return self._commit(job, group)

        try:
            self._background.submit(str(final), job.step, copy_then_commit)
        except BaseException:
            copies.run()  # no writer thread will: nobody may wait on these copies forever
            raise
        self._pending = _PendingSave(job, copies)
        # ModelCheckpoint's own bookkeeping (no double save of a step, "last" as an alias of this
        # step's save). What others see (events, loggers, last_committed, pruning) waits for the commit.
        self._last_global_step_saved = job.step
        self._last_checkpoint_saved = str(final)

    def _prepare_save(self, trainer: pl.Trainer, final: Location, start: float) -> _SaveJob:
        """Everything a commit needs, captured on the training thread: after this, the commit reads
        nothing from the trainer, so it can run while training moves on."""
        checkpoint = internals.dump_checkpoint(trainer, self.save_weights_only)
        rng = capture_rng_state(self.generators)
        rank_state, rank_missing = capture_rank_state(
            trainer, checkpoint, rng, weights_only=self.save_weights_only, samples_seen=self._samples_seen,
            tokens_seen=self._tokens_seen, adoptions=self._adoptions,
        )  # fmt: skip
        for reason in rank_missing:
            if reason.startswith("data_position"):
                self._tell_unresumable(reason)
        rank = trainer.global_rank
        files: dict[str, tuple[Any, list[str]]] = {rank_state_file(rank): (rank_state, ["rng", "data_position"])}
        shared_components: list[str] = []
        shared_missing: list[str] = []
        if trainer.is_global_zero:
            shared_components = present_components(checkpoint, trainer)
            shared_missing = missing_components(checkpoint, trainer, shared_components, self.save_weights_only)
        shards = None
        shared_file = SHARED_STATE_FILE
        if sharded.is_sharded(trainer.strategy):
            # Every rank holds its own shards of the model and optimizer: they go through DCP.
            shards = sharded.split_state(checkpoint)
            shared_file = sharded.SHARDED_SHARED_FILE
            shared_components = [c for c in shared_components if c not in sharded.DCP_COMPONENTS]
        if trainer.is_global_zero:
            files[shared_file] = (checkpoint, shared_components)
        return _SaveJob(
            final=final,
            store=self._store,
            rank=rank,
            is_global_zero=trainer.is_global_zero,
            step=trainer.global_step,
            epoch=trainer.current_epoch,
            world_size=trainer.world_size,
            files=files,
            rank_missing=rank_missing,
            data_restore=list(rank_state["data_position"]["restore"]),
            shared_components=shared_components,
            shared_missing=shared_missing,
            start=start,
            shared_file=shared_file,
            shards=shards,
            model_state=shards["state_dict"] if shards is not None else checkpoint.get("state_dict", {}),
        )

    def _commit(self, job: _SaveJob, group: Any) -> str | None:
        """The commit protocol for one prepared save; the error that stopped it, else None.
        Collective over ``group``: every rank runs it for the same save."""
        store, final = job.store, job.final
        if job.is_global_zero:
            store.prepare(final)
        # The broadcast also orders every rank's writes after rank 0's preparation.
        token = broadcast_object(uuid.uuid4().hex[:8], group=group)
        referenced: list[str] = []
        if job.snapshot_error is not None:  # this rank has nothing to write; the exchange still runs
            outcome = commit.RankOutcome(job.rank, [], job.snapshot_error)
        elif job.shards is not None:
            outcome, referenced = self._write_sharded(job, token, group)
        else:
            outcome = store.write(final, token, job.rank, job.files)
        gathered: list[tuple[commit.RankOutcome, list[str], list[str]]] = all_gather_objects(
            (outcome, job.rank_missing, job.data_restore), group=group
        )
        outcomes = [o for o, _, _ in gathered]
        missing_all = [m for _, m, _ in gathered]
        restore_all = {str(o.rank): r for o, _, r in gathered}
        error = None
        failed = [o for o in outcomes if o.error]
        if failed:
            error = "; ".join(f"rank {o.rank}: {o.error}" for o in failed)
        elif unreported := sharded.unreported_shards(referenced, outcomes):
            error = f"rank 0 (commit): DCP metadata references files no rank reported: {', '.join(unreported)}"
        elif job.is_global_zero:
            try:
                manifest = self._build_manifest(job, outcomes, missing_all)
                manifest.data_restore = restore_all
                manifest.save_seconds = time.perf_counter() - job.start
                store.publish(final, token, manifest)
            except Exception as err:
                error = f"rank 0 (commit): {commit.describe_error(err)}"
        if job.is_global_zero and error is not None:
            store.discard(final, token)
        return broadcast_object(error, group=group)

    @staticmethod
    def _write_sharded(job: _SaveJob, token: str, group: Any) -> tuple[commit.RankOutcome, list[str]]:
        """DCP's shards and this rank's files, with the files DCP's metadata references (rank 0).
        Locally both go straight (durably) into the hidden directory the rename publishes; under a
        URL into a private staging directory, uploaded only when everything in it was written."""
        assert job.shards is not None
        store = job.store
        with store.staging(job.final, token) as staging:
            durable = store.writes_in_place
            outcome, referenced = sharded.write_shards(staging, job.rank, job.shards, group, durable=durable)
            written = commit.write_rank_files(staging, job.rank, job.files, durable=durable)
            outcome.receipts += written.receipts
            outcome.error = outcome.error or written.error
            if outcome.error is None:
                outcome.error = store.upload(job.final, staging, [receipt.file for receipt in outcome.receipts])
            return outcome, referenced

    def _not_saved_message(self, final: Location, error: str) -> str:
        committed = committed_checkpoints(parent(final), self.storage_options)
        kept = f"the previous checkpoint ({committed[0].path}) is intact" if committed else "no earlier one exists"
        return f"Checkpoint {final} was not saved: {error}. Nothing was committed; {kept}."

    def _advertise(self, trainer: pl.Trainer, job: _SaveJob, blocking: float, commit_s: float | None = None) -> None:
        """Only now, after its commit, does a checkpoint exist for anyone else."""
        self.last_committed = (str(job.final), job.step)
        self.last_blocking_seconds = blocking
        if self._events is not None:
            payload: dict[str, Any] = {"path": str(job.final), "blocking_s": blocking}
            if commit_s is not None:
                payload.update({"async": True, "commit_s": commit_s})
            self._events.emit("ckpt_committed", step=job.step, payload=payload)
        if trainer.is_global_zero:
            from weakref import proxy

            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))

    # ------------------------------------------------------------------ the background save's outcome
    def _collect_background_save(self, trainer: pl.Trainer, block: bool) -> None:
        """Take the finished background save's outcome (waiting for it if ``block``): advertise a
        commit, or report a failure at once (log, metrics, event). Rank-local: no collectives."""
        pending = self._pending
        if pending is None or pending.outcome is not None:
            return
        outcome = self._background.wait() if block else self._background.poll()
        if outcome is None:
            return
        pending.outcome = outcome
        blocking = pending.job.blocking_seconds + (pending.copies.waited_seconds if pending.copies else 0.0)
        if outcome.error is None:
            self._advertise(trainer, pending.job, blocking, outcome.finished - outcome.started)
            return
        if pending.job.snapshot_error is not None:
            self._copy_everything_first = True
        self.save_failures += 1
        message = self._not_saved_message(pending.job.final, outcome.error)
        self.last_save_error = message
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics({"checkpoint/save_failures": float(self.save_failures)}, step=trainer.global_step)
        if self._events is not None:
            self._events.emit("ckpt_save_failed", step=outcome.step, payload={"path": outcome.path, "error": message})
        rank_zero_warn(f"Background checkpoint save failed: {message}")

    # ------------------------------------------------------------------ the deferred snapshot copy
    def wait_for_snapshot_copy(self) -> None:
        """Block until the in-flight async save has copied the parameters and optimizer state.

        Training calls it before every optimizer step and at every hook outside the training
        batch. Call it yourself before writing parameters or optimizer state in place anywhere
        else (a batch-level hook, the forward pass) while an async save may be pending.
        """
        pending = self._pending
        if pending is not None and pending.copies is not None:
            pending.copies.wait()

    def _hook_optimizer_steps(self, trainer: pl.Trainer) -> None:
        for optimizer in trainer.optimizers:
            if id(optimizer) not in self._step_hooks:
                self._step_hooks[id(optimizer)] = optimizer.register_step_pre_hook(self._before_optimizer_step)

    def _remove_step_hooks(self) -> None:
        for handle in self._step_hooks.values():
            handle.remove()
        self._step_hooks.clear()

    def _before_optimizer_step(self, optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Step pre-hook: the update must not start before the pending copy is made.

        Lightning passes the closure (training_step and backward) into ``step``, which runs it
        before updating anything: waiting after the closure, not before it, keeps the forward and
        backward overlapped with the copy.
        """
        pending = self._pending
        if pending is None or pending.copies is None or pending.copies.done:
            return None
        closure_in_kwargs = "closure" in kwargs
        closure = kwargs["closure"] if closure_in_kwargs else (args[0] if args else None)
        if closure is None:
            self.wait_for_snapshot_copy()
            return None

        def closure_then_wait() -> Any:
            result = closure()
            self.wait_for_snapshot_copy()
            return result

        if closure_in_kwargs:
            return args, {**kwargs, "closure": closure_then_wait}
        return (closure_then_wait, *args[1:]), kwargs

    def _settle_background_save(self, trainer: pl.Trainer) -> None:
        """Wait for the in-flight save, then prune for it (a commit) or apply ``on_save_error``.
        Every rank calls this at the same point (a save, the end of training): removals broadcast."""
        pending = self._pending
        if pending is None:
            return
        self._collect_background_save(trainer, block=True)
        self._pending = None
        assert pending.outcome is not None
        if pending.outcome.error is None:
            for filepath in pending.removals:
                self._remove_checkpoint(trainer, filepath)
            return
        if pending.removals:
            rank_zero_info(f"Keeping {', '.join(pending.removals)}: the save that would replace them failed")
        if self.on_save_error == "stop":
            raise commit.CheckpointSaveError(self.last_save_error or pending.outcome.error)

    def _check_background_save(self, trainer: pl.Trainer) -> None:
        """At each batch end: surface a finished background save without blocking; under
        ``on_save_error="stop"`` every rank stops together at the step where any rank saw a failure."""
        if not self.async_save:
            return
        self._collect_background_save(trainer, block=False)
        failed = self._pending is not None and self._pending.outcome is not None and self._pending.outcome.error
        if self.on_save_error != "stop":
            return
        if trainer.world_size > 1:
            if not self._is_agreement_step(trainer):
                return
            failed = trainer.strategy.reduce_boolean_decision(bool(failed), all=False)
        if failed:
            self._settle_background_save(trainer)  # raises: the save failed on every rank
            raise commit.CheckpointSaveError(
                f"a background checkpoint save failed on a peer rank at step {trainer.global_step}"
            )


    def _tell_unresumable(self, reason: str) -> None:
        """Once per run, loudly: the run's checkpoints cannot resume exactly, and why."""
        if self._told_unresumable:
            return
        self._told_unresumable = True
        rank_zero_warn(
            f"lightning_field: this checkpoint and every later one are NOT recoverable: {reason}. A resume"
            " could not continue exactly. Fix it as said; `field ckpt inspect` shows what is missing."
        )

    def _build_manifest(
        self, job: _SaveJob, outcomes: list[commit.RankOutcome], missing_all: list[list[str]]
    ) -> Manifest:
        components: dict[str, list[int]] = {c: [0] for c in job.shared_components}
        components["rng"] = sorted(o.rank for o in outcomes)
        components["data_position"] = sorted(
            o.rank
            for o, missing in zip(outcomes, missing_all, strict=True)
            if not any(m.startswith("data_position") for m in missing)
        )
        missing = sorted({m for ranks in missing_all for m in ranks})
        missing += job.shared_missing
        if job.shards is not None:
            holders = sorted({r.rank for o in outcomes for r in o.receipts if r.file.endswith(".distcp")})
            components.update({c: holders for c in sharded.DCP_COMPONENTS if c in job.shared_components_all})
        return Manifest(
            name=basename(job.final),
            step=job.step,
            epoch=job.epoch,
            world_size=job.world_size,
            files=commit.manifest_files(outcomes),
            components=components,
            recoverable=not missing,
            missing=missing,
            kind="export" if self.save_weights_only else "recovery",
            provenance={
                **self._static_provenance,
                "data": self._data_fingerprint,
                "model": provenance.model_provenance(job.model_state),
                "world_size": job.world_size,
                **({"resharded_from": self._resharded_from} if self._resharded_from else {}),
                **({"inexact_resume": self._inexact_resume} if self._inexact_resume else {}),
            },
        )

    # ------------------------------------------------------------------ save_last, retention, resolution
    @override
    def _save_last_checkpoint(self, trainer: pl.Trainer, monitor_candidates: dict[str, Any]) -> None:
        if not self.save_last:
            return
        previous_copy = self._last_copy
        if self._last_checkpoint_saved and self._last_global_step_saved == trainer.global_step:
            # This step is already committed: "last" is a name for it, not a second copy.
            self.last_model_path = self._last_checkpoint_saved
            self._last_copy = None
        else:
            filepath = self.format_checkpoint_name(monitor_candidates, self.CHECKPOINT_NAME_LAST)
            version = self.STARTING_VERSION
            while self.file_exists(filepath, trainer):
                filepath = self.format_checkpoint_name(monitor_candidates, self.CHECKPOINT_NAME_LAST, ver=version)
                version += 1
            self.last_model_path = filepath
            self._save_checkpoint(trainer, filepath)
            self._last_copy = filepath
        # Only a checkpoint written solely to serve as "last" is retired here; top-k ones keep their own rules.
        if (
            previous_copy
            and previous_copy != self.last_model_path
            and self._should_remove_checkpoint(trainer, previous_copy, self.last_model_path)
        ):
            self._remove_checkpoint(trainer, previous_copy)

    @override
    def _remove_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        if self._pending is not None:
            # Retention counts only committed checkpoints: prune once the save that displaces this
            # one has committed (and not at all if it fails).
            self._pending.removals.append(filepath)
            return
        reason = None
        if trainer.is_global_zero:
            reason = self._protection_reason(filepath)
        reason = broadcast_object(reason)
        if reason is not None:
            rank_zero_info(f"Keeping {filepath}: {reason}")
            return
        super()._remove_checkpoint(trainer, filepath)

    def _protection_reason(self, filepath: str) -> str | None:
        target = _identity(filepath)
        entries = committed_checkpoints(parent(filepath), self.storage_options)
        recoverable = [e for e in entries if e.manifest is not None and e.manifest.recoverable]
        if any(_identity(e.path) == target for e in recoverable) and len(recoverable) == 1:
            return "it is the only recoverable checkpoint"
        return None

    @override
    def _find_last_checkpoints(self, trainer: pl.Trainer) -> set[str]:
        where = internals.checkpoint_dir(self, trainer)
        if is_url(where):
            # Lightning would re-open the found URL without the storage options and read a prefix's
            # modification time, which object stores do not have: resolve it explicitly instead.
            raise ValueError(
                f'ckpt_path="last" cannot be resolved by Lightning for the object-store dirpath {where}. Pass'
                f" ckpt_path=lightning_field.latest_recoverable({str(where)!r}, storage_options) instead."
            )
        found = latest_recoverable(where)
        if found is not None:
            return {str(found)}
        entries = committed_checkpoints(where)
        if not entries:
            rank_zero_info(f"lightning_field: no committed checkpoint under {where} yet: training starts at step 0.")
            self._show_hint_again = internals.hide_no_last_checkpoint_hint()
            return set()
        resumable = [e for e in entries if e.manifest is not None and e.manifest.kind == "recovery"]
        if self.resume_inexact and resumable:
            chosen = resumable[0]
            assert chosen.manifest is not None
            self._inexact_resume = {"checkpoint": str(chosen.path), "missing": list(chosen.manifest.missing)}
            rank_zero_warn(
                f"lightning_field: resuming from {chosen.path}, which is NOT recoverable"
                f" ({'; '.join(chosen.manifest.missing)}): weights, optimizer and loop state are restored, but"
                " this continuation is not exact. Every later manifest records provenance.inexact_resume."
            )
            return {str(chosen.path)}
        raise NoRecoverableCheckpointError(_no_recoverable_message(where, entries))

    # ------------------------------------------------------------------ resuming
    def _load_sharded(self, load: Callable[..., dict[str, Any]], path: Any, weights_only: bool | None) -> Any:
        """A sharding strategy's ``load_checkpoint``, behind the same checks as the CheckpointIO's:
        compatibility, then every file verified (split across ranks, or the downloaded copies of a
        URL's) before DCP reads a byte."""
        if not is_checkpoint_dir(path, self.storage_options):
            return load(path, weights_only=weights_only)
        start = time.perf_counter()
        location = as_location(path)
        manifest = read_manifest(location, self.storage_options)
        self._check_resume(manifest, location)
        trainer = self._trainer
        assert trainer is not None
        if not isinstance(location, Path):
            # Each rank loads the copy it downloaded and verified itself (Lightning's own load would
            # read rank 0's private directory on every rank).
            def own_copy(local: Path, weights_only: bool | None = None) -> dict[str, Any]:
                return internals.load_sharded_from(trainer.strategy, local, weights_only)

            return sharded.load_from_object_store(own_copy, location, manifest, self._object_store, weights_only)
        names = list(manifest.files)
        problems = sharded.verify_in_parallel(location, names, trainer.global_rank, trainer.world_size)
        if problems:
            raise CheckpointCorruptError(f"checkpoint {location} failed verification:\n  " + "\n  ".join(problems))
        checkpoint = sharded.load_through_strategy(load, location, weights_only)
        return attach_rank_state(checkpoint, manifest, location, location, start)

    def _check_resume(self, manifest: Manifest, path: Location) -> None:
        """Called by the CheckpointIO before anything is unpickled (``resume_policy``)."""
        inexact = self._inexact_resume is not None and _identity(self._inexact_resume["checkpoint"]) == _identity(path)
        resume_policy.refuse_unrecoverable(manifest, path, inexact)
        trainer = self._trainer
        current = resume_policy.identity_view(
            self._static_provenance.get("code", {}),
            self._static_provenance.get("config", {}).get("resolved"),
            trainer.world_size if trainer else manifest.world_size,
        )
        saved = resume_policy.identity_view(
            manifest.provenance.get("code", {}),
            manifest.provenance.get("config", {}).get("resolved"),
            manifest.world_size,
        )
        resume_policy.refuse_on_differences(saved, current, self.allow_resume_mismatch, path)
        module = trainer.lightning_module if trainer is not None else None
        if module is not None:
            resume_policy.refuse_changed_architecture(manifest, module.state_dict(), self.allow_resume_mismatch, path)
        self._resumed_manifest = manifest
        if current["world_size"] != manifest.world_size:
            # Allowed by the policy (it raised otherwise): every later manifest of this run says
            # which checkpoint it was resharded from, so its lineage stays readable.
            self._resharded_from = {
                "checkpoint": str(path),
                "step": manifest.step,
                "world_size": manifest.world_size,
                "to_world_size": current["world_size"],
            }

    @override
    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        field = checkpoint.get(FIELD_KEY)
        if not field:
            return
        rank_state = field.get("rank_state")
        if rank_state is not None:
            self._pending_rng = rank_state["rng"]
            position = rank_state.get("data_position", {})
            self._loaded_loader_states = position.get("loader_states") or None
            self._loaded_sampler_state = position.get("sampler_state") or []
            self._samples_seen = int(position.get("samples_seen") or 0)
            self._tokens_seen = position.get("tokens_seen")
            self._loaded_epoch_metrics = rank_state.get("epoch_metrics")
            self._resumed_epoch_closed = bool(position.get("epoch_closed"))
            if self._resumed_epoch_closed:
                internals.resume_as_next_epoch(checkpoint)
        if self._events is not None:
            self._events.emit(
                "ckpt_load",
                step=field["manifest"].step,
                payload={"path": field["path"], "seconds": field["load_seconds"]},
            )


@dataclass
class _SaveJob:
    """One save, captured on the training thread: the commit needs nothing else."""

    final: Location
    store: CheckpointStore
    rank: int
    is_global_zero: bool
    step: int
    epoch: int
    world_size: int
    files: dict[str, tuple[Any, list[str]]]
    rank_missing: list[str]
    data_restore: list[str]
    shared_components: list[str]
    shared_missing: list[str]
    start: float
    blocking_seconds: float = 0.0
    snapshot_error: str | None = None  # this rank's deferred copy saw its state written in place
    shared_file: str = SHARED_STATE_FILE
    shards: dict[str, Any] | None = None  # DTensor state for DCP, under sharding strategies
    model_state: Any = None

    @property
    def shared_components_all(self) -> list[str]:
        """Shared components plus those DCP holds on every rank."""
        if self.shards is None:
            return self.shared_components
        with_optimizer = any(key.startswith("optimizer_") for key in self.shards)
        return [*self.shared_components, "model", *(["optimizer"] if with_optimizer else [])]


@dataclass
class _PendingSave:
    """A background save not yet settled, with the removals that wait for its commit."""

    job: _SaveJob
    copies: DeferredCopies | None = None
    outcome: SaveOutcome | None = None
    removals: list[str] = field(default_factory=list)


def _label_in_files(path: tuple[Any, ...]) -> str:
    """``(0, "state.pt", 0, "state_dict", "w")`` (a position in ``(files, shards)``) as ``state.pt: state_dict/w``."""
    if len(path) >= 3 and path[0] == 0:
        return f"{path[1]}: {'/'.join(str(p) for p in path[3:])}"
    return "/".join(str(p) for p in path)


class _SnapshotCopyGate(Callback):
    """Placed first among the Trainer's callbacks: at every hook outside the training batch, the
    pending async copy is made before any callback runs (Lightning's WeightAveraging swaps weights
    in ``on_validation_epoch_start``, StochasticWeightAveraging writes them in
    ``on_train_epoch_start`` and ``on_train_end``, both through ``.data``, which no counter sees)."""

    def __init__(self, owner: ManifestCheckpoint) -> None:
        self._owner = owner

    @property
    def state_key(self) -> str:
        return f"_SnapshotCopyGate[{self._owner.state_key}]"

    def _wait(self, *args: Any, **kwargs: Any) -> None:
        self._owner.wait_for_snapshot_copy()

    on_train_epoch_start = on_train_epoch_end = on_validation_start = on_test_start = _wait
    on_predict_start = on_sanity_check_start = on_train_end = on_fit_end = on_exception = teardown = _wait


def _no_recoverable_message(where: Location, entries: Sequence[Any]) -> str:
    lines = []
    for entry in entries[:10]:
        manifest = entry.manifest
        if manifest is None:
            why = f"unreadable manifest ({entry.error})"
        elif manifest.kind != "recovery":
            why = "a weights-only export"
        else:
            why = "; ".join(manifest.missing) or "failed verification"
        lines.append(f"  {basename(entry.path)}: {why}")
    more = f"\n  ... and {len(entries) - 10} more" if len(entries) > 10 else ""
    return (
        f'ckpt_path="last": {len(entries)} checkpoint(s) under {where}, none recoverable, so this run would'
        " silently start over from step 0. Refusing.\n" + "\n".join(lines) + more + "\n"
        "Ways out: fix what they lack and start a new run (these checkpoints stay as they are); or resume"
        " their weights and optimizer anyway, knowing the continuation is not exact, with"
        " ManifestCheckpoint(resume_inexact=True); or pass ckpt_path=None to start over on purpose."
    )


def _identity(location: str | os.PathLike[str]) -> str:
    loc = as_location(location)
    return str(loc.resolve()) if isinstance(loc, Path) else loc
