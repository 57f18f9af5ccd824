"""Data position beyond what the loader saves itself: the order of a wrapped sampler's epoch.

A StatefulDataLoader restores its own sampler, but not a sampler wrapped around another one, such as
the ``DistributedSamplerWrapper`` Lightning injects under DDP. That wrapper materialises its inner
sampler's order once per epoch, and the inner sampler draws it from a ``torch.Generator``; how many
draws happen per epoch depends on loader internals (worker count, resume path). So the order in use
and the generators' current state are saved as they are, and a resume replays that order instead of
re-drawing it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils.data import IterableDataset

from lightning_field.compat.lightning_samplers import (
    set_wrapped_sampler_order,
    wrapped_sampler_datasets,
    wrapped_sampler_order,
)
from lightning_field.state.samplers import JumpRandomSampler, JumpSequentialSampler
from lightning_field.state.streams import has_own_position

_MAX_DEPTH = 5


def sampler_generators(loader: Any) -> dict[str, torch.Generator]:
    """Every ``torch.Generator`` reachable from the loader's samplers, keyed by attribute path."""
    found: dict[str, torch.Generator] = {}
    seen: set[int] = set()

    def walk(obj: Any, path: str, depth: int) -> None:
        if obj is None or id(obj) in seen or depth > _MAX_DEPTH:
            return
        seen.add(id(obj))
        if isinstance(obj, torch.Generator):
            found[path] = obj
            return
        attrs = getattr(obj, "__dict__", None)
        if not attrs:
            return
        for name, value in attrs.items():
            if isinstance(value, (torch.Tensor, str, bytes, int, float, list, dict, tuple)):
                continue
            walk(value, f"{path}.{name}", depth + 1)

    walk(getattr(loader, "sampler", None), "sampler", 0)
    walk(getattr(loader, "batch_sampler", None), "batch_sampler", 0)
    return found


def _wrapped_sampler_orders(loader: Any) -> dict[str, Any]:
    return wrapped_sampler_datasets(loader)


def capture_sampler_state(loaders: Iterable[Any]) -> list[dict[str, Any]]:
    """Per loader: its sampler generators' states and any wrapped sampler's current epoch order."""
    states = []
    for loader in loaders:
        orders = {
            path: torch.tensor(order, dtype=torch.int64)
            for path, wrapper in _wrapped_sampler_orders(loader).items()
            if (order := wrapped_sampler_order(wrapper)) is not None
        }
        generators = {path: gen.get_state() for path, gen in sampler_generators(loader).items()}
        states.append({"generators": generators, "wrapped_orders": orders})
    return states


def needs_replay(saved: list[dict[str, Any]]) -> bool:
    return any(state.get("wrapped_orders") for state in saved)


@contextmanager
def replaying_sampler_state(loaders: list[Any], saved: list[dict[str, Any]]) -> Iterator[None]:
    """While a resumed iterator is rebuilt, wrapped samplers replay the saved epoch order.

    On exit, every sampler generator is put back to its saved state, so later epochs draw exactly
    what the uninterrupted run drew.
    """
    patched = []
    for loader, state in zip(loaders, saved, strict=False):  # a loader added since the save has nothing to replay
        wrappers = _wrapped_sampler_orders(loader)
        for path, order in state.get("wrapped_orders", {}).items():
            wrapper = wrappers.get(path)
            if wrapper is None or "reset" in vars(wrapper):
                continue

            def reset(wrapper: Any = wrapper, order: torch.Tensor = order) -> None:
                set_wrapped_sampler_order(wrapper, order.tolist())

            wrapper.reset = reset
            patched.append(wrapper)
    try:
        yield
    finally:
        for wrapper in patched:
            del wrapper.reset
        restore_sampler_generators(loaders, saved)


def restore_sampler_generators(loaders: Iterable[Any], saved: list[dict[str, Any]]) -> None:
    """Put every sampler generator back to its saved state (a loader added since has none)."""
    for loader, state in zip(loaders, saved, strict=False):
        generators = sampler_generators(loader)
        for path, gen_state in state.get("generators", {}).items():
            if path in generators:
                generators[path].set_state(gen_state)


def stale_epoch_samplers(loaders: Iterable[Any], epoch: int) -> list[Any]:
    """Epoch-seeded samplers whose ``epoch`` is not the one being resumed."""
    stale = []
    for dl in loaders:
        batch_sampler = getattr(dl, "batch_sampler", None)
        for sampler in (getattr(dl, "sampler", None), getattr(batch_sampler, "sampler", None)):
            if callable(getattr(sampler, "set_epoch", None)) and getattr(sampler, "epoch", epoch) != epoch:
                stale.append(sampler)
    return stale


def describe_restore(loader: Any) -> str:
    """How a resume brings ``loader`` back to its saved position, in words for the manifest.

    What it costs matters at scale: a jump costs the same at batch 10 and batch 1,000,000, an index
    fast-forward grows with the position (without loading data), a replay re-reads the data.
    """
    if not callable(getattr(loader, "state_dict", None)):
        return "not restored: the loader has no state_dict"
    dataset = getattr(loader, "dataset", None)
    if isinstance(dataset, IterableDataset):
        if has_own_position(dataset):
            return "iterable, dataset state: the dataset's own load_state_dict restores its position (in each worker)"
        return "iterable, replay: the loader re-reads every sample before the position (cost grows with it)"
    batch_sampler = getattr(loader, "batch_sampler", None)
    sampler = getattr(batch_sampler, "sampler", None) or getattr(loader, "sampler", None)
    name = type(sampler).__name__
    if isinstance(sampler, (JumpRandomSampler, JumpSequentialSampler)):
        return f"map-style, jump: {name} restarts at the saved sample offset (cost independent of the position)"
    if name == "StatefulDistributedSampler":
        return f"map-style, skip: {name} skips the indices before the position with islice (no data is read)"
    return (
        f"map-style, index fast-forward: {name}'s indices before the position are drawn and dropped one by one"
        " (no data is read, but the cost grows with the position; JumpRandomSampler jumps instead)"
    )
