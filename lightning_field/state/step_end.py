"""What a rank keeps of each step's end, so that an exception in the next step can still be saved
as that step's resume point (``checkpoint.exception_save``).

An exception inside step ``n + 1`` leaves the weights and optimizer as step ``n`` left them as long as
no optimizer step has begun. What the failed step did change is put back or detected:

* the RNG streams and the train loaders' position: put back from copies taken at step ``n``'s end and
  just before the next batch's fetch (``PrefetchedPosition`` keeps those for every loader when asked);
* the loop's progress counters: put back (``compat.lightning_progress``);
* tensors the step may have written in place before it failed (module buffers such as a batch
  norm's running statistics, torchmetrics states, the epoch accumulators of ``self.log``): each is
  recorded with its in-place write counter (``Tensor._version``), and any that changed, or was
  replaced, makes the state not the step's end: the save is refused, naming the tensor.

Python attributes a step changes before it fails (a counter in your module) are not seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
from torchmetrics import Metric

from lightning_field.compat import lightning as internals
from lightning_field.compat.lightning_progress import step_progress
from lightning_field.compat.torch import tensor_version

__all__ = ["StepEnd", "changed_since"]


@dataclass(frozen=True)
class StepEnd:
    """One rank's state at a step's end that a later save may need, or check, unchanged."""

    step: int
    epoch: int
    fetches: int  # the train fetcher's count of batches fetched this epoch at that point
    rng: dict[str, Any]
    progress: dict[str, Any]
    watched: tuple[tuple[str, Any, str, Any, int], ...]  # (name, owner, attribute, tensor, version)
    logged: tuple[str, ...]  # the keys self.log had accumulated: a new one is a change too

    @property
    def trained(self) -> int:
        """Batches trained this epoch at that point (the loaders' position to rewind to follows them)."""
        return int(self.progress["epoch_loop.batch_progress"]["current"]["processed"])

    @classmethod
    def capture(cls, trainer: pl.Trainer, rng: dict[str, Any]) -> StepEnd:
        return cls(
            trainer.global_step, trainer.current_epoch, internals.successful_fetches(trainer), rng,
            step_progress(trainer), tuple(_watched(trainer)), tuple(internals.training_results(trainer)),
        )  # fmt: skip


def _watched(trainer: pl.Trainer) -> list[tuple[str, Any, str, Any, int]]:
    found = []
    module = trainer.lightning_module
    for prefix, submodule in module.named_modules():
        for name, buffer in submodule._buffers.items():
            if buffer is not None:
                found.append((f"buffer {prefix + '.' if prefix else ''}{name}", submodule, name, buffer, 0))
        if isinstance(submodule, Metric):
            for name in submodule._defaults:
                value = getattr(submodule, name)
                found.append((f"torchmetrics state {prefix}.{name}", submodule, name, value, 0))
    for key, result in internals.training_results(trainer).items():
        for name in ("value", "cumulated_batch_size"):
            value = getattr(result, name, None)
            if value is not None:
                found.append((f"the logged value {key}", result, name, value, 0))
    return [(label, owner, name, value, _version(value)) for label, owner, name, value, _ in found]


def _version(value: Any) -> int:
    if isinstance(value, list):  # a "cat" torchmetrics state: a list it appends to
        return len(value)
    try:
        return tensor_version(value)
    except AttributeError:  # not a tensor: compared by identity alone
        return 0


def changed_since(end: StepEnd, trainer: pl.Trainer) -> str | None:
    """The first watched tensor that was written in place or replaced since ``end``, or None."""
    logged = tuple(internals.training_results(trainer))
    if logged != end.logged:
        return f"the values logged with self.log ({', '.join(sorted(set(logged) - set(end.logged))) or 'fewer'})"
    for label, owner, name, value, version in end.watched:
        now = getattr(owner, name, None)
        if now is not value or _version(now) != version:
            return label
    return None
