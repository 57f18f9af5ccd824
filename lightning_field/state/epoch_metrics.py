"""The accumulation state of epoch-level metrics, so that a mid-epoch resume closes the epoch with
the values the uninterrupted run would have logged.

``self.log(..., on_epoch=True)`` keeps a running sum (or max, min) and a sample count per logged
name, and a logged torchmetrics object keeps its own states (true positives, ...). Neither is in
any ``state_dict`` Lightning saves: after a resume the interrupted epoch's aggregate covers only the
batches after the restart, and so do the ``monitor=`` decisions of ModelCheckpoint and
EarlyStopping and the W&B curves that read it.

Captured at save time only (a host copy of a few scalars per logged name): nothing is added to a
training step. Restored in two parts: torchmetrics states before the first resumed batch; logged
values merged into Lightning's fresh accumulators right after the first resumed batch created them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torchmetrics import Metric

from lightning_field.compat import lightning as internals

_MERGEABLE = ("mean", "sum", "max", "min")


def capture_epoch_metrics(trainer: Any, pl_module: torch.nn.Module) -> dict[str, Any]:
    """Every torchmetrics state of the module and every epoch-accumulated logged training value."""
    metrics = {
        name: {"states": _copy(module.metric_state), "update_count": internals.metric_update_count(module)}
        for name, module in pl_module.named_modules()
        if isinstance(module, Metric)
    }
    names = {id(module): name for name, module in pl_module.named_modules()}
    logged: dict[str, Any] = {}
    reset_by_lightning = []
    for key, accumulated in internals.training_results(trainer).items():
        if not accumulated.is_tensor and id(accumulated.value) in names:
            reset_by_lightning.append(names[id(accumulated.value)])
        reduction = internals.result_reduction(accumulated)
        if reduction not in _MERGEABLE or not accumulated.meta.on_epoch:
            continue  # values logged per step only, or whose reduction is the user's own, hold no sum
        entry = {"reduction": reduction, "value": accumulated.value.detach().clone()}
        if reduction == "mean":
            entry["cumulated_batch_size"] = accumulated.cumulated_batch_size.detach().clone()
        logged[key] = entry
    # A torchmetrics object logged in validation belongs to that validation run, which is over at
    # any save Lightning makes while fitting (a save at its end included, before Lightning resets it).
    validated = [
        names[id(accumulated.value)]
        for accumulated in internals.validation_results(trainer).values()
        if not accumulated.is_tensor and id(accumulated.value) in names
    ]
    # A torchmetrics object given to self.log is reset by Lightning once the epoch is logged: after
    # a save at an epoch's end, its saved states belong to the epoch that is over.
    return {
        "torchmetrics": metrics,
        "logged": logged,
        "reset_at_epoch_end": sorted(set(reset_by_lightning)),
        "reset_after_validation": sorted(set(validated)),
        "callback_metrics": internals.callback_metrics(trainer),
    }


def _copy(states: dict[str, Any]) -> dict[str, Any]:
    return {
        k: [t.detach().clone() for t in v] if isinstance(v, list) else v.detach().clone() for k, v in states.items()
    }


def restore_torchmetrics(pl_module: torch.nn.Module, saved: dict[str, Any], skip: Iterable[str] = ()) -> list[str]:
    """Put the saved states back into the module's torchmetrics objects (but those in ``skip``);
    returns the saved names that no longer exist."""
    modules = {name: module for name, module in pl_module.named_modules() if isinstance(module, Metric)}
    gone = []
    skipped = set(skip)
    for name, entry in saved.items():
        if name in skipped:
            continue
        module = modules.get(name)
        if module is None:
            gone.append(name)
            continue
        for state, value in entry["states"].items():
            device = module.device
            setattr(module, state, [t.to(device) for t in value] if isinstance(value, list) else value.to(device))
        internals.set_metric_update_count(module, int(entry["update_count"]))
    return gone


class LoggedValueMerge:
    """Adds the saved accumulations to Lightning's accumulators once the resumed epoch created them.

    A logged name's accumulator exists only after its first ``self.log`` in this process, so the
    merge runs at each training batch end until every saved name was merged (normally once, after
    the first resumed batch); the epoch's aggregate is then that of the uninterrupted run.
    """

    def __init__(self, saved: dict[str, Any]) -> None:
        self.pending = dict(saved)

    def __bool__(self) -> bool:
        return bool(self.pending)

    def merge(self, trainer: Any) -> None:
        results = internals.training_results(trainer)
        for key in [k for k in self.pending if k in results]:
            entry = self.pending.pop(key)
            accumulated = results[key]
            value = entry["value"].to(accumulated.value.device, accumulated.value.dtype)
            reduction = entry["reduction"]
            if reduction == "mean":
                accumulated.value = accumulated.value + value
                saved_count = entry["cumulated_batch_size"].to(accumulated.cumulated_batch_size.device)
                accumulated.cumulated_batch_size = accumulated.cumulated_batch_size + saved_count
            elif reduction == "sum":
                accumulated.value = accumulated.value + value
            elif reduction == "max":
                accumulated.value = torch.maximum(accumulated.value, value)
            else:
                accumulated.value = torch.minimum(accumulated.value, value)
            internals.forget_computed(accumulated)
