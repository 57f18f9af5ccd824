"""Every place lightning_field reaches into Lightning's private loop and data internals.

Exact resume needs a hook immediately before each training fetch (time accounting one after it
too), the train loaders before their first iteration, and corrections for two Lightning 2.6
restore quirks. Keeping all of them in this one module makes the dependency on private names
visible and reviewable; the end-to-end tests in ``tests/test_exact_resume.py`` pin the behaviour
they rely on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_field.core.storage import Location, as_location
from lightning_field.state.data_position import needs_replay, replaying_sampler_state, stale_epoch_samplers
from lightning_field.state.rng import WorkerRngCapture

_MARK = "_lightning_field"


def dump_checkpoint(trainer: pl.Trainer, weights_only: bool) -> dict[str, Any]:
    """The checkpoint dict ``trainer.save_checkpoint`` would write, built on every rank."""
    return trainer._checkpoint_connector.dump_checkpoint(weights_only)


def checkpoint_dir(callback: ModelCheckpoint, trainer: pl.Trainer) -> Location:
    """Where ``callback`` saves, resolvable before ``setup`` (as ``ckpt_path="last"`` needs)."""
    return as_location(callback._ModelCheckpoint__resolve_ckpt_dir(trainer))  # type: ignore[attr-defined]


def wrap_strategy_load(strategy: Any, hook: Callable[..., dict[str, Any]]) -> None:
    """Route ``strategy.load_checkpoint(path, weights_only=...)`` through ``hook(original, path,
    weights_only)``: sharding strategies load without the CheckpointIO, so verification has to sit
    in front of their own loader. Idempotent per strategy instance."""
    current = strategy.load_checkpoint
    if getattr(current, _MARK, False):
        return
    original = current

    def load_checkpoint(checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        return hook(original, checkpoint_path, weights_only)

    setattr(load_checkpoint, _MARK, True)
    strategy.load_checkpoint = load_checkpoint


def is_last_batch_of_epoch(trainer: pl.Trainer) -> bool:
    return bool(trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)


def install_fetch_hook(trainer: pl.Trainer, when: str, hook: Callable[[], None]) -> bool:
    """Call ``hook`` right before (``when="before"``) or after (``"after"``) every training batch
    fetch; False if this Lightning version offers no such point.

    Lightning calls the epoch loop's ``_on_before_fetch``/``_on_after_fetch`` around ``next()`` on
    the train data and re-wires them every epoch from the instance, so wrapping them on the instance
    persists. One wrapper per point holds every registered hook, so several callbacks can share it.
    """
    name = {"before": "_on_before_fetch", "after": "_on_after_fetch"}[when]
    epoch_loop = trainer.fit_loop.epoch_loop
    current = getattr(epoch_loop, name, None)
    if current is None:
        return False
    hooks: list[Callable[[], None]] | None = getattr(current, _MARK, None)
    if hooks is None:
        original = current
        hooks = []

        def run_hooks() -> None:
            if when == "before":
                for registered in hooks:
                    registered()
            original()
            if when == "after":
                for registered in hooks:
                    registered()

        setattr(run_hooks, _MARK, hooks)
        setattr(epoch_loop, name, run_hooks)
    if hook not in hooks:
        hooks.append(hook)
    return True


def install_before_fetch(trainer: pl.Trainer, hook: Callable[[], None]) -> bool:
    """Call ``hook`` immediately before every training batch is fetched; False if impossible."""
    return install_fetch_hook(trainer, "before", hook)


def patch_train_loaders(trainer: pl.Trainer) -> Callable[[], None] | None:
    """Give the train loaders resumable worker randomness (``WorkerRngCapture``) before first use.

    Workers start as soon as a loader is first iterated, before any callback hook, so the loader
    is patched as the data source hands it out. Returns a function that undoes the patch of the
    user's ``train_dataloader`` hook, if one was made.
    """
    source = trainer.fit_loop._data_source
    instance = getattr(source, "instance", None)
    if instance is None:
        return None
    if hasattr(instance, "worker_init_fn"):
        _patch_loader(instance)
        return None
    method = getattr(instance, source.name, None)
    if method is None or getattr(method, _MARK, False):
        return None

    def patched_train_dataloader() -> Any:
        loaders = method()
        for loader in iter_loaders(loaders):
            _patch_loader(loader)
        return loaders

    setattr(patched_train_dataloader, _MARK, True)
    setattr(instance, source.name, patched_train_dataloader)

    def undo() -> None:
        if source.name in vars(instance):
            delattr(instance, source.name)  # the user's own method shows through again

    return undo


def _patch_loader(loader: Any) -> None:
    if getattr(loader, "num_workers", 0) and not isinstance(loader.worker_init_fn, WorkerRngCapture):
        loader.worker_init_fn = WorkerRngCapture(loader.worker_init_fn)


def undo_epoch_end_double_count(trainer: pl.Trainer) -> None:
    """Compensate Lightning 2.6 counting a restored, already-processed epoch as processed twice.

    Resuming from a checkpoint taken at ``on_train_epoch_end``, the fit loop replays that epoch's
    end and increments ``processed`` again, so every later ``set_epoch`` is one ahead of the
    uninterrupted run and an epoch-seeded sampler (DistributedSampler) shuffles differently.
    """
    fit_loop = trainer.fit_loop
    progress = fit_loop.epoch_progress
    if fit_loop.restarted_on_epoch_end and progress.total.processed == progress.total.started:
        progress.total.processed -= 1
        progress.current.processed -= 1


def rebuild_resumed_iterator(
    trainer: pl.Trainer, loader_states: list[Any], sampler_state: list[dict[str, Any]]
) -> None:
    """Rebuild the resumed train iterator so it continues the uninterrupted run's order.

    Lightning creates the resumed iterator before it calls ``set_epoch``, and a sampler wrapped by
    Lightning's ``DistributedSamplerWrapper`` is not restored by the loader at all. So the epoch is
    set, the saved epoch order is replayed, the loader's saved position applied again and the
    iterator rebuilt.
    """
    fit_loop = trainer.fit_loop
    combined = fit_loop._combined_loader
    if not loader_states or combined is None or fit_loop._data_fetcher is None:
        return
    loaders = list(combined.flattened)
    stale = stale_epoch_samplers(loaders, trainer.current_epoch)
    if not stale and not needs_replay(sampler_state):
        return
    for sampler in stale:
        sampler.set_epoch(trainer.current_epoch)
    with replaying_sampler_state(loaders, sampler_state):
        combined._load_state_dicts(loader_states)
        iter(fit_loop._data_fetcher)


def iter_loaders(loaders: Any) -> Iterable[Any]:
    if loaders is None:
        return
    flattened = getattr(loaders, "flattened", None)
    if flattened is not None:
        yield from flattened
    elif isinstance(loaders, Mapping):
        for value in loaders.values():
            yield from iter_loaders(value)
    elif isinstance(loaders, (list, tuple)):
        for value in loaders:
            yield from iter_loaders(value)
    else:
        yield loaders
