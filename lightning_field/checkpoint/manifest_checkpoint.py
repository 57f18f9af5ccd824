"""``ManifestCheckpoint``: Lightning's ModelCheckpoint, made complete, atomic, verified and honest.

Every ModelCheckpoint argument and its scheduling stay; a checkpoint becomes a directory with the whole
Lightning state, each rank's RNG and data position, and a manifest written last that makes it visible.
This module decides *when* and captures a ``SaveJob``; the Lightning-free ``Checkpointer`` does the rest.
"""

import datetime
import logging
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from typing_extensions import override

from lightning_field.checkpoint import sharded_load
from lightning_field.checkpoint.capture import capture_job, check_strategy
from lightning_field.checkpoint.commit import CheckpointSaveError, SaveJob
from lightning_field.checkpoint.committed import CommittedCheckpoint
from lightning_field.checkpoint.exception_save import ExceptionSave
from lightning_field.checkpoint.freshness import Freshness
from lightning_field.checkpoint.io import ManifestCheckpointIO
from lightning_field.checkpoint.load import FIELD_KEY
from lightning_field.checkpoint.no_progress import NoProgressGuard
from lightning_field.checkpoint.options import (
    InterruptConfig,
    ResumeConfig,
    SnapshotConfig,
    StorageConfig,
    grouped_options,
)
from lightning_field.checkpoint.preemption import PreemptionSave, TrainingPreempted
from lightning_field.checkpoint.resolver import Resolution
from lightning_field.checkpoint.resume_last import NoRecoverableCheckpointError
from lightning_field.checkpoint.resume_policy import ResumeGuard
from lightning_field.checkpoint.snapshots import StepSnapshots
from lightning_field.checkpoint.stop_points import StopPointSave
from lightning_field.checkpoint.stores import CheckpointWriter, LocalStore, ObjectStore
from lightning_field.checkpoint.stores.local import named_checkpoint
from lightning_field.checkpoint.verify import VerifyReport
from lightning_field.compat import lightning as internals
from lightning_field.core.distributed import all_gather_objects, broadcast_object, elastic_restart_hazard
from lightning_field.core.events import EventLog
from lightning_field.core.layout import run_directory
from lightning_field.core.manifest import SHARED_STATE_FILE
from lightning_field.core.storage import Location, unusable_local_dir
from lightning_field.planning.intervals import FailureModel
from lightning_field.state.rank_tracking import RankStateTracker

__all__ = ["ManifestCheckpoint", "NoRecoverableCheckpointError"]

log = logging.getLogger(__name__)


class ManifestCheckpoint(CommittedCheckpoint):
    """Drop-in replacement for :class:`~lightning.pytorch.callbacks.ModelCheckpoint`.

    Args (beyond ModelCheckpoint's own, which stay as Lightning's users write them):
        storage: where and how checkpoints are written (:class:`~lightning_field.StorageConfig`:
            fsspec options for a URL, multipart sizes, ``async_save``, ``on_save_error``, your own ``store``).
        snapshots: the step-snapshot tier (:class:`~lightning_field.SnapshotConfig`): every
            ``every_n_train_steps`` into node-local ``directory`` (default ``/dev/shm``, replicated to a
            partner node), which ``ckpt_path="last"`` takes where newer; ``"auto"`` (default): where they
            pay, at the interval that minimises the predicted waste (``checkpoint.snapshot_interval``).
        resume: what a resume accepts (:class:`~lightning_field.ResumeConfig`): provenance differences
            and Trainer settings allowed to change, an inexact resume, freshness, the failed-attempt limit
            (exit 77, ``checkpoint.no_progress``), unpickling trusted files.
        interrupts: how an interrupted attempt ends (:class:`~lightning_field.InterruptConfig`): the
            preemption signals (a save at the next step boundary, then :class:`TrainingPreempted`, exit
            status 75), how often ranks agree on them, saves where ``trainer.should_stop`` ends fit
            before its limits (:mod:`lightning_field.checkpoint.stop_points`) and at the end of training.
        failures: the :class:`~lightning_field.FailureModel` (MTBF, share of failures a snapshot survives)
            ``"auto"`` snapshots are weighed against; default ``FailureModel()``: a 6 h MTBF.
        generators: named ``torch.Generator`` objects the run draws from, captured per rank.
        config: the run's resolved configuration (e.g. a Hydra ``DictConfig`` as a dict); defaults to
            the module's and datamodule's hparams. Recorded (secrets redacted) and compared on resume.
        code_dir: where the user's code lives, for its git commit (default: the module's, script's or cwd's repository).
        **deprecated: 0.x's flat names (``snapshot_every_n_train_steps=``, ``allow_resume_mismatch=``,
            ...; ``checkpoint.options.FLAT_NAMES``), each folded into its group with a ``DeprecationWarning``.

    Raises:
        ValueError: an option its group refuses (``StorageConfig``, ``SnapshotConfig``, ...), or a flat
            name given beside its group; at setup (on every rank alike), ``dirpath`` is unusable on any
            rank (under a file, not writable), or snapshots cannot be replicated.
        TypeError: an unknown keyword argument; ``store`` does not implement
            :class:`~lightning_field.checkpoint.stores.CheckpointStore`.
        NotImplementedError: at setup, a strategy other than single-device, DDP or ModelParallel.
        ResumeMismatchError: on ``fit(ckpt_path=...)``, before anything is unpickled, the checkpoint is
            not recoverable, written by another run (code, config, data, model, world size) or other Trainer settings.
        NoRecoverableCheckpointError: on ``fit(ckpt_path="last")``, none of the checkpoints resumes exactly.

    Example::

        checkpoint = ManifestCheckpoint(dirpath="ckpts", every_n_train_steps=500, save_top_k=2)
        trainer = Trainer(max_steps=10_000, callbacks=[checkpoint])
        trainer.fit(model, datamodule=data, ckpt_path="last")  # the newest recoverable, or a refusal saying why
    """

    FILE_EXTENSION = ModelCheckpoint.FILE_EXTENSION

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
        storage: StorageConfig | None = None,
        snapshots: SnapshotConfig | None = None,
        resume: ResumeConfig | None = None,
        interrupts: InterruptConfig | None = None,
        failures: FailureModel | None = None,
        generators: Mapping[str, torch.Generator] | None = None,
        config: Mapping[str, Any] | None = None,
        code_dir: str | os.PathLike[str] | None = None,
        **deprecated: Any,
    ) -> None:
        groups = {"storage": storage, "snapshots": snapshots, "resume": resume, "interrupts": interrupts}
        storage, snapshots, resume, interrupts = grouped_options(
            groups, deprecated, accepts=ManifestCheckpoint.__init__
        )
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
            storage=storage,
        )
        self._preemption = PreemptionSave(self, interrupts.signals, interrupts.check_every_n_steps)
        self.rank_tracker = self.make_rank_tracker(generators)
        self._guard = ResumeGuard(resume.allow_mismatch, resume.allow_changed, self._current_events, resume.inexact)
        self._resolution: Resolution | None = None  # what ckpt_path="last" resolved to, for its load
        self._no_progress = NoProgressGuard(self, resume.max_failed_attempts, self._guard.code)
        self.config, self.code_dir, self.freshness = config, code_dir, Freshness(resume.require_fresh)
        self._stops = StopPointSave(self, interrupts.save_on_stop, interrupts.save_on_train_end)
        self._exception_save = ExceptionSave(self, self.rank_tracker)
        self.snapshots = StepSnapshots(  # the step-snapshot tier
            self,
            snapshots.every_n_train_steps,
            snapshots.directory,
            snapshots.in_line,
            snapshots.overhead_budget,
            failures,
            self.persistent_interval_seconds,
        )
        self.trust_pickles = resume.trust_pickles
        self._deferred_batch_end: tuple[Any, Any, int] | None = None
        self._deferred_validation_end = False
        self._show_hint_again: Any = None
        self._between_steps: str | None = None  # why the save under way is not recoverable (_save_between_steps)

    def make_rank_tracker(self, generators: Mapping[str, torch.Generator] | None) -> RankStateTracker:
        """Each rank's RNG, data-position and epoch-metric tracker; a subclass may substitute its own."""
        return RankStateTracker(generators)

    # ------------------------------------------------------------------ public state
    @property
    def generators(self) -> dict[str, torch.Generator]:
        """The named generators captured and restored per rank, with the global RNG streams."""
        return self.rank_tracker.generators

    @property
    def allow_resume_mismatch(self) -> tuple[str, ...]:
        """Provenance differences accepted on resume, by dotted name or prefix."""
        return self._guard.allowed

    @allow_resume_mismatch.setter
    def allow_resume_mismatch(self, allowed: Iterable[str]) -> None:
        self._guard.allowed = tuple(allowed)

    @property
    def resume_inexact(self) -> bool:
        """Whether an unrecoverable checkpoint may be resumed (``"last"`` finding no recoverable one, or an
        explicit ``ckpt_path``), the lineage then marked inexact in every later manifest."""
        return self._guard.resume_inexact

    @resume_inexact.setter
    def resume_inexact(self, allowed: bool) -> None:
        self._guard.resume_inexact = bool(allowed)

    @property
    def save_on_stop(self) -> bool:
        """Whether a stop before the limits (``trainer.should_stop``) is saved where fit ends."""
        return self._stops.save_on_stop

    @save_on_stop.setter
    def save_on_stop(self, save: bool) -> None:
        self._stops.save_on_stop = bool(save)

    @property
    def save_on_train_end(self) -> bool:
        """Whether reaching ``max_steps`` or ``max_epochs`` is saved where fit ends."""
        return self._stops.save_on_train_end

    @save_on_train_end.setter
    def save_on_train_end(self, save: bool) -> None:
        self._stops.save_on_train_end = bool(save)

    @property
    def preemption_check_every_n_steps(self) -> int | None:
        return self._preemption.check_every_n_steps

    @property
    def preempted_checkpoint(self) -> str | None:
        """The checkpoint a preemption saved (or named) before ending the attempt, else None."""
        return self._preemption.saved

    # ------------------------------------------------------------------ setup
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage == "fit":
            # Every rank checks and every rank learns of any rank's problem (collective), so a bad
            # dirpath stops the job before its first step instead of at its first save.
            problems = [p for p in all_gather_objects(unusable_local_dir(self.dirpath)) if p]  # every rank
            if problems:
                raise ValueError(f"ManifestCheckpoint(dirpath={self.dirpath!r}) is unusable: {problems[0]}")
        if self._show_hint_again is not None:
            self._show_hint_again()
            self._show_hint_again = None
        hazard = elastic_restart_hazard(os.environ)
        if hazard is not None:
            rank_zero_warn(f"lightning_field: {hazard}")
        is_sharded = check_strategy(trainer.strategy)  # refuses a strategy it cannot save for
        store = self.store_at(self.dirpath)
        self.names_files_twice = not is_sharded and isinstance(store, LocalStore)
        if not is_sharded and isinstance(store, ObjectStore):
            # An object store has no links: the advertised path is the committed prefix's own state.pt,
            # Lightning's checkpoint file, which fsspec opens and our readers map to the prefix.
            self.FILE_EXTENSION = "/" + SHARED_STATE_FILE
        elif not self.names_files_twice:
            # A sharded (DCP) checkpoint has no single file, nor has one in a store of the user's own:
            # there the checkpoint is its folder, named without an extension.
            self.FILE_EXTENSION = ""

        def take_own_state(checkpoint: dict[str, Any]) -> None:
            self.adopt_model_checkpoint_state(checkpoint, internals.trainer_callbacks(trainer))

        if is_sharded:
            sharded_load.guard_strategy_load(
                trainer.strategy, self.store_at, self._guard.check, self.trust_pickles, take_own_state
            )
        else:
            # A sharded strategy's own save writes DCP files itself; there the callback dumps the state directly.
            internals.intercept_strategy_save(trainer.strategy, self.take_checkpoint)
            self.routes_saves = True
        if self.async_save:
            self._saves.setup(trainer, self.state_key)
        if not isinstance(trainer.strategy.checkpoint_io, ManifestCheckpointIO):
            trainer.strategy.checkpoint_io = ManifestCheckpointIO(
                trainer.strategy.checkpoint_io,
                self._guard.check,
                self.store_at,
                self.trust_pickles,
                self._resolved_verification,
                on_loaded=take_own_state,
            )
        self._guard.record(trainer, pl_module, self.config, self.code_dir)
        if trainer.state.fn is None:
            # Called by hand, outside fit/validate/test/predict (each sets the Trainer's state before its
            # setup hooks): nothing runs, so nothing is written, as ModelCheckpoint.setup writes nothing.
            return
        if trainer.is_global_zero:
            for leftover in self.checkpointer.clean_leftovers():  # ModelCheckpoint.setup resolved dirpath
                log.info("Removed leftover from an interrupted save: %s", leftover)
            run_dir = run_directory(trainer.default_root_dir, bool(trainer.loggers), self.dirpath)
            self._events = EventLog(run_dir, world_size=trainer.world_size, trains=stage == "fit")
        # Every rank's manifests name rank 0's run (snapshots are committed on every node); a resume
        # replaces it with the run that wrote the checkpoint (ResumeGuard._check_lineage).
        self._guard.run_id = broadcast_object(self._events.run_id if self._events is not None else None)
        if stage == "fit":
            self.rank_tracker.install(trainer)
            self.snapshots.setup(trainer)

    @override
    def _is_agreement_step(self, trainer: pl.Trainer) -> bool:
        return self._preemption.is_agreement_step(trainer)

    # ------------------------------------------------------------------ training hooks
    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._preemption.start(trainer)
        self._stops.reset()
        self._exception_save.start(trainer)
        self._guard.check_ranks_resumed_alike(trainer.ckpt_path)
        self._guard.check_data(trainer, list(internals.iter_loaders(trainer.train_dataloader)))
        self.rank_tracker.restore_on_train_start(trainer, pl_module)
        self._no_progress.fit_start(trainer)  # "fit_start"; refuses where attempts before failed here, no progress

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._guard.loaders_reloaded(trainer)

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *_: Any) -> None:
        self.rank_tracker.batch_started()

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.rank_tracker.batch_ended(trainer, batch)
        if self.async_save:
            self._saves.check(trainer)
        if internals.is_last_batch_of_epoch(trainer):
            # Lightning 2.6 restores a save at the last batch's end as an unfinished epoch, then counts it
            # twice (shifting epoch-seeded samplers); the same step saved at the epoch's end restores cleanly.
            self._deferred_batch_end = (outputs, batch, batch_idx)
            self._exception_save.spoil("the epoch's end was under way")
            return
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self.snapshots.after_step(trainer)
        self._preemption.after_step(trainer)
        self._stops.after_batch(trainer)
        self._exception_save.step_ended(trainer)

    @override
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        self._exception_save.spoil("an optimizer step had begun, so the weights were neither step's")

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._exception_save.spoil("a validation had begun after it")

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._exception_save.spoil("the epoch's end was under way")
        self.rank_tracker.epoch_ended()
        deferred, self._deferred_batch_end = self._deferred_batch_end, None
        if deferred is not None:
            super().on_train_batch_end(trainer, pl_module, *deferred)
            self.snapshots.after_step(trainer)
            self._preemption.after_step(trainer)
        if self._deferred_validation_end:
            self._deferred_validation_end = False
            super().on_validation_end(trainer, pl_module)
        super().on_train_epoch_end(trainer, pl_module)
        self._stops.at_epoch_end(trainer)
        # After this epoch's saves (which must hold the schedulers as they were before their step).
        internals.let_resumed_epoch_step_schedulers(trainer)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # No save here: the end's own save was taken where fit ended (stop_points.py).
        self._saves.settle(trainer)  # the snapshots' last commit is waited for at teardown
        super().on_train_end(trainer, pl_module)

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        fitting = trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking
        if fitting and internals.is_last_batch_of_epoch(trainer):
            # A save here sits inside the epoch's last batch, and resumes like one saved at that
            # batch's end (see on_train_batch_end): it is taken at the epoch's end instead.
            self._deferred_validation_end = True
            return
        super().on_validation_end(trainer, pl_module)
        if fitting:
            self._stops.after_validation(trainer)

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        saved = None
        if not isinstance(exception, (TrainingPreempted, CheckpointSaveError)):  # saved, or a save that failed
            saved = self._exception_save.at_exception(trainer, exception)
            if saved is None and trainer.world_size == 1 and internals.should_save_on_exception(self, trainer):
                self._save_between_steps(trainer, pl_module, exception)
        self._saves.interrupt(trainer)
        self.snapshots.interrupt(trainer)
        self._end_attempt(trainer, self._no_progress.ended(trainer, exception))  # "attempt_failed" recorded

    def _save_between_steps(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        """``save_on_exception=True`` where the state is no step's end: ModelCheckpoint's own save, of the live
        state an exception left between two steps (a batch fetched, random numbers drawn, an optimizer step
        begun). It is kept, its weights loadable, but its manifest says it is not recoverable: resuming it
        would not continue exactly, so ``ckpt_path="last"`` passes it by."""
        self._between_steps = (
            f"the state at an exception ({type(exception).__name__}) between two steps, saved as save_on_exception"
            " asks: it is no step's end, so a resume from it could not continue exactly"
        )
        try:
            super().on_exception(trainer, pl_module, exception)
        except Exception as err:  # the save failing must not hide the user's exception
            log.warning("lightning_field: save_on_exception's checkpoint could not be saved: %s", err)
        finally:
            self._between_steps = None

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        internals.release_strategy_save(trainer.strategy, self.take_checkpoint)
        self.routes_saves = False
        self._saves.close(trainer)
        self.snapshots.close(trainer, finished=stage == "fit")  # Lightning tears callbacks down after a clean fit only
        self._end_attempt(trainer, "finished")  # a preemption ends in on_exception
        super().teardown(trainer, pl_module, stage)

    def _end_attempt(self, trainer: pl.Trainer, status: str) -> None:
        self._preemption.stop()
        self.rank_tracker.uninstall()
        if self._events is not None:
            self._events.end(status, step=trainer.global_step)
            self._events = None

    # ------------------------------------------------------------------ saving
    def capture_save(
        self,
        trainer: pl.Trainer,
        final: Location,
        start: float,
        store: CheckpointWriter | None = None,
        checkpoint: dict[str, Any] | None = None,
    ) -> SaveJob:
        """Everything a commit needs, captured on the training thread: after this, the commit reads
        nothing from the trainer, so it can run while training moves on. ``checkpoint``: the dict
        ``Trainer.save_checkpoint`` built for this save, else it is built here (a step snapshot)."""
        if checkpoint is None:
            checkpoint = internals.dump_checkpoint(trainer, self.save_weights_only)
        # Put back to the step it holds where the save is made after it (exception_save.py).
        rewound = self._exception_save.rewind_checkpoint(checkpoint)
        rank_state, rank_missing = self.rank_tracker.capture(trainer, checkpoint, self.save_weights_only, rewound)
        if self._between_steps is not None:
            rank_missing = [*rank_missing, self._between_steps]
        return capture_job(
            trainer,
            final,
            start,
            store=store or self._store,
            checkpoint=checkpoint,
            rank_state=rank_state,
            rank_missing=rank_missing,
            weights_only=self.save_weights_only,
            provenance=self._guard.manifest_provenance(trainer.world_size),
            snapshot_interval=self.snapshots.interval_record(),
        )

    @override
    def _find_last_checkpoints(self, trainer: pl.Trainer) -> set[str]:
        where = internals.checkpoint_dir(self, trainer)
        resolution = self.snapshots.resolve_last(trainer, where, self.resume_inexact, self.store_at(where))
        self._resolution = resolution  # its verification is handed to the load: no second hash
        self._guard.resolved(resolution)  # an unrecoverable pick on purpose is recorded; any other clears it
        found = resolution.path
        self.freshness.check_resume(self.store_at, where, found)  # every rank alike: the same record and pick
        if found is None:
            plain = self._model_checkpoint_lasts(where)
            if plain:
                return plain
            self._show_hint_again = internals.hide_no_last_checkpoint_hint()
            return set()
        return {found}

    def _resolved_verification(self, checkpoint: Location) -> VerifyReport | None:
        """The verification ``ckpt_path="last"``'s resolution made of ``checkpoint``, which its load hands on."""
        return self._resolution.verification_of(checkpoint) if self._resolution is not None else None

    def _model_checkpoint_lasts(self, where: Any) -> set[str]:
        """With no checkpoint of ours under ``where``, ModelCheckpoint's ``last*.ckpt`` files there, which plain
        Lightning resumes (the newest: a user who switched callbacks mid-run): said, and the lineage marked
        inexact, never silently started over from step 0. They hold no rank's RNG or data position."""
        if not isinstance(where, Path) or not where.is_dir():
            return set()
        extension = self.FILE_EXTENSION or ModelCheckpoint.FILE_EXTENSION
        named_last = re.compile(rf"^{re.escape(self.CHECKPOINT_NAME_LAST)}(-(\d+))?")  # ModelCheckpoint's pattern
        lasts = [
            p
            for p in where.iterdir()
            if p.is_file() and p.suffix == extension and named_last.match(p.stem) and named_checkpoint(p) is None
        ]
        if not lasts:
            return set()
        newest = str(max(lasts, key=lambda p: p.stat().st_mtime))  # the one Lightning takes
        missing = "rng and data position (a ModelCheckpoint file: it holds no rank's state)"
        self._guard.choose_inexact(newest, [missing])
        rank_zero_warn(
            f"lightning_field: no ManifestCheckpoint checkpoint under {where}; resuming from ModelCheckpoint's"
            f" {newest}, as plain Lightning would. It holds no RNG or data position, so this continuation is not"
            " exact: every later manifest records provenance.inexact_resume."
        )
        return {str(p) for p in lasts}

    @override
    def _advertise(self, trainer: pl.Trainer, job: SaveJob, blocking: float, commit_s: float | None = None) -> None:
        super()._advertise(trainer, job, blocking, commit_s)
        self.freshness.committed(trainer.is_global_zero, self.store_at, self.dirpath, job.step, job.final)

    @override
    def wait_for_snapshot_copy(self) -> None:
        super().wait_for_snapshot_copy()
        self.snapshots.wait_for_copy()  # and a step snapshot's, pending on its own writer

    # ------------------------------------------------------------------ resuming
    @override
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self.share_state_with_model_checkpoint(checkpoint)

    @override
    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self.adopt_model_checkpoint_state(checkpoint, internals.trainer_callbacks(trainer))
        field = checkpoint.get(FIELD_KEY)
        if not field:
            return
        rank_state = field.get("rank_state")
        if rank_state is not None:
            self.rank_tracker.load(rank_state, checkpoint, str(field["path"]))
        if self._events is not None:
            tier = self.snapshots.tier_of(field["path"])
            payload = {"path": field["path"], "seconds": field["load_seconds"], "tier": tier}
            self._events.emit("ckpt_load", step=field["manifest"].step, payload=payload)
