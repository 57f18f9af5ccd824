"""Lightning's and torchmetrics' private logging state that the epoch-metric resume restores.

Lightning saves none of the running accumulators of ``self.log`` in a checkpoint, nor a logged
torchmetrics object's update count; these accessors read and put them back. Import them from
``lightning_field.compat.lightning``.
"""

from __future__ import annotations

from typing import Any

from lightning_field.compat import lightning_range  # noqa: F401  refuses an untested Lightning first

# isort: split
import lightning.pytorch as pl
from lightning.fabric.utilities.logger import _convert_params


def training_results(trainer: pl.Trainer) -> dict[str, Any]:
    """The training loop's ``_ResultCollection``: the running accumulators of every ``self.log``
    made while training (Lightning saves none of them in a checkpoint)."""
    return trainer.fit_loop.epoch_loop._results


def validation_results(trainer: pl.Trainer) -> dict[str, Any]:
    """The fit loop's validation ``_ResultCollection``: what ``self.log`` recorded in validation."""
    return trainer.fit_loop.epoch_loop.val_loop._results


def result_reduction(accumulated: Any) -> str | None:
    """How a logged value accumulates over the epoch (``"mean"``, ``"sum"``, ``"max"``, ``"min"``),
    or None for a logged torchmetrics object (its states live in the object) and custom reductions."""
    if not accumulated.is_tensor:
        return None
    meta = accumulated.meta
    for name in ("mean", "sum", "max", "min"):
        if getattr(meta, f"is_{name}_reduction"):
            return name
    return None


def forget_computed(metric: Any) -> None:
    """Drop a torchmetrics object's cached ``compute()`` result after its states were changed."""
    metric._computed = None


def metric_update_count(metric: Any) -> int:
    """How many updates a torchmetrics object has seen (``compute`` warns when it is zero)."""
    return int(metric._update_count)


def set_metric_update_count(metric: Any, count: int) -> None:
    metric._update_count = count
    metric._computed = None


def callback_metrics(trainer: pl.Trainer) -> dict[str, Any]:
    """The metrics monitors read (``trainer.callback_metrics``), as host copies."""
    return {k: v.detach().cpu().clone() for k, v in trainer.callback_metrics.items() if hasattr(v, "detach")}


def convert_params(params: Any) -> dict[str, Any]:
    """Lightning's own hyperparameter flattening for loggers (``lightning.fabric.utilities.logger._convert_params``),
    so a config logged by us reads exactly like one WandbLogger logs."""
    return _convert_params(params)
