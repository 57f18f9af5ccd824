"""Preemption signals become a checkpoint at the next step boundary on every rank.

A signal handler only records that a signal arrived; the save itself happens on the training
thread, after all ranks agree through one all-reduce, so no collective ever runs inside a handler
and no rank saves alone.

After that save the attempt ends with :class:`TrainingPreempted`, not with a normal return from
``fit``: code after ``fit`` (a ``trainer.test()``, an export) must not run on a half-trained
model, and a launcher (torchrun's ``--max-restarts``, a batch script's requeue test) must read the
process as unfinished. Uncaught, it exits with :data:`PREEMPTED_EXIT_CODE`.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from types import FrameType
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lightning_field.checkpoint.options import DEFAULT_SIGNALS, positive_or_none
from lightning_field.checkpoint.owner import SavePoint
from lightning_field.compat import lightning as internals
from lightning_field.core.manifest import StopRecord

log = logging.getLogger(__name__)


#: sysexits.h's EX_TEMPFAIL, "temporary failure; the user is invited to retry": what a preempted
#: attempt exits with when nothing catches :class:`TrainingPreempted`.
PREEMPTED_EXIT_CODE = 75


class TrainingPreempted(SIGTERMException):
    """A preemption signal was turned into a recoverable checkpoint and this attempt ended.

    A subclass of Lightning's :class:`~lightning.pytorch.utilities.exceptions.SIGTERMException`
    (itself a ``SystemExit``), raised where plain Lightning raises that on SIGTERM, so every
    callback's ``on_exception`` sees it, and an uncaught one ends the process with exit status
    :data:`PREEMPTED_EXIT_CODE` (75) instead of Lightning's 0.

    Attributes:
        checkpoint: the committed, recoverable checkpoint to resume from.
        step: the global step it holds.
        signal_name: the signal that asked for the stop (``"SIGTERM"``, ``"SIGUSR1"``, or a peer
            rank's signal).

    Example::

        try:
            trainer.fit(model, datamodule=data, ckpt_path="last")
        except TrainingPreempted as stop:
            print(f"resume later from {stop.checkpoint}")
            raise  # exit 75: the launcher or the batch script requeues the same command
    """

    def __init__(self, checkpoint: str | None, step: int, signal_name: str) -> None:
        super().__init__(PREEMPTED_EXIT_CODE)
        self.checkpoint = checkpoint
        self.step = step
        self.signal_name = signal_name

    def __str__(self) -> str:
        return (
            f"training preempted by {self.signal_name} at step {self.step}; recoverable checkpoint"
            f" {self.checkpoint}; run the same command again with ckpt_path='last' to resume"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # Picklable with its fields (spawned DDP workers send exceptions back to the parent).
        return (type(self), (self.checkpoint, self.step, self.signal_name))


class PreemptionWatcher:
    def __init__(self, signals: Iterable[int] = DEFAULT_SIGNALS, on_first: Callable[[int], None] | None = None) -> None:
        self.signals = tuple(signals)
        self.on_first = on_first
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        """Take over the signals (replacing Lightning's own SIGTERM handler, which broadcasts from
        inside the handler and would deadlock a DDP run). Only possible on the main thread."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in self.signals:
            if sig not in self._previous:
                self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        first = self.received is None
        self.received = signum
        if first and self.on_first is not None:
            self.on_first(signum)

    @property
    def requested(self) -> bool:
        return self.received is not None


class InterruptWatcher:
    """Ctrl-C (SIGINT) while training: the first asks for a save at the end of the step under way and
    a stop (:meth:`requested`); a second, before that, interrupts at once, as without this watcher
    (a ``KeyboardInterrupt`` where the training thread is; ``checkpoint.exception_save`` then decides
    whether that state can still be saved)."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None
        self._installed = False

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread() or self._installed:
            return
        self._previous = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, self._handle)
        self._installed = True

    def uninstall(self) -> None:
        if threading.current_thread() is not threading.main_thread() or not self._installed:
            return
        signal.signal(signal.SIGINT, self._previous if self._previous is not None else signal.default_int_handler)
        self._installed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            self.uninstall()
            raise KeyboardInterrupt
        self.requested = True
        # Written, not logged: a handler may run while the logging module holds its lock.
        sys.stderr.write(
            "\nlightning_field: Ctrl-C: saving a resume point at the end of this step, then stopping"
            " (press Ctrl-C again to stop at once)\n"
        )
        sys.stderr.flush()


def requeue_slurm_job(env: dict[str, str] | None = None) -> bool:
    """Ask SLURM to requeue this job (``scontrol requeue``), as Lightning's auto-requeue does.

    Called on global rank 0 only, after the preemption checkpoint is committed, so the requeued
    job finds it. Returns whether ``scontrol`` accepted; a failure is logged, never raised: the
    checkpoint is safe either way and the exit status still says the attempt did not finish.
    """
    env = dict(os.environ if env is None else env)
    array_job = env.get("SLURM_ARRAY_JOB_ID")
    job_id = f"{array_job}_{env.get('SLURM_ARRAY_TASK_ID', '')}" if array_job else env.get("SLURM_JOB_ID", "")
    if not re.fullmatch(r"[0-9]+(_[0-9]+)?", job_id):
        log.warning("Not requeued: no usable SLURM job id in the environment (got %r)", job_id)
        return False
    try:
        result = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        log.warning("Requeuing SLURM job %s failed: %s", job_id, error)
        return False
    if result.returncode != 0:
        log.warning(
            "Requeuing SLURM job %s failed (scontrol exit %d): %s", job_id, result.returncode, result.stderr.strip()
        )
        return False
    log.info("Requeued SLURM job %s", job_id)
    return True


class PreemptionSave:
    """Turns a watched signal into a recoverable checkpoint at the next step boundary, then ends
    the attempt with :class:`TrainingPreempted`; built on ``ManifestCheckpoint.save_now``.

    Args:
        checkpoint: the callback whose checkpoints a resume uses.
        signals: the signals to watch (SLURM's requeue signal is added at ``train_start`` when
            Lightning's auto-requeue is on; global rank 0 then requeues once the save committed).
        check_every_n_steps: in multi-rank runs, how often ranks agree on a pending signal with one
            small all-reduce (default: every step on CPU, every 10 on accelerators, where reading the
            result synchronises the device). Single-process runs check every step for free.

    The checkpoint calls :meth:`after_step` where its own step-boundary save has happened, so a
    preemption at a step that is already saved only names that checkpoint. Every rank reaches the
    agreement at the same step: a signal seen by any rank stops all of them, none saves alone.
    """

    def __init__(self, checkpoint: SavePoint, signals: Sequence[int], check_every_n_steps: int | None = None) -> None:
        self.check_every_n_steps = positive_or_none("interrupts.check_every_n_steps", check_every_n_steps)
        self.saved: str | None = None
        self._checkpoint = checkpoint
        self._trainer: pl.Trainer | None = None
        self._requeue_signal: int | None = None
        self._watcher = PreemptionWatcher(signals, on_first=self._forward_signal)
        self._interrupt = InterruptWatcher()

    def start(self, trainer: pl.Trainer) -> None:
        """Watch the signals (``on_train_start``)."""
        self._trainer = trainer
        self._requeue_signal = internals.slurm_requeue_signal(trainer)
        if self._requeue_signal is not None and self._requeue_signal not in self._watcher.signals:
            self._watcher.signals = (*self._watcher.signals, self._requeue_signal)
        self._watcher.install()
        self._interrupt.requested = False
        self._interrupt.install()

    def stop(self) -> None:
        self._watcher.uninstall()
        self._interrupt.uninstall()

    def is_agreement_step(self, trainer: pl.Trainer) -> bool:
        """Whether ranks agree on pending signals (and background-save failures) at this step."""
        every = self.check_every_n_steps
        if every is None:
            every = 1 if trainer.strategy.root_device.type == "cpu" else 10
        return trainer.global_step % every == 0

    def _forward_signal(self, signum: int) -> None:
        # With Lightning's subprocess launcher only rank 0 may receive the signal; pass it on.
        launcher = getattr(self._trainer.strategy, "launcher", None) if self._trainer else None
        if launcher is not None and hasattr(launcher, "kill"):
            launcher.kill(signum)

    def after_step(self, trainer: pl.Trainer) -> None:
        """At a step boundary, after the checkpoint's own save: save and stop if a signal arrived.

        Raises:
            TrainingPreempted: on every rank, once the checkpoint of this step is committed.
        """
        preempted, interrupted = self._watcher.requested, self._interrupt.requested
        if trainer.world_size > 1:
            if not self.is_agreement_step(trainer):
                return
            # One all-reduce for both: any rank's signal, or Ctrl-C, stops every rank at this step.
            votes = trainer.strategy.reduce(
                torch.tensor([float(preempted), float(interrupted)], device=trainer.strategy.root_device),
                reduce_op="sum",
            )
            preempted, interrupted = bool(votes[0].item() > 0), bool(votes[1].item() > 0)
        if interrupted and not preempted:
            self._stop_interrupted(trainer)
        if not preempted:
            return
        stopped: StopRecord = {"by": "preemption", "detail": "a preemption signal", "finished": False}
        self.saved = self._checkpoint.save_now(
            trainer, "preempted-{step}", blocking=True, unless_saved=True, as_resume_point=True, stopped=stopped
        )
        trainer.should_stop = True
        sig = self._watcher.received
        name = signal.Signals(sig).name if sig is not None else "a peer rank's signal"
        events = self._checkpoint.events
        if events is not None:
            events.emit("preempted", step=trainer.global_step, payload={"signal": name, "path": self.saved})
        rank_zero_info(
            f"Preempted ({name}): saved recoverable checkpoint {self.saved} at step"
            f" {trainer.global_step}; ending this attempt with TrainingPreempted (exit status"
            f" {PREEMPTED_EXIT_CODE} unless caught). Resume with trainer.fit(..., ckpt_path='last')."
        )
        if sig is not None and sig == self._requeue_signal and trainer.is_global_zero:
            requeue_slurm_job()
        # Where plain Lightning raises SIGTERMException: nothing after fit() runs on this model, and
        # the launcher sees an unfinished attempt.
        raise TrainingPreempted(self.saved, trainer.global_step, name)

    def _stop_interrupted(self, trainer: pl.Trainer) -> None:
        """Ctrl-C: the step under way is done; save it, then end as Lightning ends a KeyboardInterrupt
        (its graceful shutdown, exit status 1), not as a preemption (75 asks a launcher to retry)."""
        stopped: StopRecord = {"by": "KeyboardInterrupt", "detail": "Ctrl-C (SIGINT)", "finished": False}
        saved = self._checkpoint.save_now(
            trainer, "interrupted-{step}", blocking=True, unless_saved=True, as_resume_point=True, stopped=stopped
        )
        events = self._checkpoint.events
        if events is not None:
            events.emit("interrupted", step=trainer.global_step, payload={"signal": "SIGINT", "path": saved})
        rank_zero_info(
            f"lightning_field: Ctrl-C: saved the resume point {saved} at step {trainer.global_step}; rerun with"
            " ckpt_path='last' to continue exactly."
        )
        self._interrupt.uninstall()
        raise KeyboardInterrupt
