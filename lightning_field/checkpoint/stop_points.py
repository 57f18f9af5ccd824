"""Every way a run ends before or at its limits leaves a resume point at the step it ended.

Lightning ends ``fit`` early when ``trainer.should_stop`` is set (its ``Timer`` for ``max_time``,
``EarlyStopping``, any callback or module), and at ``max_steps`` mid-epoch. In both cases the loop
then runs the rest of the epoch's end as if the epoch had finished: a validation the uninterrupted
run never ran, every ``on_train_epoch_end`` hook, and the epoch counter moved on. A checkpoint taken
after that (``on_train_end``) resumes one epoch ahead: under ``max_epochs`` the rest of the stopped
epoch is skipped, silently. So the resume point is taken where the run really stopped, the end of
the batch whose hooks asked for the stop (or the validation that did), which restores exactly as a
scheduled mid-epoch checkpoint does; a stop at an epoch's end is saved at that end, as an
epoch-interval checkpoint is.

A stop asked for inside a gradient-accumulation window is held until the window's optimizer step:
stopping there would throw away the gradients accumulated so far, which no checkpoint holds.

Built on ``ManifestCheckpoint.save_now``; every rank reaches each hook at the same step, and
Lightning's stop requests are already agreed across ranks (the Timer broadcasts, EarlyStopping
reduces), so no collective is added.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import lightning.pytorch as pl
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from lightning_field.compat import lightning as internals

if TYPE_CHECKING:
    from lightning_field.checkpoint.manifest_checkpoint import ManifestCheckpoint

__all__ = ["StopPointSave"]

STOPPED_NAME = "stopped-{step}"
FINAL_NAME = "final-{step}"


class StopPointSave:
    """Saves a recoverable checkpoint where the Trainer ends fit.

    Args:
        checkpoint: the callback whose ``save_now`` commits the resume point. Its ``save_on_stop``
            says whether to save when ``trainer.should_stop`` ends fit before its limits, its
            ``save_on_train_end`` whether to save when ``max_steps`` or ``max_epochs`` ends it.

    The checkpoint calls :meth:`after_batch` from ``on_train_batch_end`` (after its scheduled save,
    except on an epoch's last batch), :meth:`after_validation` from a mid-epoch ``on_validation_end``,
    and :meth:`at_epoch_end` from ``on_train_epoch_end``.
    """

    def __init__(self, checkpoint: ManifestCheckpoint) -> None:
        self._checkpoint = checkpoint
        self._held_stop = False

    def reset(self) -> None:
        """A new ``fit``: no stop held."""
        self._held_stop = False

    def _stop_requested(self, trainer: pl.Trainer) -> bool:
        return bool(trainer.should_stop) and internals.can_stop_early(trainer)

    def after_batch(self, trainer: pl.Trainer) -> None:
        """At a batch's end inside the epoch: save if fit ends after this batch."""
        if self._held_stop and not internals.accumulating(trainer):
            self._held_stop = False
            trainer.should_stop = True
        if self._stop_requested(trainer) and self._checkpoint.save_on_stop:
            if internals.accumulating(trainer):
                # The window's gradients would be lost; Lightning stops at the window's step instead.
                self._held_stop = True
                trainer.should_stop = False
                return
            self._save(trainer, STOPPED_NAME, "trainer.should_stop was set")
            return
        if self._checkpoint.save_on_train_end and _at_max_steps(trainer):
            self._save(trainer, FINAL_NAME, f"max_steps={trainer.max_steps} reached")

    def after_validation(self, trainer: pl.Trainer) -> None:
        """At a validation's end inside the epoch (``EarlyStopping`` decides there)."""
        if self._checkpoint.save_on_stop and self._stop_requested(trainer) and not internals.accumulating(trainer):
            self._save(trainer, STOPPED_NAME, "trainer.should_stop was set at validation")

    def at_epoch_end(self, trainer: pl.Trainer) -> None:
        """At ``on_train_epoch_end``, after the epoch's own saves."""
        if self._held_stop:  # the epoch's last batch closed the window (it always steps)
            self._held_stop = False
            trainer.should_stop = True
        stopped = self._stop_requested(trainer)
        if not stopped and not internals.max_epochs_reached(trainer) and not _at_max_steps(trainer):
            return
        if not (self._checkpoint.save_on_stop if stopped else self._checkpoint.save_on_train_end):
            return
        if not internals.is_last_batch_of_epoch(trainer):
            # The stop was asked for after this callback's batch-end hook (a LightningModule's
            # on_train_batch_end, with no validation after it): the state now already holds part of
            # the epoch's end, and the epoch's position is no longer what a resume needs.
            if not self._already_saved(trainer):
                rank_zero_warn(
                    f"lightning_field: the Trainer stopped mid-epoch at step {trainer.global_step} from a hook that"
                    " runs after ManifestCheckpoint's on_train_batch_end (e.g. LightningModule.on_train_batch_end):"
                    " no resume point could be saved at that step, and a rerun resumes from the newest earlier"
                    " checkpoint. Set trainer.should_stop in training_step or in a callback instead."
                )
            return
        reason = "trainer.should_stop was set" if stopped else "its max_steps or max_epochs reached"
        self._save(trainer, STOPPED_NAME if stopped else FINAL_NAME, reason)

    def _already_saved(self, trainer: pl.Trainer) -> bool:
        return self._checkpoint.last_saved_step == trainer.global_step

    def _save(self, trainer: pl.Trainer, name: str, reason: str) -> None:
        if trainer.sanity_checking:
            return
        fresh = not self._already_saved(trainer)
        saved = self._checkpoint.save_now(trainer, name, unless_saved=True, as_resume_point=True)
        if fresh:
            rank_zero_info(
                f"lightning_field: fit ends at step {trainer.global_step} ({reason}): saved the resume point"
                f" {saved}; rerun with ckpt_path='last' (and larger limits) to continue exactly."
            )


def _at_max_steps(trainer: pl.Trainer) -> bool:
    max_steps = trainer.max_steps
    return max_steps is not None and max_steps >= 0 and trainer.global_step >= max_steps
