"""The named components a checkpoint holds: one registry, from which every manifest's
``components`` and ``missing`` lists are derived.

Each component says who holds it (rank 0's shared file, or every rank's own file), how a dumped
Lightning checkpoint shows it, and when a recovery point of this run needs it. Adding one (a
stream's position, a snapshot tier) is one class here and its entry in :data:`COMPONENTS`; the
commit, the manifest and ``field ckpt inspect`` follow.
"""

from __future__ import annotations

from typing import Any, ClassVar

import lightning.pytorch as pl

from lightning_field.compat import lightning as internals


class Component:
    """One part of a checkpoint. ``present`` reads a dumped Lightning checkpoint; ``required`` says
    whether an exact continuation of ``trainer``'s run needs it."""

    name: ClassVar[str]
    per_rank: ClassVar[bool] = False
    """Held in every rank's own file (captured by the rank-state tracker), not rank 0's shared one."""

    def present(self, checkpoint: dict[str, Any], trainer: pl.Trainer) -> bool:
        return False

    def required(self, trainer: pl.Trainer) -> bool:
        return False


class Model(Component):
    name = "model"

    def present(self, checkpoint: dict[str, Any], trainer: pl.Trainer) -> bool:
        return "state_dict" in checkpoint

    def required(self, trainer: pl.Trainer) -> bool:
        return True


class Optimizer(Component):
    name = "optimizer"

    def present(self, checkpoint: dict[str, Any], trainer: pl.Trainer) -> bool:
        return bool(checkpoint.get("optimizer_states"))

    def required(self, trainer: pl.Trainer) -> bool:
        return bool(trainer.optimizers)


class Schedulers(Component):
    name = "lr_schedulers"

    def present(self, checkpoint: dict[str, Any], trainer: pl.Trainer) -> bool:
        return bool(checkpoint.get("lr_schedulers"))

    def required(self, trainer: pl.Trainer) -> bool:
        return bool(trainer.lr_scheduler_configs)


class Precision(Component):
    """The precision plugin's state: the AMP grad scaler's scale and growth tracker."""

    name = "precision"

    def present(self, checkpoint: dict[str, Any], trainer: pl.Trainer) -> bool:
        return trainer.precision_plugin.__class__.__qualname__ in checkpoint

    def required(self, trainer: pl.Trainer) -> bool:
        return bool(trainer.precision_plugin.state_dict())


class Loops(Component):
    """The fit loop's progress: epoch, batch and optimizer-step counters, and the loaders' state."""

    name = "loops"

    def present(self, checkpoint: dict[str, Any], trainer: pl.Trainer) -> bool:
        return "loops" in checkpoint

    def required(self, trainer: pl.Trainer) -> bool:
        return True


class Callbacks(Component):
    name = "callbacks"

    def present(self, checkpoint: dict[str, Any], trainer: pl.Trainer) -> bool:
        return "callbacks" in checkpoint

    def required(self, trainer: pl.Trainer) -> bool:
        return True


class DataModule(Component):
    name = "datamodule"

    def present(self, checkpoint: dict[str, Any], trainer: pl.Trainer) -> bool:
        datamodule = internals.trainer_datamodule(trainer)
        return datamodule is not None and datamodule.__class__.__qualname__ in checkpoint


class Hparams(Component):
    name = "hparams"

    def present(self, checkpoint: dict[str, Any], trainer: pl.Trainer) -> bool:
        return "hyper_parameters" in checkpoint


class Rng(Component):
    """Every RNG stream of the rank (Python, NumPy, torch, CUDA, named generators, loader workers)."""

    name = "rng"
    per_rank = True


class DataPosition(Component):
    """Where the rank's loaders are in their epoch, beyond what the loop's state holds."""

    name = "data_position"
    per_rank = True


COMPONENTS: tuple[Component, ...] = (
    Model(),
    Optimizer(),
    Schedulers(),
    Precision(),
    Loops(),
    Callbacks(),
    DataModule(),
    Hparams(),
    Rng(),
    DataPosition(),
)
"""Every component a Lightning checkpoint can hold, in the order manifests list them."""

RANK_COMPONENTS: tuple[str, ...] = tuple(c.name for c in COMPONENTS if c.per_rank)
"""The components every rank holds its own of, in its rank file."""

WEIGHTS_ONLY_MISSING = (
    "optimizer, schedulers and callback state (save_weights_only=True makes an export, not a recovery point)"
)


def present_components(checkpoint: dict[str, Any], trainer: pl.Trainer) -> list[str]:
    """The shared (rank 0) components found in a dumped Lightning checkpoint."""
    return [c.name for c in COMPONENTS if not c.per_rank and c.present(checkpoint, trainer)]


def missing_components(
    checkpoint: dict[str, Any], trainer: pl.Trainer, present: list[str], weights_only: bool
) -> list[str]:
    """The shared components this run's recovery point needs and ``checkpoint`` lacks: optimizer,
    schedulers and scaler only when the run has them."""
    if weights_only:
        return [WEIGHTS_ONLY_MISSING]
    return [c.name for c in COMPONENTS if not c.per_rank and c.required(trainer) and c.name not in present]
