"""The training epoch loop's progress counters, read at a step's end and put back into a checkpoint
dumped later in the next step (Lightning 2.6's private ``_TrainingEpochLoop`` members).

A save at an exception inside step ``n + 1`` (``checkpoint.exception_save``) must restore exactly as
the save at step ``n``'s end would have: Lightning has by then counted batch ``n`` completed,
``_batches_that_stepped`` up, and batch ``n + 1`` (and its optimizer step) as ready and started.
Restored as dumped, the resume would take another restart path (a batch counted twice in the logged
step). So the counters are read at each step's end (a few dozen integers, a few microseconds) and
written over the dump's. ``tests/test_exception_save.py`` checks that the two dumps then agree.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

__all__ = ["rewind_progress", "step_progress"]

# Where _Loop.state_dict puts each tracker in the fit loop's part of a checkpoint, and where it lives.
_TRACKERS = {
    "epoch_loop.batch_progress": ("batch_progress",),
    "epoch_loop.scheduler_progress": ("scheduler_progress",),
    "epoch_loop.automatic_optimization.optim_progress": ("automatic_optimization", "optim_progress"),
    "epoch_loop.manual_optimization.optim_step_progress": ("manual_optimization", "optim_step_progress"),
}


def _counters(tracker: Any) -> Any:
    """A progress dataclass as its ``state_dict`` (``asdict``) has it, read field by field (asdict's
    deep copy costs several times more, once per step)."""
    if hasattr(tracker, "__dataclass_fields__"):
        return {name: _counters(value) for name, value in vars(tracker).items()}
    return tracker


def step_progress(trainer: pl.Trainer) -> dict[str, Any]:
    """The epoch loop's progress counters now (at a step's end), keyed as a checkpoint holds them."""
    epoch_loop = trainer.fit_loop.epoch_loop
    found: dict[str, Any] = {"_batches_that_stepped": epoch_loop._batches_that_stepped}
    for key, path in _TRACKERS.items():
        tracker: Any = epoch_loop
        for name in path:
            tracker = getattr(tracker, name)
        found[key] = _counters(tracker)
    return found


def rewind_progress(checkpoint: dict[str, Any], progress: dict[str, Any]) -> None:
    """Write counters read by :func:`step_progress` over those of a checkpoint dumped since."""
    fit_loop = checkpoint["loops"]["fit_loop"]
    fit_loop["epoch_loop.state_dict"]["_batches_that_stepped"] = progress["_batches_that_stepped"]
    for key in _TRACKERS:
        fit_loop[key] = progress[key]
