"""Every place lightning_field reaches into Lightning's private internals, behind one import.

Exact resume needs a hook immediately before each training fetch (time accounting one after it
too), the train loaders before their first iteration, and corrections for Lightning 2.6's restore
quirks. Keeping all of them under ``compat/`` makes the dependency on private names visible and
reviewable. This module holds the checkpoint, strategy and module accessors and re-exports the rest,
one module per concern: ``lightning_range`` (the tested releases, refused otherwise at import),
``lightning_loops`` (fit-loop, loader and restore-quirk internals), ``lightning_fetcher`` (the batch
fetched ahead of the one trained), ``lightning_metrics`` (logging
state) and ``lightning_samplers`` (the sampler wrapper's epoch order). Import every accessor from here.
``lightning_checkpoint`` lists the private ``ModelCheckpoint`` members the callback subclass overrides
and reads (they are reached through ``self``, so they cannot be accessors).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from lightning_field.compat.lightning_range import TESTED_LIGHTNING, unsupported_lightning

# isort: split
import lightning.pytorch as pl
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.fabric.strategies.model_parallel import _load_checkpoint
from lightning.pytorch.callbacks import ModelCheckpoint, Timer

from lightning_field.compat.lightning_fetcher import (
    batches_fetched_ahead,
    fetches_ahead,
    loaders_in_use,
    reopen_finished_epoch,
    saved_loaders,
    set_saved_loader_states,
    successful_fetches,
    train_loaders_built_for,
)
from lightning_field.compat.lightning_loops import (
    MARK,
    accumulating,
    can_stop_early,
    forget_loader_states,
    forget_validation_rerun,
    install_before_fetch,
    install_fetch_hook,
    is_last_batch_of_epoch,
    iter_loaders,
    let_resumed_epoch_step_schedulers,
    max_epochs_reached,
    patch_train_loaders,
    rebuild_resumed_iterator,
    replay_resumed_epoch_start,
    rerun_validation_skipped_on_resume,
    restore_callback_metrics,
    resume_as_next_epoch,
    start_next_epoch_iterator,
    step_plateau_schedulers_missed_at_epoch_end,
    unapplied_loader_states,
    undo_epoch_end_double_count,
)
from lightning_field.compat.lightning_metrics import (
    callback_metrics,
    convert_params,
    forget_computed,
    metric_update_count,
    result_reduction,
    set_metric_update_count,
    training_results,
    validation_results,
)
from lightning_field.compat.lightning_progress import rewind_progress, step_progress
from lightning_field.compat.lightning_samplers import (
    set_wrapped_sampler_order,
    wrapped_sampler_datasets,
    wrapped_sampler_order,
)
from lightning_field.core.storage import Location, as_location

__all__ = [
    "TESTED_LIGHTNING",
    "accumulating",
    "batches_fetched_ahead",
    "callback_metrics",
    "can_stop_early",
    "checkpoint_dir",
    "convert_params",
    "detached_trainer",
    "dump_checkpoint",
    "epochs_processed",
    "fetches_ahead",
    "forget_computed",
    "forget_loader_states",
    "forget_validation_rerun",
    "has_ddp_comm_hook",
    "hide_no_last_checkpoint_hint",
    "install_before_fetch",
    "install_fetch_hook",
    "is_last_batch_of_epoch",
    "iter_loaders",
    "let_resumed_epoch_step_schedulers",
    "load_sharded_from",
    "loaders_in_use",
    "max_epochs_reached",
    "metric_update_count",
    "patch_train_loaders",
    "rebuild_resumed_iterator",
    "reopen_finished_epoch",
    "replay_resumed_epoch_start",
    "rerun_validation_skipped_on_resume",
    "restore_callback_metrics",
    "result_reduction",
    "resume_as_next_epoch",
    "rewind_progress",
    "saved_loaders",
    "set_metric_update_count",
    "set_saved_loader_states",
    "set_trainer_callbacks",
    "set_wrapped_sampler_order",
    "should_save_on_exception",
    "slurm_requeue_signal",
    "start_next_epoch_iterator",
    "start_process_group_early",
    "step_plateau_schedulers_missed_at_epoch_end",
    "step_progress",
    "successful_fetches",
    "timer_limit_seconds",
    "train_loaders_built_for",
    "trainer_callbacks",
    "trainer_datamodule",
    "training_results",
    "unapplied_loader_states",
    "undo_epoch_end_double_count",
    "unsupported_lightning",
    "val_check_interval",
    "validation_results",
    "wrap_strategy_load",
    "wrapped_sampler_datasets",
    "wrapped_sampler_order",
]


def dump_checkpoint(trainer: pl.Trainer, weights_only: bool) -> dict[str, Any]:
    """The checkpoint dict ``trainer.save_checkpoint`` would write, built on every rank."""
    return trainer._checkpoint_connector.dump_checkpoint(weights_only)


def should_save_on_exception(callback: ModelCheckpoint, trainer: pl.Trainer) -> bool:
    """ModelCheckpoint's own test for its ``save_on_exception`` save (``_should_save_on_exception``: asked
    for, not a fast_dev_run or sanity check, this step not saved yet)."""
    return bool(callback._should_save_on_exception(trainer))


def checkpoint_dir(callback: ModelCheckpoint, trainer: pl.Trainer) -> Location:
    """Where ``callback`` saves, resolvable before ``setup`` (as ``ckpt_path="last"`` needs)."""
    # Name-mangled private method: mypy does not model the mangling.
    return as_location(callback._ModelCheckpoint__resolve_ckpt_dir(trainer))  # type: ignore[attr-defined]  # mangled


def wrap_strategy_load(strategy: Any, hook: Callable[..., dict[str, Any]]) -> None:
    """Route ``strategy.load_checkpoint(path, weights_only=...)`` through ``hook(original, path,
    weights_only)``: sharding strategies load without the CheckpointIO, so verification has to sit
    in front of their own loader. Idempotent per strategy instance."""
    current = strategy.load_checkpoint
    if getattr(current, MARK, False):
        return
    original = current

    def load_checkpoint(checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        return hook(original, checkpoint_path, weights_only)

    setattr(load_checkpoint, MARK, True)
    strategy.load_checkpoint = load_checkpoint


SAVE_INTERCEPTORS = "_lightning_field_save_interceptors"


def intercept_strategy_save(strategy: Any, interceptor: Callable[[dict[str, Any]], bool]) -> None:
    """Offer ``interceptor`` the checkpoint dict ``Trainer.save_checkpoint`` hands ``strategy.save_checkpoint``,
    on every rank, before the strategy writes it: where it returns True (a save of ManifestCheckpoint's
    own, which commits the dict itself) the strategy writes nothing; otherwise it saves as it would.

    Works around: ``Strategy.save_checkpoint`` writes through the CheckpointIO on global rank 0 only, and
    the commit needs the dict on every rank. Routing each save through ``Trainer.save_checkpoint`` is
    what lets a user's override of it (or a test's mock) see every save, as with ModelCheckpoint.
    Installed once per strategy instance; several callbacks share it (:func:`release_strategy_save`)."""
    current = strategy.save_checkpoint
    interceptors: list[Callable[[dict[str, Any]], bool]] | None = getattr(current, SAVE_INTERCEPTORS, None)
    if interceptors is None:
        original, interceptors = current, []
        offered = interceptors

        def save_checkpoint(checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
            if any(take(checkpoint) for take in list(offered)):
                return
            original(checkpoint, filepath, storage_options=storage_options)

        setattr(save_checkpoint, SAVE_INTERCEPTORS, interceptors)
        save_checkpoint.__wrapped__ = original  # type: ignore[attr-defined]
        strategy.save_checkpoint = save_checkpoint
    if interceptor not in interceptors:
        interceptors.append(interceptor)


def release_strategy_save(strategy: Any, interceptor: Callable[[dict[str, Any]], bool]) -> None:
    """Undo :func:`intercept_strategy_save` for ``interceptor``; the strategy's own method is back once
    no interceptor is left (a spawned run pickles the strategy, which a closure cannot be)."""
    current = strategy.save_checkpoint
    interceptors = getattr(current, SAVE_INTERCEPTORS, None)
    if interceptors is None:
        return
    if interceptor in interceptors:
        interceptors.remove(interceptor)
    if not interceptors:
        strategy.save_checkpoint = current.__wrapped__


def load_sharded_from(strategy: Any, path: Any, weights_only: bool | None = None) -> dict[str, Any]:
    """``ModelParallelStrategy.load_checkpoint`` from this rank's own ``path``.

    Lightning's (2.6) first broadcasts rank 0's path, so every rank reads rank 0's directory. A
    sharded checkpoint under a URL is downloaded and verified into a private directory per rank,
    which does not exist on another node, and which rank 0 deletes once its own load is done: seen
    as rank 1's ``FileNotFoundError`` for ``meta.pt`` when rank 0 finished first. This is the
    strategy's own load (private ``lightning.fabric.strategies.model_parallel._load_checkpoint``)
    without that broadcast.
    """
    state = {
        "state_dict": strategy.model,
        **{f"optimizer_{idx}": optimizer for idx, optimizer in enumerate(strategy.optimizers)},
    }
    return _load_checkpoint(
        path=Path(path),
        state=state,
        strict=strategy.lightning_module.strict_loading,
        optimizer_states_from_list=True,
        weights_only=weights_only,
    )


def start_process_group_early(trainer: pl.Trainer) -> None:
    """Start the strategy's process group now, before ``fit`` resolves ``ckpt_path``.

    Lightning (2.6) resolves ``ckpt_path="last"`` (``_checkpoint_connector._select_ckpt_path``)
    before ``Trainer._run`` calls ``strategy.setup_environment()``; resolving over several nodes'
    snapshot directories needs the ranks to talk first. ``setup_environment`` is the strategy's own
    start (device, seed reset, ranks, ``init_process_group``); when ``_run`` calls it again,
    ``_init_dist_connection`` finds the group initialized and returns, and the seed is reset again
    as it would have been. No-op without a multi-process strategy or once a group exists.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return
    if getattr(trainer.strategy, "world_size", 1) > 1:
        trainer.strategy.setup_environment()


def hide_no_last_checkpoint_hint() -> Callable[[], None]:
    """Silence Lightning's hint for ``ckpt_path="last"`` with nothing to resume; returns the undo.

    Its "HINT: Set ``ModelCheckpoint(..., save_last=True)``" is wrong for ManifestCheckpoint, which
    resolves "last" by its manifests and has just said why there is nothing to resume. Lightning
    prints it right after the resolver returns; the filter is for that one message, and is removed
    again at the callback's setup, so it outlives neither this ``fit`` nor touches other warnings.
    """
    warnings.filterwarnings("ignore", message=r".*ckpt_path=\"last\"\) is set, but there is no last checkpoint")
    entry = warnings.filters[0]

    def undo() -> None:
        if entry in warnings.filters:
            warnings.filters.remove(entry)  # type: ignore[attr-defined]  # a list at runtime; typeshed says Sequence

    return undo


def slurm_requeue_signal(trainer: pl.Trainer) -> int | None:
    """The signal SLURM sends before the time limit when Lightning's auto-requeue is on, or None.

    Lightning keeps the cluster environment on the private accelerator connector (a single-device
    strategy has none of its own). ManifestCheckpoint's handler replaces Lightning's SIGUSR1 one,
    which would save a second, unverified ``hpc_ckpt`` and requeue, so the requeue is done here.
    """
    environment = getattr(getattr(trainer, "_accelerator_connector", None), "cluster_environment", None)
    if isinstance(environment, SLURMEnvironment) and environment.auto_requeue:
        return int(environment.requeue_signal) if environment.requeue_signal is not None else None
    return None


def has_ddp_comm_hook(strategy: Any) -> bool:
    """Whether a DDPStrategy was given a communication hook (``DDPStrategy._ddp_comm_hook``): the
    straggler monitor times the default all-reduce only where nothing else is registered."""
    return strategy._ddp_comm_hook is not None


@contextlib.contextmanager
def detached_trainer(model: pl.LightningModule) -> Iterator[None]:
    """The module without its Trainer reference (``LightningModule._trainer``) for the duration, so
    that ``copy.deepcopy`` copies the model and not the whole loop, loggers and data."""
    trainer = model._trainer
    model._trainer = None
    try:
        yield
    finally:
        model._trainer = trainer


def trainer_callbacks(trainer: pl.Trainer) -> list[pl.Callback]:
    """``trainer.callbacks``: public API, but assigned by Lightning 2.6's callback connector and not
    declared on ``Trainer``, so a type checker does not see it."""
    return trainer.callbacks  # type: ignore[attr-defined]  # assigned by the callback connector


def set_trainer_callbacks(trainer: pl.Trainer, callbacks: list[pl.Callback]) -> None:
    """Replace ``trainer.callbacks`` with a new list (as the callback connector itself does)."""
    trainer.callbacks = callbacks  # type: ignore[attr-defined]  # assigned by the callback connector


def trainer_datamodule(trainer: pl.Trainer) -> pl.LightningDataModule | None:
    """``trainer.datamodule``: public API, but assigned by Lightning 2.6's data connector and not
    declared on ``Trainer``, so a type checker does not see it."""
    return trainer.datamodule  # type: ignore[attr-defined]  # assigned by the data connector


def epochs_processed(trainer: pl.Trainer) -> int:
    """The epochs this fit has finished training, as ``max_epochs`` counts them
    (``FitLoop.epoch_progress.current.processed``): the stop points record it, so a rerun knows
    whether its ``max_epochs`` is already reached before any loop state is restored."""
    progress = trainer.fit_loop.epoch_progress.current  # a _ProcessedTracker for the fit loop's epochs
    return int(progress.processed)  # type: ignore[attr-defined]  # declared as its base, _ReadyCompletedTracker


def timer_limit_seconds(timer: Timer) -> float | None:
    """A ``Timer``'s limit in seconds (``Timer._duration``; ``Trainer(max_time=...)`` adds one), None
    without one: public only as ``time_remaining()``, which depends on its restored state, and a
    rerun is judged against the limit before that state is loaded."""
    return timer._duration


def val_check_interval(trainer: pl.Trainer) -> int | float | dict[str, float]:
    """``Trainer(val_check_interval=...)`` as it was given: a batch count or an epoch fraction
    (``trainer.val_check_interval``), or a duration as ``{"seconds": s}``: Lightning 2.6 then keeps
    it as ``Trainer._val_check_time_interval`` and leaves ``val_check_interval`` unset."""
    seconds = getattr(trainer, "_val_check_time_interval", None)
    if seconds is not None:
        return {"seconds": float(seconds)}
    return trainer.val_check_interval
