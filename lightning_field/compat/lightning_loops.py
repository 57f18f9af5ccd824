"""Lightning's private fit-loop internals that exact resume and time accounting reach into.

The hook immediately before (and after) each training fetch, the train loaders before their first
iteration, the resumed iterator's rebuild, and corrections for Lightning 2.6's restore quirks in the
loop progress and the epoch-interval schedulers. ``tests/test_exact_resume.py`` pins the behaviour
they rely on; import them from ``lightning_field.compat.lightning``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

from lightning_field.compat import lightning_range  # noqa: F401  refuses an untested Lightning first

# isort: split
import lightning.pytorch as pl
from lightning.fabric.utilities.data import _set_sampler_epoch
from lightning.pytorch.callbacks import BaseFinetuning, Callback, StochasticWeightAveraging
from lightning.pytorch.loops.loop import _Loop
from lightning.pytorch.trainer.call import _call_lightning_module_hook

from lightning_field.state.data_position import needs_replay, replaying_sampler_state, stale_epoch_samplers
from lightning_field.state.loaders import Adoption, adopt_loaders
from lightning_field.state.rng import WorkerRngCapture

if TYPE_CHECKING:
    from lightning.pytorch.loops.progress import _ProcessedTracker

MARK = "_lightning_field"
"""The attribute that marks a wrapper installed by lightning_field (so none is installed twice)."""


def is_last_batch_of_epoch(trainer: pl.Trainer) -> bool:
    return bool(trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)


def can_stop_early(trainer: pl.Trainer) -> bool:
    """Whether a ``trainer.should_stop`` set now ends fit (``min_epochs``/``min_steps`` are met):
    Lightning's own ``FitLoop._can_stop_early``."""
    return bool(trainer.fit_loop._can_stop_early)


def accumulating(trainer: pl.Trainer) -> bool:
    """Whether the batch just trained is inside a gradient-accumulation window, its gradients not
    yet applied by an optimizer step (``_TrainingEpochLoop._should_accumulate``)."""
    epoch_loop = trainer.fit_loop.epoch_loop
    return bool(trainer.lightning_module.automatic_optimization and epoch_loop._should_accumulate())


def max_epochs_reached(trainer: pl.Trainer) -> bool:
    """Whether the epoch ending now is the last that ``max_epochs`` allows (``FitLoop.done``'s test,
    which counts ``processed`` epochs: it is incremented before ``on_train_epoch_end``)."""
    fit_loop = trainer.fit_loop
    processed = cast("_ProcessedTracker", fit_loop.epoch_progress.current).processed
    return fit_loop.max_epochs is not None and fit_loop.max_epochs >= 0 and processed >= fit_loop.max_epochs


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
    hooks: list[Callable[[], None]] | None = getattr(current, MARK, None)
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

        setattr(run_hooks, MARK, hooks)
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
    if method is None or getattr(method, MARK, False):
        return None

    def patched_train_dataloader() -> Any:
        return adopted(method())

    setattr(patched_train_dataloader, MARK, True)
    setattr(instance, source.name, patched_train_dataloader)

    def undo() -> None:
        if source.name in vars(instance):
            delattr(instance, source.name)  # the user's own method shows through again

    return undo


def _patch_loader(loader: Any) -> None:
    if getattr(loader, "num_workers", 0) and not isinstance(loader.worker_init_fn, WorkerRngCapture):
        loader.worker_init_fn = WorkerRngCapture(loader.worker_init_fn)


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


def undo_epoch_end_double_count(trainer: pl.Trainer) -> None:
    """Compensate Lightning 2.6 counting a restored, already-processed epoch as processed twice.

    Resuming from a checkpoint taken at ``on_train_epoch_end``, the fit loop replays that epoch's
    end and increments ``processed`` again, so every later ``set_epoch`` is one ahead of the
    uninterrupted run and an epoch-seeded sampler (DistributedSampler) shuffles differently.
    """
    fit_loop = trainer.fit_loop
    progress = fit_loop.epoch_progress
    # The epoch progress holds processed trackers; its dataclass declares the base tracker type.
    total = cast("_ProcessedTracker", progress.total)
    current = cast("_ProcessedTracker", progress.current)
    if fit_loop.restarted_on_epoch_end and total.processed == total.started:
        total.processed -= 1
        current.processed -= 1


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
        _Loop.restarting.fset(fit_loop, False)  # type: ignore[attr-defined]  # mypy sees the setter overload, not the property


def rerun_validation_skipped_on_resume(trainer: pl.Trainer, before_validation: Callable[[], None]) -> None:
    """Run the validation the uninterrupted run ran after the resumed step, instead of skipping it.

    A checkpoint saved at a training batch's end holds the state from before the validation that the
    uninterrupted run then ran at that step. Resuming, Lightning 2.6 counts that validation as done
    (``increment_progress_to_evaluation_end`` in the first ``advance``) and trains the next batch, so
    what validation changed is lost: its draws from the global generators (each validation loader's
    base seed, any user randomness), the logged and ``callback_metrics`` values, callbacks that act
    at its end (``EarlyStopping``), and the plateau schedulers stepped after it. Validation is run
    there as ``on_advance_end`` runs it, at the logger step it ran at, and the plateau schedulers
    stepped after it, so the resumed run continues from the state the uninterrupted run had.
    Installed for the first ``advance`` of a resumed fit only; later calls are Lightning's own.
    ``before_validation`` puts the saved random streams back first: the validation draws from them.
    """
    epoch_loop = trainer.fit_loop.epoch_loop
    val_loop = epoch_loop.val_loop

    def run_instead() -> None:
        del val_loop.increment_progress_to_evaluation_end  # once: the instance attribute shadowed the method
        val_loop.restarting = False  # a whole evaluation, as the uninterrupted run's
        counted = not epoch_loop._should_accumulate()  # the loop's reset already counted this batch as stepped
        first_loop_iter = trainer._logger_connector._first_loop_iter
        trainer.validating = True
        if counted:
            _call_lightning_module_hook(trainer, "on_validation_model_zero_grad")
            epoch_loop._batches_that_stepped -= 1
        try:
            before_validation()
            val_loop.run()
        finally:
            if counted:
                epoch_loop._batches_that_stepped += 1
            trainer.training = True
            trainer._logger_connector._first_loop_iter = first_loop_iter
        epoch_loop.update_lr_schedulers("step", update_plateau_schedulers=True)

    val_loop.increment_progress_to_evaluation_end = run_instead  # type: ignore[method-assign]


# Callbacks whose ``on_train_epoch_start`` rebuilds what the epoch needs from their restored state, and
# so runs again at a mid-epoch resume: ``StochasticWeightAveraging`` builds its SWALR scheduler there (the
# scheduler's state restored into it, its averaging skipped as already done for the epoch).
EPOCH_START_REPLAYED: tuple[type[Callback], ...] = (StochasticWeightAveraging,)
# Callbacks whose epoch-start work the checkpoint restores by other means: no warning for them.
# ``BaseFinetuning`` puts its param groups back in ``on_fit_start``; replaying would add them twice.
EPOCH_START_RESTORED: tuple[type[Callback], ...] = (BaseFinetuning,)


def replay_resumed_epoch_start(trainer: pl.Trainer, pl_module: pl.LightningModule) -> list[str]:
    """At a mid-epoch resume, call ``on_train_epoch_start`` of the callbacks that rebuild state there.

    Lightning 2.6 does not call ``on_train_epoch_start`` for the epoch a checkpoint resumes into: the
    uninterrupted run called it when the epoch began. ``StochasticWeightAveraging`` builds its
    scheduler there, so without the call the resumed epoch ends with no SWA scheduler step and every
    later learning rate lags one epoch. Returns the names of other callbacks that hold state and
    define the hook: whether theirs builds state only they can tell, and the caller says so.
    """
    others = []
    for callback in trainer.callbacks:  # type: ignore[attr-defined]  # a property the type checker misses
        if isinstance(callback, EPOCH_START_REPLAYED):
            callback.on_train_epoch_start(trainer, pl_module)
        elif (
            type(callback).on_train_epoch_start is not Callback.on_train_epoch_start
            and not isinstance(callback, EPOCH_START_RESTORED)
            and not type(callback).__module__.startswith("lightning_field.")
            and callback.state_dict()
        ):
            others.append(type(callback).__name__)
    return others


def forget_validation_rerun(trainer: pl.Trainer) -> None:
    """Remove ``rerun_validation_skipped_on_resume``'s wrapper where the resumed fit never called it."""
    val_loop = trainer.fit_loop.epoch_loop.val_loop
    if "increment_progress_to_evaluation_end" in vars(val_loop):
        del val_loop.increment_progress_to_evaluation_end


def start_next_epoch_iterator(trainer: pl.Trainer) -> None:
    """Build the train iterator of the epoch after a finished one, as the uninterrupted run does.

    Resuming from a checkpoint saved after an epoch's last batch, Lightning 2.6 keeps the iterator
    it built over the restored (exhausted) loader position for the next epoch: that epoch yields no
    batch and training ends one epoch short. The epoch is set on the samplers first, as the fit loop
    would before building it (a worker prefetches indices as soon as the iterator exists).
    """
    fit_loop = trainer.fit_loop
    if fit_loop._combined_loader is None or fit_loop._data_fetcher is None:
        return
    processed = cast("_ProcessedTracker", fit_loop.epoch_progress.current).processed
    for loader in fit_loop._combined_loader.flattened:
        _set_sampler_epoch(loader, processed)
    reload_every = getattr(trainer, "reload_dataloaders_every_n_epochs", 0)  # set by the data connector
    if reload_every and processed % reload_every == 0:
        # An epoch whose loaders are rebuilt: the uninterrupted run iterated them twice as it started
        # (in ``setup_data`` and in the epoch loop's ``on_run_start``), each drawing a base seed.
        iter(fit_loop._data_fetcher)
    iter(fit_loop._data_fetcher)


def restore_callback_metrics(trainer: pl.Trainer, saved_metrics: Mapping[str, Any], device: Any) -> None:
    """Put the saved ``trainer.callback_metrics`` back, on ``device``, where Lightning keeps them.

    Lightning empties them when a fit sets up and refills them only with what is logged next; the
    uninterrupted run still holds everything logged before the save, a validation's values among them
    until the next validation (``check_val_every_n_epoch=2``: an epoch that ends with no validation).
    ``ModelCheckpoint(monitor=...)``, ``ReduceLROnPlateau`` and loggers read them at that epoch's end:
    without them a resumed run skips or fails a decision the uninterrupted run made.
    """
    trainer._logger_connector._callback_metrics.update({k: v.to(device) for k, v in saved_metrics.items()})


def step_plateau_schedulers_missed_at_epoch_end(trainer: pl.Trainer) -> None:
    """Step the ``ReduceLROnPlateau`` schedulers the uninterrupted run stepped after the save.

    A checkpoint saved at an epoch's end holds the plateau schedulers before their step: Lightning
    steps them after every ``on_train_epoch_end`` hook, with that epoch's monitored value. Resuming
    from such a checkpoint, Lightning goes on with the next epoch and the step never happens. That step
    is run here, reading the monitored values :func:`restore_callback_metrics` put back (other
    schedulers were stepped with the epoch's last batch, before the save).
    """
    trainer.fit_loop.epoch_loop.update_lr_schedulers("epoch", update_plateau_schedulers=True)


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
