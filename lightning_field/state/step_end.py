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

__all__ = ["StepEnd", "WatchedTensors", "changed_since"]


@dataclass(frozen=True)
class WatchedTensors:
    """Where the tensors a step may write in place live: (label, owner, attribute) for each module
    buffer and torchmetrics state. Found once per fit (walking the modules every step would cost more
    than the rest of a step's bookkeeping together); a module tree that has gained or lost one since
    is a change in itself (:func:`changed_since`)."""

    places: tuple[tuple[str, Any, str], ...]

    @classmethod
    def of(cls, module: pl.LightningModule) -> WatchedTensors:
        places = []
        for prefix, submodule in module.named_modules():
            for name, buffer in submodule._buffers.items():
                if buffer is not None:
                    places.append((f"buffer {prefix + '.' if prefix else ''}{name}", submodule, name))
            if isinstance(submodule, Metric):
                places.extend((f"torchmetrics state {prefix}.{name}", submodule, name) for name in submodule._defaults)
        return cls(tuple(places))

    def read(self) -> tuple[tuple[Any, int], ...]:
        """Each place's current value and its in-place write counter."""
        return tuple((value := getattr(owner, name, None), _version(value)) for _, owner, name in self.places)


@dataclass(frozen=True)
class StepEnd:
    """One rank's state at a step's end that a later save may need, or check, unchanged."""

    step: int
    epoch: int
    fetches: int  # the train fetcher's count of batches fetched this epoch at that point
    rng: dict[str, Any]
    progress: dict[str, Any]
    watch: WatchedTensors
    watched: tuple[tuple[Any, int], ...]  # watch.read() then
    # self.log's accumulators: (key, result, attribute, value, version)
    logged: tuple[tuple[str, Any, str, Any, int], ...]

    @property
    def trained(self) -> int:
        """Batches trained this epoch at that point (the loaders' position to rewind to follows them)."""
        return int(self.progress["epoch_loop.batch_progress"]["current"]["processed"])

    @classmethod
    def capture(cls, trainer: pl.Trainer, rng: dict[str, Any], watch: WatchedTensors) -> StepEnd:
        return cls(
            trainer.global_step,
            trainer.current_epoch,
            internals.successful_fetches(trainer),
            rng,
            step_progress(trainer),
            watch,
            watch.read(),
            _logged(trainer),
        )


def _logged(trainer: pl.Trainer) -> tuple[tuple[str, Any, str, Any, int], ...]:
    found = []
    for key, result in internals.training_results(trainer).items():
        for name in ("value", "cumulated_batch_size"):
            value = getattr(result, name, None)
            if value is not None:
                found.append((key, result, name, value, _version(value)))
    return tuple(found)


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
    before = tuple(dict.fromkeys(key for key, *_ in end.logged))
    if logged != before:
        return f"the values logged with self.log ({', '.join(sorted(set(logged) - set(before))) or 'fewer'})"
    for key, owner, name, value, version in end.logged:
        now = getattr(owner, name, None)
        if now is not value or _version(now) != version:
            return f"the logged value {key}"
    found = WatchedTensors.of(trainer.lightning_module)
    if [(label, id(owner), name) for label, owner, name in found.places] != [
        (label, id(owner), name) for label, owner, name in end.watch.places
    ]:
        return "the module's buffers or metrics (one registered or removed since the fit began)"
    for (label, _, _), (value, version), (now, now_version) in zip(
        end.watch.places, end.watched, end.watch.read(), strict=True
    ):
        if now is not value or now_version != version:
            return label
    return None
