"""Every place lightning_field reaches into Lightning's private loop, data and checkpoint internals.

Exact resume needs a hook immediately before each training fetch (time accounting one after it
too), the train loaders before their first iteration, and corrections for two Lightning 2.6
restore quirks. Keeping all of them in this one module makes the dependency on private names
visible and reviewable; the end-to-end tests in ``tests/test_exact_resume.py`` pin the behaviour
they rely on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loops.loop import _Loop

from lightning_field.core.storage import Location, as_location
from lightning_field.state.data_position import needs_replay, replaying_sampler_state, stale_epoch_samplers
from lightning_field.state.loaders import Adoption, adopt_loaders
from lightning_field.state.rng import WorkerRngCapture

_MARK = "_lightning_field"

TESTED_LIGHTNING = ">=2.6,<2.7"
"""The Lightning releases every workaround in this module was written against and tested with
(``pyproject.toml`` pins the same range). A newer release may move a private name or fix a quirk
this module corrects twice, and exact resume would break silently, so it is refused at import."""


def unsupported_lightning(version: str, tested: str = TESTED_LIGHTNING) -> str | None:
    """Why ``version`` of Lightning cannot be used (None when it is in the tested range)."""
    from packaging.specifiers import SpecifierSet

    if SpecifierSet(tested).contains(version, prereleases=True):
        return None
    return (
        f"lightning_field is tested with Lightning {tested} and reaches into its private loop and"
        f" checkpoint internals (lightning_field/compat/lightning.py); Lightning {version} is"
        " installed. Install a tested release (pip install 'lightning" + tested + "') or a"
        " lightning_field release that supports yours."
    )


_problem = unsupported_lightning(pl.__version__)
if _problem is not None:
    raise ImportError(_problem)


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


def patch_train_loaders(trainer: pl.Trainer, on_adopted: Callable[[list[Adoption]], None]) -> Callable[[], None] | None:
    """Make the train loaders resumable before their first use: plain DataLoaders are re-created as
    StatefulDataLoaders (``adopt_loaders``) and loaders with workers get resumable worker randomness
    (``WorkerRngCapture``). ``on_adopted`` hears what happened to each loader, every time the
    loaders are handed out.

    Workers start as soon as a loader is first iterated, before any callback hook, and a loader
    may be requested before the restore (``estimated_stepping_batches`` in
    ``configure_optimizers``), so the loaders are replaced where the data source hands them out:
    the module's or datamodule's ``train_dataloader`` hook is wrapped on the instance (inside
    Lightning's request, so Lightning records the new loader's arguments and can re-create it
    with a DistributedSampler as it does the user's), or the loaders given to ``fit`` are swapped.
    Returns a function that undoes the patch.
    """
    source = trainer.fit_loop._data_source
    instance = getattr(source, "instance", None)
    if instance is None:
        return None

    def adopted(loaders: Any) -> Any:
        loaders, adoptions = adopt_loaders(loaders)
        for loader in iter_loaders(loaders):
            _patch_loader(loader)
        on_adopted(adoptions)
        return loaders

    if not source.is_module():
        source.instance = adopted(instance)

        def restore_given() -> None:
            source.instance = instance

        return restore_given
    method = getattr(instance, source.name, None)
    if method is None or getattr(method, _MARK, False):
        return None

    def patched_train_dataloader() -> Any:
        return adopted(method())

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
    trainer: pl.Trainer, loader_states: list[Any], sampler_state: list[dict[str, Any]], force: bool = False
) -> None:
    """Rebuild the resumed train iterator so it continues the uninterrupted run's order.

    Lightning creates the resumed iterator before it calls ``set_epoch``, and a sampler wrapped by
    Lightning's ``DistributedSamplerWrapper`` is not restored by the loader at all. So the epoch is
    set, the saved epoch order is replayed, the loader's saved position applied again and the
    iterator rebuilt. ``force`` rebuilds it even then: Lightning never applied the saved position.
    """
    fit_loop = trainer.fit_loop
    combined = fit_loop._combined_loader
    if not loader_states or combined is None or fit_loop._data_fetcher is None:
        return
    loaders = list(combined.flattened)
    stale = stale_epoch_samplers(loaders, trainer.current_epoch)
    if not stale and not needs_replay(sampler_state) and not force:
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


def training_results(trainer: pl.Trainer) -> dict[str, Any]:
    """The training loop's ``_ResultCollection``: the running accumulators of every ``self.log``
    made while training (Lightning saves none of them in a checkpoint)."""
    return trainer.fit_loop.epoch_loop._results


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


def unapplied_loader_states(trainer: pl.Trainer) -> bool:
    """Whether Lightning restored loader positions it never applied.

    Lightning applies them only while building the train loader during the resume. A loader built
    earlier (``estimated_stepping_batches`` in ``configure_optimizers`` builds it before the
    checkpoint is restored) is not built again, and the saved position would be silently dropped.
    """
    return bool(trainer.fit_loop._combined_loader_states_to_load)


def forget_loader_states(trainer: pl.Trainer) -> None:
    trainer.fit_loop._combined_loader_states_to_load = []


def let_resumed_epoch_step_schedulers(trainer: pl.Trainer) -> None:
    """Let Lightning step the epoch-interval LR schedulers at the end of the first resumed epoch.

    Lightning 2.6 keeps ``fit_loop.restarting`` set through the whole first epoch of a resume, and
    ``on_advance_end`` skips every epoch-interval scheduler step (``ReduceLROnPlateau`` included)
    while it is set; the uninterrupted run stepped them there. Called from ``on_train_epoch_end``,
    which runs just before that check: nothing after it in the epoch reads the flag, and Lightning
    clears it itself when the iteration ends.
    """
    fit_loop = trainer.fit_loop
    if fit_loop.restarting:
        # The base setter: the fit loop's own re-derives True for step-based runs (max_steps set).
        _Loop.restarting.fset(fit_loop, False)


def start_next_epoch_iterator(trainer: pl.Trainer) -> None:
    """Build the train iterator of the epoch after a finished one, as the uninterrupted run does.

    Resuming from a checkpoint saved after an epoch's last batch, Lightning 2.6 keeps the iterator
    it built over the restored (exhausted) loader position for the next epoch: that epoch yields no
    batch and training ends one epoch short. The epoch is set on the samplers first, as the fit loop
    would before building it (a worker prefetches indices as soon as the iterator exists).
    """
    from lightning.fabric.utilities.data import _set_sampler_epoch

    fit_loop = trainer.fit_loop
    if fit_loop._combined_loader is None or fit_loop._data_fetcher is None:
        return
    for loader in fit_loop._combined_loader.flattened:
        _set_sampler_epoch(loader, fit_loop.epoch_progress.current.processed)
    iter(fit_loop._data_fetcher)


def callback_metrics(trainer: pl.Trainer) -> dict[str, Any]:
    """The metrics monitors read (``trainer.callback_metrics``), as host copies."""
    return {k: v.detach().cpu().clone() for k, v in trainer.callback_metrics.items() if hasattr(v, "detach")}


def step_plateau_schedulers_missed_at_epoch_end(trainer: pl.Trainer, saved_metrics: dict[str, Any]) -> None:
    """Step the ``ReduceLROnPlateau`` schedulers the uninterrupted run stepped after the save.

    A checkpoint saved at an epoch's end holds the plateau schedulers before their step: Lightning
    steps them after every ``on_train_epoch_end`` hook, with that epoch's monitored value. Resuming
    from such a checkpoint, Lightning goes on with the next epoch and the step never happens. The
    monitored values are put back where Lightning's own step reads them, then that step is run
    (other schedulers were stepped with the epoch's last batch, before the save).
    """
    trainer._logger_connector._callback_metrics.update(saved_metrics)
    trainer.fit_loop.epoch_loop.update_lr_schedulers("epoch", update_plateau_schedulers=True)


def hide_no_last_checkpoint_hint() -> Callable[[], None]:
    """Silence Lightning's hint for ``ckpt_path="last"`` with nothing to resume; returns the undo.

    Its "HINT: Set ``ModelCheckpoint(..., save_last=True)``" is wrong for ManifestCheckpoint, which
    resolves "last" by its manifests and has just said why there is nothing to resume. Lightning
    prints it right after the resolver returns; the filter is for that one message, and is removed
    again at the callback's setup, so it outlives neither this ``fit`` nor touches other warnings.
    """
    import warnings

    warnings.filterwarnings("ignore", message=r".*ckpt_path=\"last\"\) is set, but there is no last checkpoint")
    entry = warnings.filters[0]

    def undo() -> None:
        if entry in warnings.filters:
            warnings.filters.remove(entry)

    return undo


def slurm_requeue_signal(trainer: pl.Trainer) -> int | None:
    """The signal SLURM sends before the time limit when Lightning's auto-requeue is on, or None.

    Lightning keeps the cluster environment on the private accelerator connector (a single-device
    strategy has none of its own). ManifestCheckpoint's handler replaces Lightning's SIGUSR1 one,
    which would save a second, unverified ``hpc_ckpt`` and requeue, so the requeue is done here.
    """
    from lightning.fabric.plugins.environments import SLURMEnvironment

    environment = getattr(getattr(trainer, "_accelerator_connector", None), "cluster_environment", None)
    if isinstance(environment, SLURMEnvironment) and environment.auto_requeue:
        return int(environment.requeue_signal) if environment.requeue_signal is not None else None
    return None


def resume_as_next_epoch(checkpoint: dict[str, Any]) -> None:
    """Rewrite the loop progress of a checkpoint saved in ``on_train_epoch_end`` so that Lightning
    resumes it as the start of the next epoch, as the uninterrupted run went on.

    Saved there, the epoch is processed but not completed. Lightning 2.6 then either counts it
    completed itself (``max_epochs`` runs) or, in step-based runs (``max_steps``, where the fit loop
    always restarts), replays the epoch's end: every ``on_train_epoch_end`` hook runs a second time,
    EarlyStopping counts the epoch twice, and the epoch's metrics are logged again from empty
    accumulators. Here the epoch is marked completed and the epoch loop's per-epoch counters are
    reset as the fit loop resets them when the next epoch starts, so neither happens.
    """
    loops = checkpoint.get("loops", {}).get("fit_loop")
    if not loops or "epoch_progress" not in loops:
        return
    for part in ("total", "current"):
        progress = loops["epoch_progress"][part]
        if progress["processed"] == progress["completed"] + 1:
            progress["completed"] = progress["processed"]
    for key, value in loops.items():
        if key.startswith("epoch_loop.") and ".val_loop." not in key:
            _zero_current(value)
    if "epoch_loop.batch_progress" in loops:
        loops["epoch_loop.batch_progress"]["is_last_batch"] = False
    val_progress = loops.get("epoch_loop.val_loop.batch_progress")
    if val_progress is not None:
        val_progress["total"] = dict.fromkeys(val_progress["total"], 0)


def _zero_current(progress: Any) -> None:
    if not isinstance(progress, dict):
        return
    for key, value in progress.items():
        if key == "current" and isinstance(value, dict) and all(isinstance(v, int) for v in value.values()):
            progress[key] = dict.fromkeys(value, 0)
        else:
            _zero_current(value)


def wrapped_sampler_datasets(loader: Any) -> dict[str, Any]:
    """Lightning's ``_DatasetSamplerWrapper`` objects (inside its DistributedSamplerWrapper, which
    Lightning puts around a custom sampler under DDP), by path in the loader. Their epoch order
    (``_sampler_list``) is drawn once per epoch and is all a resumed epoch needs replayed."""
    from lightning.pytorch.overrides.distributed import _DatasetSamplerWrapper

    batch_sampler = getattr(loader, "batch_sampler", None)
    candidates = {
        "sampler": getattr(loader, "sampler", None),
        "batch_sampler.sampler": getattr(batch_sampler, "sampler", None),
    }
    return {
        path: sampler.dataset
        for path, sampler in candidates.items()
        if isinstance(getattr(sampler, "dataset", None), _DatasetSamplerWrapper)
    }


def wrapped_sampler_order(wrapper: Any) -> list[int] | None:
    """A ``_DatasetSamplerWrapper``'s drawn epoch order (``_sampler_list``), None before its first draw."""
    return getattr(wrapper, "_sampler_list", None)


def set_wrapped_sampler_order(wrapper: Any, order: list[int]) -> None:
    wrapper._sampler_list = order


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


def convert_params(params: Any) -> dict[str, Any]:
    """Lightning's own hyperparameter flattening for loggers (``lightning.fabric.utilities.logger._convert_params``),
    so a config logged by us reads exactly like one WandbLogger logs."""
    from lightning.fabric.utilities.logger import _convert_params

    return _convert_params(params)


def load_sharded_from(strategy: Any, path: Any, weights_only: bool | None = None) -> dict[str, Any]:
    """``ModelParallelStrategy.load_checkpoint`` from this rank's own ``path``.

    Lightning's (2.6) first broadcasts rank 0's path, so every rank reads rank 0's directory. A
    sharded checkpoint under a URL is downloaded and verified into a private directory per rank,
    which does not exist on another node, and which rank 0 deletes once its own load is done: seen
    as rank 1's ``FileNotFoundError`` for ``meta.pt`` when rank 0 finished first. This is the
    strategy's own load (private ``lightning.fabric.strategies.model_parallel._load_checkpoint``)
    without that broadcast.
    """
    from pathlib import Path

    from lightning.fabric.strategies.model_parallel import _load_checkpoint

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
