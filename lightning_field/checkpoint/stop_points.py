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

Each such save records why fit ended there (``Manifest.stopped``, a ``StopRecord``): by its limits
(``max_steps``, ``max_epochs``), by ``EarlyStopping`` or by ``max_time`` the run had *finished*;
by any other ``trainer.should_stop`` it had merely stopped. The same command rerun with
``ckpt_path="last"`` then has nothing to do where the stop would hold again at once
(:func:`finished_detail`): the limits are reached, the same ``EarlyStopping`` (monitor, mode,
patience, thresholds) is still there, or ``max_time`` is no larger than the time already trained.
Such a rerun restores the checkpoint (so the module holds the finished weights), trains no step,
and says so; anything else, a larger limit, the stopping callback removed or changed, a stop of
unknown origin, continues exactly.

Built on ``ManifestCheckpoint.save_now``; every rank reaches each hook at the same step, and
Lightning's stop requests are already agreed across ranks (the Timer broadcasts, EarlyStopping
reduces), so no collective is added.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import EarlyStopping, Timer
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from lightning_field.checkpoint.owner import SavePoint
from lightning_field.compat import lightning as internals
from lightning_field.core.events import EventLog
from lightning_field.core.manifest import Manifest, StopRecord

__all__ = ["StopPointSave", "announce_finished", "finished_detail", "rerun_limits", "stop_record"]

STOPPED_NAME = "stopped-{step}"
FINAL_NAME = "final-{step}"


class StopPointSave:
    """Saves a recoverable checkpoint where the Trainer ends fit.

    Args:
        checkpoint: the callback whose ``save_now`` commits the resume point.
        save_on_stop: save when ``trainer.should_stop`` ends fit before its limits
            (``InterruptConfig.save_on_stop``).
        save_on_train_end: save when ``max_steps`` or ``max_epochs`` ends it
            (``InterruptConfig.save_on_train_end``).

    The checkpoint calls :meth:`after_batch` from ``on_train_batch_end`` (after its scheduled save,
    except on an epoch's last batch), :meth:`after_validation` from a mid-epoch ``on_validation_end``,
    and :meth:`at_epoch_end` from ``on_train_epoch_end``.
    """

    def __init__(self, checkpoint: SavePoint, save_on_stop: bool, save_on_train_end: bool) -> None:
        self._checkpoint = checkpoint
        self.save_on_stop, self.save_on_train_end = save_on_stop, save_on_train_end
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
        if self._stop_requested(trainer) and self.save_on_stop:
            if internals.accumulating(trainer):
                # The window's gradients would be lost; Lightning stops at the window's step instead.
                self._held_stop = True
                trainer.should_stop = False
                return
            self._save(trainer, STOPPED_NAME, "trainer.should_stop was set")
            return
        if self.save_on_train_end and _at_max_steps(trainer):
            self._save(trainer, FINAL_NAME, f"max_steps={trainer.max_steps} reached")

    def after_validation(self, trainer: pl.Trainer) -> None:
        """At a validation's end inside the epoch (``EarlyStopping`` decides there)."""
        if self.save_on_stop and self._stop_requested(trainer) and not internals.accumulating(trainer):
            self._save(trainer, STOPPED_NAME, "trainer.should_stop was set at validation")

    def at_epoch_end(self, trainer: pl.Trainer) -> None:
        """At ``on_train_epoch_end``, after the epoch's own saves."""
        if self._held_stop:  # the epoch's last batch closed the window (it always steps)
            self._held_stop = False
            trainer.should_stop = True
        stopped = self._stop_requested(trainer)
        if not stopped and not internals.max_epochs_reached(trainer) and not _at_max_steps(trainer):
            return
        if not (self.save_on_stop if stopped else self.save_on_train_end):
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
        stopped = stop_record(trainer)
        saved = self._checkpoint.save_now(trainer, name, unless_saved=True, as_resume_point=True, stopped=stopped)
        if fresh:
            reason = stopped["detail"] if stopped["by"] != "should_stop" else reason
            rank_zero_info(
                f"lightning_field: fit ends at step {trainer.global_step} ({reason}): saved the resume point"
                f" {saved}; rerun with ckpt_path='last' (and larger limits) to continue exactly."
            )


def _at_max_steps(trainer: pl.Trainer) -> bool:
    max_steps = trainer.max_steps
    return max_steps is not None and max_steps >= 0 and trainer.global_step >= max_steps


# ---------------------------------------------------------------------------------------------- why fit ended
def _plain_number(value: Any) -> float | None:
    return None if value is None else float(value)


def early_stopping_settings(callback: EarlyStopping) -> dict[str, Any]:
    """What makes a rerun's ``EarlyStopping`` the one that stopped the run: its state key (monitor and
    mode) and every setting that decides a stop. Its counters are restored from the checkpoint."""
    return {
        "state_key": callback.state_key,
        "patience": int(callback.patience),
        "min_delta": float(callback.min_delta),
        "stopping_threshold": _plain_number(callback.stopping_threshold),
        "divergence_threshold": _plain_number(callback.divergence_threshold),
        "check_finite": bool(callback.check_finite),
    }


def _timers(trainer: pl.Trainer) -> list[Timer]:
    return [c for c in internals.trainer_callbacks(trainer) if isinstance(c, Timer)]


def stop_record(trainer: pl.Trainer) -> StopRecord:
    """Why fit ends at this step: its limits, the ``EarlyStopping`` that stopped it, the ``max_time``
    its ``Timer`` reached (each *finished*), or another ``trainer.should_stop`` (not finished: a
    rerun continues). The limits come first: a rerun with larger ones must train on."""
    epochs = internals.epochs_processed(trainer)
    if _at_max_steps(trainer):
        return {
            "by": "max_steps",
            "detail": f"max_steps={trainer.max_steps} reached",
            "finished": True,
            "epochs_done": epochs,
        }
    if internals.max_epochs_reached(trainer):
        return {
            "by": "max_epochs",
            "detail": f"max_epochs={trainer.max_epochs} reached",
            "finished": True,
            "epochs_done": epochs,
        }
    for callback in internals.trainer_callbacks(trainer):
        if (
            isinstance(callback, EarlyStopping)
            and callback.stopping_reason != EarlyStoppingReason.NOT_STOPPED
            and callback.stopped_epoch == trainer.current_epoch
        ):
            return {
                "by": "EarlyStopping",
                "detail": f"EarlyStopping on {callback.monitor}",
                "finished": True,
                "epochs_done": epochs,
                "stopper": early_stopping_settings(callback),
            }
    for timer in _timers(trainer):
        limit, remaining = internals.timer_limit_seconds(timer), timer.time_remaining()
        if limit is not None and remaining is not None and remaining <= 0:
            return {
                "by": "max_time",
                "detail": f"max_time={datetime.timedelta(seconds=limit)} reached",
                "finished": True,
                "epochs_done": epochs,
                "stopper": {"max_time_s": limit, "elapsed_s": timer.time_elapsed()},
            }
    return {"by": "should_stop", "detail": "trainer.should_stop was set", "finished": False, "epochs_done": epochs}


def rerun_limits(trainer: pl.Trainer) -> dict[str, Any]:
    """What this run, before anything is restored, would stop on: its limits, minimums, ``Timer``
    limits and ``EarlyStopping`` settings (the other side of :func:`finished_detail`)."""
    return {
        "max_steps": trainer.max_steps,
        "max_epochs": trainer.max_epochs,
        "min_steps": trainer.min_steps,
        "min_epochs": trainer.min_epochs,
        "max_time_s": [limit for t in _timers(trainer) if (limit := internals.timer_limit_seconds(t)) is not None],
        "early_stopping": [
            early_stopping_settings(c) for c in internals.trainer_callbacks(trainer) if isinstance(c, EarlyStopping)
        ],
    }


def _count(value: Any) -> int | None:
    return value if type(value) is int else None


def _reached(limit: Any, count: int) -> bool:
    return _count(limit) is not None and 0 <= limit <= count


def finished_detail(stopped: Mapping[str, Any] | None, step: int, rerun: Mapping[str, Any]) -> str | None:
    """Why a rerun that resumes at ``step`` from a save whose manifest records ``stopped`` has nothing
    to do (e.g. ``"EarlyStopping on val_loss"``), or None when it trains on.

    Only a record that says the run had finished can end a rerun. Then: a limit of the rerun
    (``rerun``: :func:`rerun_limits`) already reached ends it as Lightning's own loop would; a stop
    by ``EarlyStopping`` holds while a callback with the same settings is there; one by ``max_time``
    while the rerun's limit is no larger than the time already trained. A rerun whose ``min_steps``
    or ``min_epochs`` is not yet met trains on (Lightning would not stop it).
    """
    if not isinstance(stopped, Mapping) or stopped.get("finished") is not True:
        return None
    epochs = _count(stopped.get("epochs_done")) or 0
    if _reached(rerun.get("max_steps"), step):
        return f"max_steps={rerun['max_steps']} reached"
    if _reached(rerun.get("max_epochs"), epochs):
        return f"max_epochs={rerun['max_epochs']} reached"
    if (_count(rerun.get("min_steps")) or 0) > step or (_count(rerun.get("min_epochs")) or 0) > epochs:
        return None
    stopper, detail = stopped.get("stopper"), str(stopped.get("detail"))
    if stopped.get("by") == "EarlyStopping" and isinstance(stopper, Mapping):
        return detail if dict(stopper) in list(rerun.get("early_stopping") or []) else None
    if stopped.get("by") == "max_time" and isinstance(stopper, Mapping):
        elapsed = stopper.get("elapsed_s")
        if isinstance(elapsed, (int, float)) and not isinstance(elapsed, bool):
            limits = [limit for limit in rerun.get("max_time_s") or [] if isinstance(limit, (int, float))]
            return detail if any(limit <= elapsed for limit in limits) else None
    return None


def announce_finished(trainer: pl.Trainer, manifest: Manifest, path: Any, events: EventLog | None) -> bool:
    """On ``fit(ckpt_path=...)``, before the checkpoint is loaded: whether the run it continues had
    already finished for this Trainer (:func:`finished_detail`). If so, ``trainer.should_stop`` is
    set, so Lightning's fit loop returns before its first batch (its train loader never iterated,
    no validation), the rerun says so (rank-zero info, a ``fit_already_finished`` event) and the
    checkpoint is still restored, so the module and the Trainer hold the finished state."""
    detail = finished_detail(manifest.stopped, manifest.step, rerun_limits(trainer))
    if detail is None:
        return False
    trainer.should_stop = True
    rank_zero_info(
        f"lightning_field: training had already stopped at step {manifest.step} ({detail}); nothing to do."
        f" Restored {path} as it is; rerun with larger limits or without the stopping callback to train on."
    )
    if events is not None:
        by = (manifest.stopped or {}).get("by")
        events.emit("fit_already_finished", step=manifest.step, payload={"path": str(path), "by": by, "detail": detail})
    return True
