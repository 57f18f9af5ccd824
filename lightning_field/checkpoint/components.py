"""Which parts of the Lightning state a checkpoint holds, and which a recovery point requires."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from lightning_field.compat import lightning as internals


def present_components(checkpoint: dict[str, Any], trainer: pl.Trainer) -> list[str]:
    """The shared (rank 0) components found in a dumped Lightning checkpoint."""
    present = []
    if "state_dict" in checkpoint:
        present.append("model")
    if checkpoint.get("optimizer_states"):
        present.append("optimizer")
    if checkpoint.get("lr_schedulers"):
        present.append("lr_schedulers")
    if trainer.precision_plugin.__class__.__qualname__ in checkpoint:
        present.append("precision")
    if "loops" in checkpoint:
        present.append("loops")
    if "callbacks" in checkpoint:
        present.append("callbacks")
    datamodule = internals.trainer_datamodule(trainer)
    if datamodule is not None and datamodule.__class__.__qualname__ in checkpoint:
        present.append("datamodule")
    if "hyper_parameters" in checkpoint:
        present.append("hparams")
    return present


def missing_components(
    checkpoint: dict[str, Any], trainer: pl.Trainer, present: list[str], weights_only: bool
) -> list[str]:
    """Required shared components that are absent: optimizer, schedulers and scaler only when the run has them."""
    required = ["model", "loops"]
    if weights_only:
        return [
            "optimizer, schedulers and callback state (save_weights_only=True makes an export, not a recovery point)"
        ]
    required.append("callbacks")
    if trainer.optimizers:
        required.append("optimizer")
    if trainer.lr_scheduler_configs:
        required.append("lr_schedulers")
    if trainer.precision_plugin.state_dict():
        required.append("precision")
    return [name for name in required if name not in present]
