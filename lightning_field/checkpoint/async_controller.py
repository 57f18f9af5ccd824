"""The lifecycle of ``StorageConfig(async_save=True)``: one save in flight, and what waits for it.

``async_save.py`` has the mechanisms (the writer thread, the host snapshot, the deferred copy);
this module decides when training meets them:

* **Submit.** A save snapshots what training may change next into reusable host buffers and hands
  the commit to the writer thread. On CPU the parameters and optimizer state are copied by the
  writer while the next batch's forward and backward run.
* **The copy gate.** Training waits for that copy in an optimizer step pre-hook, *after* Lightning's
  closure (so the overlap survives automatic optimization), and at every hook outside the training
  batch through a callback placed first in ``trainer.callbacks`` (``WeightAveraging`` and
  ``StochasticWeightAveraging`` write weights through ``.data`` there, which no counter sees).
* **Advertise only what committed.** The checkpoint is advertised (event log, loggers,
  ``last_committed``) and retention prunes for it only once its commit finished; a failed save is
  reported at once and then handled by ``on_save_error``.
* **Settle.** Every rank waits for the in-flight save at the same points (the next save, the end of
  training, a preemption), so the removals it broadcasts and the error policy stay collective.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from lightning_field.checkpoint.async_save import (
    BackgroundSave,
    HostSnapshot,
    PendingCopies,
    SaveOutcome,
    Stager,
    optimizer_written_storages,
)
from lightning_field.checkpoint.commit import CheckpointSaveError, SaveJob, commit_save
from lightning_field.checkpoint.options import SaveErrorPolicy, save_error_policy
from lightning_field.compat import lightning as internals
from lightning_field.core.distributed import new_host_group
from lightning_field.core.events import EventLog
from lightning_field.core.storage import Location

__all__ = ["AsyncSaves"]


@dataclass
class _PendingSave:
    """A background save not yet settled, with the removals that wait for its commit."""

    job: SaveJob
    copies: PendingCopies | None = None
    outcome: SaveOutcome | None = None
    removals: list[str] = field(default_factory=list)


class AsyncSaves:
    """At most one background save of one checkpoint callback, from snapshot to settled.

    Args:
        on_save_error: ``"stop"`` raises :class:`CheckpointSaveError` on every rank once a
            background save failed; ``"warn"`` keeps training.
        advertise: called with ``(trainer, job, blocking_s, commit_s)`` once a save committed.
        remove: removes a checkpoint for retention, ``(trainer, filepath)``; collective.
        not_saved_message: ``(final, error)`` to the message a failure is reported with.
        events: the run's event log, when this rank writes one.
        agreement_step: whether ranks agree on a failure at this step (one small all-reduce).
        stager: the host copy of each save's state (default: a :class:`HostSnapshot`, made at the
            first save).
        commit: runs one save's commit protocol on the writer thread, ``(job, group)`` to the error
            or None, collective (default :func:`~lightning_field.checkpoint.commit.commit_save`;
            replicated step snapshots commit on every node).

    Raises:
        ValueError: ``on_save_error`` is not ``"stop"`` or ``"warn"``.
    """

    def __init__(
        self,
        on_save_error: SaveErrorPolicy,
        advertise: Callable[[pl.Trainer, SaveJob, float, float | None], None],
        remove: Callable[[pl.Trainer, str], None],
        not_saved_message: Callable[[Location, str], str],
        events: Callable[[], EventLog | None],
        agreement_step: Callable[[pl.Trainer], bool],
        stager: Stager | None = None,
        commit: Callable[[SaveJob, Any], str | None] = commit_save,
    ) -> None:
        self.on_save_error = on_save_error
        self._commit = commit
        self.save_failures = 0
        self.last_save_error: str | None = None
        self._advertise = advertise
        self._remove = remove
        self._not_saved_message = not_saved_message
        self._events = events
        self._agreement_step = agreement_step
        self._background = BackgroundSave()
        self._snapshot: Stager | None = stager
        self._pending: _PendingSave | None = None
        self._host_group: Any = None
        self._gate: _SnapshotCopyGate | None = None
        self._step_hooks: dict[int, Any] = {}
        self.copies_everything_first = False
        """Set once a deferred copy saw its state written in place: every later save copies first."""

    @property
    def on_save_error(self) -> SaveErrorPolicy:
        return self._on_save_error

    @on_save_error.setter
    def on_save_error(self, policy: SaveErrorPolicy) -> None:
        self._on_save_error = save_error_policy(policy)

    @property
    def snapshot(self) -> Stager | None:
        """The stager and its reusable host buffers (None before the first async save, unless one was given)."""
        return self._snapshot

    @property
    def in_flight(self) -> bool:
        return self._pending is not None

    @property
    def copy_waited_seconds(self) -> float:
        """How long training has waited so far for the in-flight save's deferred copy (0 if none)."""
        pending = self._pending
        return pending.copies.waited_seconds if pending is not None and pending.copies is not None else 0.0

    def setup(self, trainer: pl.Trainer, owner_key: str) -> None:
        """A host-side process group for the writer's collectives, and the copy gate (every rank)."""
        if trainer.world_size > 1 and self._host_group is None:
            self._host_group = new_host_group()  # every rank runs setup: the group creation is collective
        callbacks = internals.trainer_callbacks(trainer)
        if self._gate not in callbacks:
            # First in the list: its hooks run before every other callback's, which is where
            # callbacks like WeightAveraging write the weights a pending copy still reads.
            self._gate = _SnapshotCopyGate(self, owner_key)
            # A new list, not an insert: Lightning is iterating the current one to call `setup`, and
            # an insert in front would call the owner's `setup` (its loader patches) a second time.
            internals.set_trainer_callbacks(trainer, [self._gate, *callbacks])

    def submit(self, trainer: pl.Trainer, job: SaveJob, start: float) -> None:
        """Snapshot ``job``'s state and commit it on the writer thread (after :meth:`settle`)."""
        snapshot = self._snapshot or HostSnapshot()
        self._snapshot = snapshot
        # Sharded saves copy everything now: DCP's write is collective, so a rank whose deferred
        # copy failed could not skip it alone.
        deferrable = None
        if job.shards is None and not self.copies_everything_first:
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
            self._background.submit(str(job.final), job.step, copy_then_commit)
        except BaseException:
            copies.run()  # no writer thread will: nobody may wait on these copies forever
            raise
        self._pending = _PendingSave(job, copies)

    def defer_removal(self, filepath: str) -> bool:
        """Retention counts only committed checkpoints: while a save is in flight, a checkpoint it
        displaces is removed once it commits (and not at all if it fails). True when deferred."""
        if self._pending is None:
            return False
        self._pending.removals.append(filepath)
        return True

    # ------------------------------------------------------------------ the deferred copy
    def wait_for_snapshot_copy(self) -> None:
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

    # ------------------------------------------------------------------ outcomes
    def collect(self, trainer: pl.Trainer, block: bool) -> None:
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
            self.copies_everything_first = True
        self._report_failure(trainer, pending.job, outcome.error, "Background checkpoint save")

    def commit_in_line(self, trainer: pl.Trainer, job: SaveJob, start: float, what: str = "Checkpoint save") -> None:
        """Commit ``job`` on the training thread now, over the same host group, and advertise it or
        report its failure as a background save's (no ``on_save_error`` stop: for step snapshots,
        which training outlives). Collective: every rank, the same save."""
        commit_start = time.perf_counter()
        error = self._commit(job, self._host_group)
        if error is None:
            now = time.perf_counter()
            self._advertise(trainer, job, now - start, now - commit_start)
        else:
            self._report_failure(trainer, job, error, what)

    def _report_failure(self, trainer: pl.Trainer, job: SaveJob, error: str, what: str) -> None:
        """Log, count (``checkpoint/save_failures``) and record (event log) a save that did not commit."""
        self.save_failures += 1
        message = self._not_saved_message(job.final, error)
        self.last_save_error = message
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics({"checkpoint/save_failures": float(self.save_failures)}, step=trainer.global_step)
        events = self._events()
        if events is not None:
            events.emit("ckpt_save_failed", step=job.step, payload={"path": str(job.final), "error": message})
        rank_zero_warn(f"{what} failed: {message}")

    def settle(self, trainer: pl.Trainer) -> None:
        """Wait for the in-flight save, then prune for it (a commit) or apply ``on_save_error``.
        Every rank calls this at the same point (a save, the end of training): removals broadcast."""
        pending = self._pending
        if pending is None:
            return
        self.collect(trainer, block=True)
        self._pending = None
        assert pending.outcome is not None
        if pending.outcome.error is None:
            for filepath in pending.removals:
                self._remove(trainer, filepath)
            return
        if pending.removals:
            rank_zero_info(f"Keeping {', '.join(pending.removals)}: the save that would replace them failed")
        if self.on_save_error == "stop":
            raise CheckpointSaveError(self.last_save_error or pending.outcome.error)

    def check(self, trainer: pl.Trainer) -> None:
        """At each batch end: surface a finished background save without blocking; under
        ``on_save_error="stop"`` every rank stops together at the step where any rank saw a failure."""
        self.collect(trainer, block=False)
        failed = bool(self._pending is not None and self._pending.outcome is not None and self._pending.outcome.error)
        if self.on_save_error != "stop":
            return
        if trainer.world_size > 1:
            if not self._agreement_step(trainer):
                return
            failed = trainer.strategy.reduce_boolean_decision(failed, all=False)
        if failed:
            self.settle(trainer)  # raises: the save failed on every rank
            raise CheckpointSaveError(
                f"a background checkpoint save failed on a peer rank at step {trainer.global_step}"
            )

    def close(self, trainer: pl.Trainer) -> None:
        """End of fit: the pending save commits (or fails) before the process moves on."""
        if self._pending is not None:
            self.collect(trainer, block=True)
            self._pending = None
        self._remove_step_hooks()
        if self._snapshot is not None:
            self._snapshot.release()  # a state-sized host copy is not held past fit

    def interrupt(self, trainer: pl.Trainer) -> None:
        """An exception ends fit. Alone, the pending save's snapshot is consistent: let it commit.
        With peers, they may be gone and its receipt exchange would wait on them; it stays
        uncommitted, which is safe."""
        self._remove_step_hooks()
        if self._pending is not None and trainer.world_size == 1:
            self.collect(trainer, block=True)
            self._pending = None


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

    def __init__(self, saves: AsyncSaves, owner_key: str) -> None:
        self._saves = saves
        self._owner_key = owner_key

    @property
    def state_key(self) -> str:
        return f"_SnapshotCopyGate[{self._owner_key}]"

    def _wait(self, *args: Any, **kwargs: Any) -> None:
        self._saves.wait_for_snapshot_copy()

    on_train_epoch_start = on_train_epoch_end = on_validation_start = on_test_start = _wait
    on_predict_start = on_sanity_check_start = on_train_end = on_fit_end = on_exception = teardown = _wait
