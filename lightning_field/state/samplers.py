"""Samplers whose position restores by jumping, not by replaying the indices before it.

torchdata's ``StatefulDataLoader`` restores a map-style position through the sampler iterator's
``load_state_dict``; its default ``RandomSampler`` (and any non-stateful sampler, which it skips
index by index) walks every index before the saved position in a Python loop, so resuming at batch
1,000,000 costs seconds that resuming at batch 10 does not. These samplers rebuild the epoch's
order (the same work at any position) and then start at the saved offset.

``JumpRandomSampler`` draws exactly what torchdata's ``RandomSampler`` draws from the same generator
(one ``randperm`` per epoch), so it is a drop-in replacement that keeps existing data orders.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import Sampler

_YIELDED = "yielded"
_GENERATOR = "generator"


class _JumpIterator(Iterator[int]):
    """One epoch of indices: ``order`` from a generator state, resumable at any offset in O(1)."""

    def __init__(self, sampler: JumpRandomSampler | JumpSequentialSampler) -> None:
        self.sampler = sampler
        self.generator_state = sampler.generator.get_state() if sampler.generator is not None else None
        self.order = sampler.epoch_order()
        self.yielded = 0

    def __iter__(self) -> _JumpIterator:
        return self

    def __next__(self) -> int:
        if self.yielded >= len(self.order):
            raise StopIteration
        index = self.order[self.yielded]
        self.yielded += 1
        return int(index)

    def state_dict(self) -> dict[str, Any]:
        return {_YIELDED: self.yielded, _GENERATOR: self.generator_state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        yielded = int(state[_YIELDED])
        if yielded < 0:
            raise ValueError(f"cannot resume a sampler at a negative position ({yielded})")
        if state.get(_GENERATOR) is not None and self.sampler.generator is not None:
            # Re-draw the saved epoch's order from the generator state it was drawn from.
            self.generator_state = state[_GENERATOR]
            self.sampler.generator.set_state(self.generator_state)
            self.order = self.sampler.epoch_order()
        if yielded > len(self.order):
            raise ValueError(f"saved position {yielded} is past the end of an epoch of {len(self.order)} samples")
        self.yielded = yielded


class JumpRandomSampler(Sampler[int]):
    """A shuffling sampler (without replacement) whose saved position restores in O(1).

    Args:
        data_source: the map-style dataset (only its length is used).
        generator: the ``torch.Generator`` the epoch orders are drawn from; give it a seed for
            reproducible runs. Created from a random seed when omitted, as torchdata does.
    """

    def __init__(self, data_source: Sized, generator: torch.Generator | None = None) -> None:
        self.data_source = data_source
        if generator is None:
            generator = torch.Generator()
            generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
        self.generator: torch.Generator | None = generator

    def epoch_order(self) -> torch.Tensor:
        return torch.randperm(len(self.data_source), generator=self.generator)

    def __iter__(self) -> _JumpIterator:
        return _JumpIterator(self)

    def __len__(self) -> int:
        return len(self.data_source)


class JumpSequentialSampler(Sampler[int]):
    """Indices ``0..len-1`` in order, resumable at any offset in O(1)."""

    def __init__(self, data_source: Sized) -> None:
        self.data_source = data_source
        self.generator: torch.Generator | None = None

    def epoch_order(self) -> range:
        return range(len(self.data_source))

    def __iter__(self) -> _JumpIterator:
        return _JumpIterator(self)

    def __len__(self) -> int:
        return len(self.data_source)
