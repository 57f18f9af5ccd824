"""An exception in your code leaves a resume point at the step it reached, where the state allows.

A run that fails in step ``n + 1`` (an error in ``training_step``, a data error in the fetch, an
out-of-memory in the backward) has done ``n`` steps: saving them means the rerun redoes only the step
that failed, not every step since the last checkpoint. But the live state is no longer step ``n``'s:
the failed step fetched a batch, drew random numbers, updated metrics. So the save is made from step
``n``'s end (:mod:`~lightning_field.state.step_end`): the RNG streams and loader position from
then, the loop counters put back, and the tensors the step could have written in place checked
unchanged. It is made only where that state is provably step ``n``'s:

* no optimizer step had begun (the weights and optimizer would be neither step's);
* not inside a gradient-accumulation window (its gradients are in no checkpoint), a validation or
  an epoch's end (their counters and hooks are not rewound);
* no watched tensor changed (a batch norm's running statistics, a metric's state, a logged value);
* a single process: over several ranks the others wait in a collective for the one that failed,
  so no save that needs them all is attempted (the newest checkpoint or snapshot stands).

Otherwise nothing is saved, and the log says why and which resume point stands. The save records
``stopped={"by": <the exception's type>, "finished": False}``: the rerun continues.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from lightning_field.checkpoint.owner import ExceptionSaveOwner
from lightning_field.compat import lightning as internals
from lightning_field.state.prefetch import PositionBeforeFetch
from lightning_field.state.rank_tracking import RankStateTracker
from lightning_field.state.step_end import StepEnd, WatchedTensors, changed_since

__all__ = ["ExceptionSave", "Rewind"]

log = logging.getLogger(__name__)

FAILED_NAME = "failed-{step}"
NOT_STARTED = "no step had ended yet in this attempt"


@dataclass(frozen=True)
class Rewind:
    """What a save made after the step it holds puts back (:meth:`ExceptionSave.rewind_checkpoint`)."""

    progress: dict[str, Any]
    position: PositionBeforeFetch
    rng: dict[str, Any]


class ExceptionSave:
    """Tracks whether the state is still the last step's end, and saves it at an exception.

    Args:
        checkpoint: the callback that saves (``save_now``) and whose hooks report the phases:
            :meth:`step_ended` at a batch's end (after its own saves), :meth:`spoil` where the state
            leaves the step's end (an optimizer step begins, a validation, an epoch's end), and
            :meth:`at_exception` from ``on_exception``.
        rank_tracker: the rank state the callback captures, whose RNG and loader positions at the
            step's end an exception's save records instead of the live ones.
    """

    def __init__(self, checkpoint: ExceptionSaveOwner, rank_tracker: RankStateTracker) -> None:
        self._checkpoint = checkpoint
        self._rank_tracker = rank_tracker
        self._end: StepEnd | None = None
        self._watch = WatchedTensors(())
        self._why_not = NOT_STARTED
        self.rewind: Rewind | None = None
        """Set only while the exception's save is captured."""

    def rewind_checkpoint(self, checkpoint: dict[str, Any]) -> tuple[PositionBeforeFetch, dict[str, Any]] | None:
        """While the exception's save is captured: its loop progress put back to the step's end in
        ``checkpoint``, and the loaders' position and RNG streams the rank state must record instead
        of the live ones; else None (every other save holds the live state)."""
        if self.rewind is None:
            return None
        internals.rewind_progress(checkpoint, self.rewind.progress)
        return self.rewind.position, self.rewind.rng

    def start(self, trainer: pl.Trainer) -> None:
        """A new fit: nothing to rewind to yet; copies of the loaders' position taken before every
        fetch where an exception save is possible at all (a single process)."""
        self._end, self._why_not = None, NOT_STARTED
        self._rank_tracker.prefetched.for_every_loader = trainer.world_size == 1
        if trainer.world_size == 1:
            self._watch = WatchedTensors.of(trainer.lightning_module)

    def step_ended(self, trainer: pl.Trainer) -> None:
        if trainer.world_size > 1:
            return
        if internals.accumulating(trainer):
            self.spoil(
                f"it came inside a gradient-accumulation window of step {trainer.global_step + 1}, whose"
                " accumulated gradients are in no checkpoint"
            )
            return
        self._end = StepEnd.capture(trainer, self._rank_tracker.rng_at_batch_end, self._watch)
        self._why_not = ""

    def spoil(self, why: str) -> None:
        """The state is no longer the last step's end (until the next one): say ``why`` if asked to save."""
        if self._end is not None:
            self._end, self._why_not = None, why

    def at_exception(self, trainer: pl.Trainer, exception: BaseException) -> str | None:
        """Save step ``n``'s resume point for an exception in step ``n + 1`` where the state allows,
        else say why not; the checkpoint saved, or None."""
        if self._why_not == NOT_STARTED:
            return None  # it failed before training (a refused resume, set-up): nothing to say here
        if self._checkpoint.last_saved_step == trainer.global_step:
            return None  # this very step is saved already (its scheduled save, Ctrl-C's): it stands
        why_not = self._refusal(trainer)
        kind = type(exception).__name__
        if why_not is not None:
            committed = self._checkpoint.last_committed
            standing = committed[0] if committed is not None else "no checkpoint of this attempt"
            rank_zero_warn(
                f"lightning_field: {kind} at step {trainer.global_step + 1}: no resume point saved, as {why_not};"
                f" a rerun with ckpt_path='last' resumes from the newest one ({standing}, or a newer snapshot)."
            )
            return None
        end = self._end
        assert end is not None
        position = self._rank_tracker.prefetched.before(end.trained)
        assert position is not None  # _refusal checked it
        self.rewind = Rewind(end.progress, position, end.rng)
        detail = f"{kind} in step {end.step + 1}: {exception}"[:300]
        # save_on_exception=True: the checkpoint ModelCheckpoint would write, named by the user's filename
        # and kept; else a resume point of lightning_field's own, retired once a newer one commits.
        asked = bool(self._checkpoint.save_on_exception)
        try:
            saved = self._checkpoint.save_now(
                trainer,
                self._checkpoint.filename if asked else FAILED_NAME,
                blocking=True,
                unless_saved=True,
                as_resume_point=not asked,
                stopped={"by": kind, "detail": detail, "finished": False},
            )
        except Exception as err:  # the save failing must not hide the user's exception
            log.warning("lightning_field: the resume point at step %d could not be saved: %s", end.step, err)
            return None
        finally:
            self.rewind = None
        rank_zero_info(
            f"lightning_field: {kind} in step {end.step + 1}: saved the resume point of step {end.step}, {saved};"
            " fix the cause and rerun with ckpt_path='last': only the failed step is redone."
        )
        return saved

    def _refusal(self, trainer: pl.Trainer) -> str | None:
        if trainer.world_size > 1:
            return (
                "the other ranks wait in a collective for this one, and a save needs them all (the"
                " newest checkpoint or snapshot stands)"
            )
        end = self._end
        if end is None:
            return self._why_not
        if trainer.global_step != end.step or trainer.current_epoch != end.epoch:
            return "the step or epoch had moved on since the last step's end"
        changed = changed_since(end, trainer)
        if changed is not None:
            return f"the failed step had already changed {changed}"
        if self._rank_tracker.prefetched.before(end.trained) is None:
            return "the train loaders' position before the failed step's fetch was not seen"
        return None
