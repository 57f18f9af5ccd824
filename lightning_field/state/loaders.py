"""Plain ``torch.utils.data.DataLoader`` objects made resumable without the user touching them.

A plain DataLoader has no ``state_dict``: a checkpoint cannot say where in the epoch it stopped,
so it can never be recoverable. Most existing code (Lightning's own ``BoringModel`` included) uses
one. So the train loaders a run hands to Lightning are re-created as torchdata
``StatefulDataLoader`` objects over the same dataset, sampler, collate function, workers,
generator, pin-memory and persistent-worker settings, the way Lightning itself re-creates loaders
to inject a ``DistributedSampler``.

Only what can be restored exactly is adopted, and adopting changes nothing a run computes. A
shuffling ``RandomSampler`` becomes ``PlainOrderRandomSampler``: torch's own order from the same
draws of the global RNG (one seed per epoch, at the epoch's first index), with the epoch's seed and
position saved so a mid-epoch resume replays them. (torchdata's stateful ``RandomSampler`` would not
do: it draws one seed when built and none per epoch, so every order, and every draw after it, changed.) A sequential
sampler, a sampler with its own ``state_dict`` and an iterable dataset are kept as they are:
StatefulDataLoader restores or replays them. Anything else (a DataLoader subclass with its own
constructor, a custom sampler or batch sampler without ``state_dict``) is left alone, with the
reason, so the checkpoint stays honestly not recoverable and the user is told why and how to fix it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler
from torch.utils.data.distributed import DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_field.compat.torch import random_sampler_num_samples
from lightning_field.state.samplers import PlainOrderRandomSampler

_FIX = "build it as torchdata.stateful_dataloader.StatefulDataLoader"


@dataclass(frozen=True)
class Adoption:
    """What happened to one train loader: adopted, already stateful, or left alone and why."""

    loader: Any  # the loader training will use
    original: str  # the type the user built, by name
    adopted: bool
    reason: str | None = None  # why it was left alone (None when it is resumable)
    settings: Mapping[str, Any] = field(default_factory=dict)  # loader_settings() of the user's loader

    @property
    def resumable(self) -> bool:
        return self.reason is None


def loader_settings(loader: Any) -> dict[str, Any]:
    """The settings of a train loader that its saved position depends on, as the user built it.

    A position saved with one worker count, batch size, ``drop_last`` or sampler means something
    else under another (torchdata's state even changes shape with the worker count), so a resume
    compares them before the position is applied (:func:`changed_loader_settings`).
    """
    batch_sampler = getattr(loader, "batch_sampler", None)
    sampler = getattr(batch_sampler, "sampler", None) or getattr(loader, "sampler", None)
    settings: dict[str, Any] = {
        "loader": type(loader).__name__,
        "dataset": type(getattr(loader, "dataset", None)).__name__,
        "num_workers": getattr(loader, "num_workers", None),
        "batch_size": getattr(loader, "batch_size", None),
        "drop_last": getattr(loader, "drop_last", None),
        "sampler": type(sampler).__name__ if sampler is not None else None,
    }
    if batch_sampler is not None and type(batch_sampler) is not BatchSampler:
        settings["batch_sampler"] = type(batch_sampler).__name__
    return settings


# What a change refuses; the loader and dataset classes only name the loader in the message.
_COMPARED = ("num_workers", "batch_size", "drop_last", "sampler", "batch_sampler")


def changed_loader_settings(saved: list[Mapping[str, Any]], now: list[Mapping[str, Any]]) -> list[str]:
    """Each setting that differs between a checkpoint's train loaders and this run's, in words:
    ``train loader 0 (DataLoader over TensorDataset) num_workers: 2 (checkpoint) -> 0 (now)``."""
    if len(saved) != len(now):
        return [f"number of train loaders: {len(saved)} (checkpoint) -> {len(now)} (now)"]
    changes = []
    for index, (before, after) in enumerate(zip(saved, now, strict=True)):
        where = f"train loader {index} ({after.get('loader')} over {after.get('dataset')})"
        for key in _COMPARED:
            if before.get(key) != after.get(key):
                changes.append(f"{where} {key}: {before.get(key)!r} (checkpoint) -> {after.get(key)!r} (now)")
    return changes


def adopt_loader(loader: Any) -> Adoption:
    """Return ``loader`` as a resumable StatefulDataLoader where that is exact, else why not."""
    adoption = _adopt(loader)
    return replace(adoption, settings=loader_settings(loader))


def _adopt(loader: Any) -> Adoption:
    name = type(loader).__name__
    if callable(getattr(loader, "state_dict", None)):
        return Adoption(loader, name, adopted=False)
    if type(loader) is not DataLoader:
        return Adoption(loader, name, False, f"{name} is not a plain DataLoader and has no state_dict; {_FIX}")
    kwargs = _shared_settings(loader)
    if isinstance(loader.dataset, IterableDataset):
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    else:
        batch_sampler = loader.batch_sampler
        if batch_sampler is not None and type(batch_sampler) is not BatchSampler:
            if not callable(getattr(batch_sampler, "state_dict", None)):
                kind = type(batch_sampler).__name__
                return Adoption(
                    loader,
                    name,
                    False,
                    f"its batch sampler {kind} has no state_dict, so its position"
                    f" cannot be restored; give {kind} state_dict/load_state_dict",
                )
            kwargs["batch_sampler"] = batch_sampler
        else:
            sampler = batch_sampler.sampler if batch_sampler is not None else loader.sampler
            resumable, reason = _resumable_sampler(sampler)
            if reason is not None:
                return Adoption(loader, name, False, reason)
            kwargs.update(sampler=resumable, batch_size=loader.batch_size, drop_last=loader.drop_last)
    return Adoption(StatefulDataLoader(loader.dataset, **kwargs), name, adopted=True)


def _shared_settings(loader: DataLoader) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "num_workers": loader.num_workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "generator": loader.generator,
        "persistent_workers": loader.persistent_workers,
        "pin_memory_device": loader.pin_memory_device,
    }
    if loader.num_workers > 0:
        settings["prefetch_factor"] = loader.prefetch_factor
    if hasattr(loader, "in_order"):  # torch >= 2.6
        settings["in_order"] = loader.in_order
    return settings


def _resumable_sampler(sampler: Any) -> tuple[Any, str | None]:
    if type(sampler) is RandomSampler:
        # Same data source, replacement and length, and the same generator when the user gave one.
        stateful = PlainOrderRandomSampler(
            sampler.data_source, sampler.replacement, random_sampler_num_samples(sampler), sampler.generator
        )
        return stateful, None
    if isinstance(sampler, (SequentialSampler, DistributedSampler)) or callable(getattr(sampler, "state_dict", None)):
        # Deterministic for its epoch (or restoring itself): the loader fast-forwards it exactly.
        return sampler, None
    kind = type(sampler).__name__
    return sampler, f"its sampler {kind} has no state_dict, so its order cannot be restored; give {kind} state_dict"


def adopt_loaders(loaders: Any) -> tuple[Any, list[Adoption]]:
    """``adopt_loader`` over what a ``train_dataloader`` hook may return: a loader, a list, tuple or
    dict of them, or a ``CombinedLoader`` (whose ``flattened`` loaders are replaced in place)."""
    adoptions: list[Adoption] = []

    def walk(obj: Any) -> Any:
        flattened = getattr(obj, "flattened", None)
        if flattened is not None and hasattr(type(obj), "flattened"):
            obj.flattened = [walk(item) for item in flattened]
            return obj
        if isinstance(obj, Mapping):
            return type(obj)({key: walk(value) for key, value in obj.items()})  # type: ignore[call-arg]  # dict subclasses take a mapping
        if isinstance(obj, (list, tuple)):
            return type(obj)(walk(value) for value in obj)
        if isinstance(obj, DataLoader) or hasattr(obj, "__iter__"):
            adoption = adopt_loader(obj)
            adoptions.append(adoption)
            return adoption.loader
        return obj

    return walk(loaders), adoptions
