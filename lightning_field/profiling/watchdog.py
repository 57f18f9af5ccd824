"""``HangWatchdog``: a rank that stops making progress is named, its stacks shown, and the job ended
with exit status :data:`HANG_EXIT_CODE` (76) so that the launcher restarts it.

``StragglerMonitor``'s reports need an ``all_gather`` at a step boundary, so a rank stuck *inside* a
step is never reported: the others wait in their next collective until the process group's timeout
(30 minutes by default on gloo), and a SIGTERM cannot reach a training thread blocked in C. Here each
rank's training thread stores its progress in memory at every hook (no I/O, no synchronisation), and
threads of its own (``profiling/hang_monitor.py``) compare that with a timeout learned from the rank's
own batch times (``profiling/hang_rule.py``), and publish it as a heartbeat file beside the run's
other records, where every rank's watchdog can read every other's without a collective.

Where the heartbeats live: files under ``<run>/field/heartbeat/`` (one per rank, rewritten in place)
rather than the c10d TCPStore torch.distributed already has. The store would also cross hosts that
share no filesystem, but reaching the default group's store is a private API, its server lives in one
rank's process (or torchrun's agent), a ``get`` blocks until its key exists, and nothing of it is left
to read after the job is gone; the files are plain public I/O off the training thread, outlive the job
for a post-mortem, and sit where the run's event log and checkpoints already are. A run directory that
is not shared between hosts is detected (a rank whose heartbeat is never seen is named as missing,
with its host) rather than silently ignored.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import sys
import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_field.checkpoint.manifest_checkpoint import ManifestCheckpoint
from lightning_field.checkpoint.observe import field_run_dir, find_manifest_checkpoint
from lightning_field.compat import lightning as internals
from lightning_field.core.distributed import all_gather_objects
from lightning_field.core.events import EventLog
from lightning_field.profiling.hang_monitor import HangMonitor, Job, Progress
from lightning_field.profiling.hang_rule import LONG_PHASES, HangRule, Phase, StepHistory
from lightning_field.profiling.throughput import host_name

__all__ = ["HANG_EXIT_CODE", "HangWatchdog"]

#: sysexits.h's EX_PROTOCOL, "remote error in protocol": a peer stopped answering. Distinct from
#: :data:`~lightning_field.checkpoint.preemption.PREEMPTED_EXIT_CODE` (75): no checkpoint was saved for
#: this stop, so a restart resumes from the newest committed one and redoes the steps after it.
HANG_EXIT_CODE = 76


class HangWatchdog(Callback):
    """Name a rank that stopped making progress, with its host, step and Python stacks, and end the job.

    A rank is hung when it passes no progress mark (a batch's start, backward, the optimizer step, the
    batch's end, each validation batch, a save, an epoch's edges) for longer than
    ``max(floor_s, factor x its longest of the last 100 batches)``; phases that are legitimately long (the
    attempt's start and first batch, a checkpoint save, an epoch's end and start, validation's start and
    end, its first batch, the end of training) get ``max(floor_s, long_phase_s, factor x the longest such
    phase seen)`` instead. Every rank's watchdog then dumps its own process's stacks; rank 0 names the
    rank(s) the job waits for in the log and in a ``hang`` event, with their stacks; after ``grace_s`` every
    rank ends with exit status :data:`HANG_EXIT_CODE` (rank 0 first, ending the ranks Lightning's launcher
    started), unless it made progress again, in which case the watchdog stands down. No checkpoint is
    saved at a hang (docs/profiling.md says why); a background commit already in flight gets the grace.

    Args:
        floor_s: no timeout is shorter than this: above the longest pause a healthy batch can have (a
            recompilation, a slow fetch, a garbage collection).
        factor: how many times its longest recent batch a rank may go without progress.
        long_phase_s: the allowance of long phases and of work not timed yet (a first batch).
        grace_s: from naming the hang to ending the job.

    Raises:
        ValueError: a value is not a positive number, or ``factor`` is below 1.

    Example::

        from lightning_field import HangWatchdog, StragglerMonitor

        trainer = Trainer(strategy="ddp", devices=8, callbacks=[HangWatchdog(floor_s=120)])
        # or: StragglerMonitor(hang_floor_s=120)
        # a hung rank: "HANG: ... The job waits for: rank 5 on node-2 (step 1200, in the training step ..."
    """

    def __init__(
        self, floor_s: float, factor: float = 10.0, long_phase_s: float = 900.0, grace_s: float = 30.0
    ) -> None:
        self.rule = HangRule(floor_s, factor, long_phase_s)
        if isinstance(grace_s, bool) or not isinstance(grace_s, (int, float)) or not grace_s > 0 or grace_s == math.inf:
            raise ValueError(f"hang watchdog: grace_s must be a positive number of seconds, got {grace_s!r}")
        self.grace_s = float(grace_s)
        self.history = StepHistory(self.rule.window)
        self.monitor: HangMonitor | None = None
        self._progress: Progress = (0, -1, Phase.STARTING, time.monotonic())
        self._entered = time.monotonic()
        self._batch_began: float | None = None
        self._first_batch_timed = False
        self._val_began = 0.0
        self._checkpoint: ManifestCheckpoint | None = None
        self._launcher: Any = None

    @classmethod
    def optional(cls, floor_s: float | None, factor: float, long_phase_s: float, grace_s: float) -> HangWatchdog | None:
        """A watchdog with these settings, or None when ``floor_s`` is None (off)."""
        return None if floor_s is None else cls(floor_s, factor, long_phase_s, grace_s)

    def attach(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str, after: Callback) -> None:
        """Join ``trainer``'s callbacks right after ``after`` (the StragglerMonitor that owns this
        watchdog) and set up, from ``after``'s ``setup``; a no-op once it is one of them."""
        callbacks = internals.trainer_callbacks(trainer)
        if self in callbacks:
            return  # Lightning calls this watchdog's own hooks from now on
        at = callbacks.index(after) + 1 if after in callbacks else len(callbacks)
        # A new list: Lightning is iterating the current one to call `setup`, so this one's is called here.
        internals.set_trainer_callbacks(trainer, [*callbacks[:at], self, *callbacks[at:]])
        self.setup(trainer, pl_module, stage)

    # ------------------------------------------------------------------ setup and end
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._stop()
        # Collective (every rank sets up): the job's token tells its heartbeats from an earlier attempt's.
        gathered = all_gather_objects((os.urandom(8).hex(), host_name()))
        job = Job(field_run_dir(trainer), trainer.global_rank, len(gathered), [h for _, h in gathered], gathered[0][0])
        self.history = StepHistory(self.rule.window)
        self._entered, self._batch_began, self._first_batch_timed = time.monotonic(), None, False
        self._progress = (0, trainer.global_step, Phase.STARTING, self._entered)
        self._checkpoint = find_manifest_checkpoint(trainer)
        self._launcher = getattr(trainer.strategy, "launcher", None) if trainer.global_rank == 0 else None
        self.monitor = HangMonitor(
            self.rule,
            self.history,
            lambda: self._progress,
            job,
            grace_s=self.grace_s,
            end=self._end_process,
            events=self._events,
            resume_point=self._resume_point,
            exit_status=HANG_EXIT_CODE,
        )
        self.monitor.start()

    def _stop(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._stop()  # this rank raised: Lightning and the launcher take it from here

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._stop()

    def _events(self) -> EventLog | None:
        return self._checkpoint.events if self._checkpoint is not None else None

    def _resume_point(self) -> str:
        checkpoint = self._checkpoint
        persistent = checkpoint.last_committed if checkpoint is not None else None
        snapshot = checkpoint.snapshots.last_committed if checkpoint is not None else None
        # What ckpt_path="last" takes: the newest step, a persistent checkpoint where the two tie.
        if snapshot is not None and (persistent is None or snapshot[1] > persistent[1]):
            return (
                f"the snapshot {snapshot[0]} (step {snapshot[1]}), the newest resume point this attempt"
                " committed (node-local: a restart on other machines takes the newest persistent checkpoint):"
                " run the same command with ckpt_path='last'"
            )
        if persistent is not None:
            return (
                f"{persistent[0]} (step {persistent[1]}), the newest checkpoint this attempt committed: run the"
                " same command with ckpt_path='last'"
            )
        return (
            "no checkpoint committed in this attempt; with ckpt_path='last' a restart resumes from the newest"
            " one committed before it, if any"
        )

    def _end_process(self, status: int) -> None:
        """Flush what can be flushed, end the ranks Lightning's launcher started (rank 0), then exit.

        ``os._exit`` from this thread: the training thread may be blocked in a gloo collective, which
        no exception or signal handler can interrupt. The event log is fsynced at each event already.
        """
        for handler in [*logging.getLogger().handlers, *logging.getLogger("lightning_field").handlers]:
            with contextlib.suppress(Exception):
                handler.flush()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        kill = getattr(self._launcher, "kill", None)
        if callable(kill):
            with contextlib.suppress(Exception):
                kill(signal.SIGKILL)  # they have dumped their stacks; SIGTERM cannot end a rank inside gloo
        os._exit(status)

    # ------------------------------------------------------------------ the marks (memory only)
    def _mark(self, phase: Phase, step: int, counted: bool = True) -> None:
        now = time.monotonic()
        marks, _, previous, _ = self._progress
        if phase is not previous:
            if previous in LONG_PHASES:
                self.history.add_long_phase(previous, now - self._entered)
            self._entered = now
            if phase in LONG_PHASES:
                self._batch_began = None  # the next batch is timed from its own start
        self._progress = (marks + counted, step, phase, now)

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mark(Phase.EPOCH_EDGE, trainer.global_step)

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._mark(Phase.FORWARD, trainer.global_step)
        if self._batch_began is None:
            self._batch_began = self._progress[3]

    @override
    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Any) -> None:
        self._mark(Phase.BACKWARD, trainer.global_step)

    @override
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        self._mark(Phase.OPTIMIZER, trainer.global_step)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._mark(Phase.BETWEEN_STEPS, trainer.global_step)
        now = self._progress[3]
        if self._batch_began is not None:
            if self._first_batch_timed:
                self.history.add_batch(now - self._batch_began)
            # The attempt's first batch (compilation, autotuning, caches warming) had the long-phase
            # allowance; in the window it would raise the in-step timeout to `factor` x it for 100 batches.
            self._first_batch_timed = True
        self._batch_began = now

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mark(Phase.EPOCH_EDGE, trainer.global_step)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mark(Phase.VALIDATION_EDGE, trainer.global_step)

    @override
    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._mark(Phase.VALIDATING, trainer.global_step)
        self._val_began = self._progress[3]

    @override
    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._mark(Phase.VALIDATING, trainer.global_step)
        self.history.add_val_batch(self._progress[3] - self._val_began)

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mark(Phase.VALIDATION_EDGE, trainer.global_step)

    @override
    def state_dict(self) -> dict[str, Any]:
        # Lightning asks every callback for its state as a save begins (dump_checkpoint): the save's start.
        self._mark(Phase.SAVING, self._progress[1], counted=False)
        return {}

    @override
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self._mark(Phase.SAVING, trainer.global_step, counted=False)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mark(Phase.FINISHING, trainer.global_step)
