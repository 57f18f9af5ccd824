"""The Lightning side of a save: what a dumped Lightning checkpoint holds, and the
:class:`~lightning_field.checkpoint.commit.SaveJob` the Lightning-free commit gets from it.

The named components are one registry, from which every manifest's ``components`` and ``missing``
lists are derived. Each component says who holds it (rank 0's shared file, or every rank's own
file), how a dumped Lightning checkpoint shows it, and when a recovery point of this run needs it.
Adding one (a stream's position, a snapshot tier) is one class here and its entry in
:data:`COMPONENTS`; the commit, the manifest and ``field ckpt inspect`` follow.

The strategies a save supports are decided here too: under ``ModelParallelStrategy`` the model and
optimizer are DTensor shards that go through DCP (:mod:`~lightning_field.checkpoint.sharded`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import lightning.pytorch as pl
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy, SingleDeviceStrategy

from lightning_field.checkpoint import sharded
from lightning_field.checkpoint.commit import SaveJob
from lightning_field.checkpoint.stores import CheckpointWriter
from lightning_field.compat import lightning as internals
from lightning_field.core.manifest import (
    RANK_COMPONENTS,
    SHARED_STATE_FILE,
    Provenance,
    SnapshotIntervalRecord,
    rank_state_file,
)
from lightning_field.core.storage import Location


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
"""Every component a Lightning checkpoint can hold, in the order manifests list them; the per-rank
ones are the manifest's :data:`~lightning_field.core.manifest.RANK_COMPONENTS`, in its order."""

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


def is_sharded(strategy: Any) -> bool:
    """Whether ``strategy`` holds DTensor-sharded model and optimizer state that DCP must write."""
    return isinstance(strategy, ModelParallelStrategy)


def check_strategy(strategy: Any) -> bool:
    """Whether ``strategy`` is sharded (its saves go through DCP), once it is known to be supported.

    Raises:
        NotImplementedError: a strategy other than single-device, DDP or ModelParallel, or a
            sharded configuration this path does not handle.
    """
    if is_sharded(strategy):
        _check_sharded_supported(strategy)
        return True
    if not isinstance(strategy, (SingleDeviceStrategy, DDPStrategy)):
        raise NotImplementedError(
            f"ManifestCheckpoint supports single-device, DDP and ModelParallel strategies;"
            f" {type(strategy).__name__} (FSDP, DeepSpeed) is not supported yet. For sharded state"
            " use ModelParallelStrategy with torch's fully_shard, whose checkpoints go through DCP."
        )
    return False


def _check_sharded_supported(strategy: Any) -> None:
    """Refuse, by name, the sharded configurations this path does not handle."""
    name = type(strategy).__name__
    if not getattr(strategy, "_save_distributed_checkpoint", True):
        raise NotImplementedError(
            f"ManifestCheckpoint with {name}(save_distributed_checkpoint=False) is not supported: it gathers the"
            " full state on rank 0. Keep the default save_distributed_checkpoint=True (sharded DCP checkpoints)."
        )


def capture_job(
    trainer: pl.Trainer,
    final: Location,
    start: float,
    *,
    store: CheckpointWriter,
    checkpoint: dict[str, Any],
    rank_state: dict[str, Any],
    rank_missing: list[str],
    weights_only: bool,
    provenance: Provenance,
    snapshot_interval: SnapshotIntervalRecord | None = None,
) -> SaveJob:
    """This rank's part of a save, from Lightning's dumped ``checkpoint`` and its own
    ``rank_state``: every rank writes its rank file; rank 0 also the shared state, whose
    components it lists; under a sharding strategy the model and optimizer go through DCP."""
    rank = trainer.global_rank
    files: dict[str, tuple[Any, list[str]]] = {rank_state_file(rank): (rank_state, list(RANK_COMPONENTS))}
    shared_components: list[str] = []
    shared_missing: list[str] = []
    if trainer.is_global_zero:
        shared_components = present_components(checkpoint, trainer)
        shared_missing = missing_components(checkpoint, trainer, shared_components, weights_only)
    shards = None
    shared_file = SHARED_STATE_FILE
    if is_sharded(trainer.strategy):
        # Every rank holds its own shards of the model and optimizer: they go through DCP.
        shards = sharded.split_state(checkpoint)
        shared_file = sharded.SHARDED_SHARED_FILE
        shared_components = [c for c in shared_components if c not in sharded.DCP_COMPONENTS]
    if trainer.is_global_zero:
        files[shared_file] = (checkpoint, shared_components)
    return SaveJob(
        final=final,
        store=store,
        rank=rank,
        is_global_zero=trainer.is_global_zero,
        step=trainer.global_step,
        epoch=trainer.current_epoch,
        world_size=trainer.world_size,
        files=files,
        rank_missing=rank_missing,
        data_restore=list(rank_state["data_position"]["restore"]),
        stream_positions=list(rank_state["data_position"].get("stream_positions", [])),
        shared_components=shared_components,
        shared_missing=shared_missing,
        start=start,
        kind="export" if weights_only else "recovery",
        provenance=provenance,
        shared_file=shared_file,
        shards=shards,
        model_state=shards["state_dict"] if shards is not None else checkpoint.get("state_dict", {}),
        snapshot_interval=snapshot_interval,
    )
