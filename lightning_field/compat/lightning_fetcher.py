"""Lightning's private train-fetcher internals: the batch it fetches ahead of the one being trained.

Lightning fetches one batch ahead from a train loader without a length, to know which batch is
the epoch's last (``_PrefetchDataFetcher``). The loader's position at a save then counts that
batch as trained. ``lightning_field.state.prefetch`` reads these to save the position from before
it; ``tests/test_streams.py`` pins the behaviour. Import them from ``lightning_field.compat.lightning``.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.fabric.utilities.types import _Stateful


def _fetcher(trainer: pl.Trainer) -> Any:
    return trainer.fit_loop._data_fetcher


def fetches_ahead(trainer: pl.Trainer) -> bool:
    """Whether the train fetcher reads a batch ahead of the one trained: its loaders have no length."""
    fetcher = _fetcher(trainer)
    return fetcher is not None and fetcher.length is None and isinstance(getattr(fetcher, "batches", None), list)


def batches_fetched_ahead(trainer: pl.Trainer) -> int:
    """How many fetched batches the train fetcher holds that no training step has had yet."""
    fetcher = _fetcher(trainer)
    return len(getattr(fetcher, "batches", None) or ())


def successful_fetches(trainer: pl.Trainer) -> int:
    """The fetcher's count of batches fetched this epoch (it rises by one with each one that arrives)."""
    fetcher = _fetcher(trainer)
    return int(getattr(fetcher, "fetched", 0)) if fetcher is not None else 0


def loaders_in_use(trainer: pl.Trainer) -> list[Any]:
    """The train loaders the fit loop iterates now (after adoption and DDP's re-creation)."""
    combined = trainer.fit_loop._combined_loader
    return list(combined.flattened) if combined is not None else []


def train_loaders_built_for(trainer: pl.Trainer) -> int | None:
    """Under ``reload_dataloaders_every_n_epochs`` (set on the Trainer by its data connector, not declared
    there), the epoch the fit loop last rebuilt the train loaders for (``_last_train_dl_reload_epoch``);
    None without it, or before they were built."""
    epoch = trainer.fit_loop._last_train_dl_reload_epoch
    if not getattr(trainer, "reload_dataloaders_every_n_epochs", 0) or epoch == float("-inf"):
        return None
    return int(epoch)


def saved_loaders(trainer: pl.Trainer) -> list[Any]:
    """The train loaders whose states a checkpoint holds, in its order: ``CombinedLoader._state_dicts``'
    own rule (Lightning's ``_Stateful`` protocol), so a copied state lines up with the one it replaces."""
    return [loader for loader in loaders_in_use(trainer) if isinstance(loader, _Stateful)]


def set_saved_loader_states(checkpoint: dict[str, Any], loader_states: list[Any]) -> None:
    """Replace the train loader states in a checkpoint dict, where ``FitLoop.on_save_checkpoint``
    put them (``loops.fit_loop.state_dict.combined_loader``) and Lightning's restore reads them."""
    loop_state = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict")
    if isinstance(loop_state, dict) and "combined_loader" in loop_state:
        loop_state["combined_loader"] = loader_states


def reopen_finished_epoch(trainer: pl.Trainer, loader_states: list[Any]) -> None:
    """Put the train loaders back as the uninterrupted run had them at its epoch's end: holding
    the finished iterator of their saved state, which the next epoch's ``iter`` resets.

    From loaders without a length, Lightning's set-up of a resume has already fetched a batch ahead
    from the restored position. Loading the states again and asking each loader for its state builds
    the iterator from them (torchdata's ``StatefulDataLoader`` keeps the iterator that ``state_dict``
    builds for the next ``iter``); the next epoch's iterator then comes from ``iter`` on a finished
    iterator, with the same RNG draws as in the uninterrupted run (a new one, or a reset of
    persistent workers), not from a fresh load.
    """
    combined = trainer.fit_loop._combined_loader
    if combined is None:
        return
    combined._load_state_dicts(loader_states)
    for loader in saved_loaders(trainer):
        loader.state_dict()
