"""Samplers whose position restores by jumping, not by replaying the indices before it.

torchdata's ``StatefulDataLoader`` restores a map-style position through the sampler iterator's
``load_state_dict``; its default ``RandomSampler`` (and any non-stateful sampler, which it skips
index by index) walks every index before the saved position in a Python loop, so resuming at batch
1,000,000 costs seconds that resuming at batch 10 does not. These samplers rebuild the epoch's
order (the same work at any position) and then start at the saved offset.

``JumpRandomSampler`` draws exactly what torchdata's ``RandomSampler`` draws from the same generator
(one ``randperm`` per epoch), so it is a drop-in replacement that keeps existing data orders.

``PlainOrderRandomSampler`` is what a plain ``DataLoader(shuffle=True)`` is re-created with: it draws
the epoch's seed from the global RNG at the moment torch's ``RandomSampler`` does (the epoch's first
index) and yields torch's own order from it, so a run with the callbacks is the run without them.
Its position restores by re-drawing the order from the saved seed and skipping to the offset.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import RandomSampler, Sampler

from lightning_field.compat.torch import draw_sampler_seed

_YIELDED = "yielded"
_GENERATOR = "generator"
_SEED = "seed"


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


class _PlainOrderIterator(Iterator[int]):
    """One epoch of torch's ``RandomSampler`` order, its seed drawn on the first index as torch draws it.

    The state is the epoch's origin (the seed drawn from the global RNG, or the state of the user's
    own generator before the epoch's draws) and the indices yielded. An iterator saved before its
    first index holds no origin: restored, it draws on its first index as the uninterrupted run did.
    """

    def __init__(self, sampler: PlainOrderRandomSampler) -> None:
        self.sampler = sampler
        self.origin: dict[str, Any] = {}
        self.yielded = 0
        self._indices: Iterator[int] | None = None

    def __iter__(self) -> _PlainOrderIterator:
        return self

    def __next__(self) -> int:
        if self._indices is None:
            self._start(self._draw_origin())
        assert self._indices is not None
        index = next(self._indices)
        self.yielded += 1
        return index

    def _draw_origin(self) -> dict[str, Any]:
        generator = self.sampler.generator
        if generator is None:
            return {_SEED: draw_sampler_seed()}
        return {_GENERATOR: generator.get_state()}

    def _start(self, origin: dict[str, Any]) -> None:
        """The epoch's indices from ``origin``: torch's own ``RandomSampler.__iter__``, so the order is
        torch's by construction, not a re-implementation of it."""
        if _SEED in origin:
            generator = torch.Generator()
            generator.manual_seed(int(origin[_SEED]))
        else:
            # The user's generator is advanced by the epoch as torch advances it; a state saved by
            # torchdata's RandomSampler (earlier versions) names the private generator it drew from.
            generator = self.sampler.generator or torch.Generator()
            generator.set_state(origin[_GENERATOR])
        plain = RandomSampler(self.sampler.data_source, self.sampler.replacement, self.sampler.num_samples, generator)
        self.origin, self._indices = origin, iter(plain)

    def state_dict(self) -> dict[str, Any]:
        return {_YIELDED: self.yielded, **self.origin}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Read back from a checkpoint: every field checked, a malformed one refused naming it."""
        yielded = state.get(_YIELDED)
        if type(yielded) is not int or not 0 <= yielded <= self.sampler.num_samples:
            raise ValueError(f"a sampler position must be 0 to {self.sampler.num_samples} indices, not {yielded!r}")
        origin = {key: state[key] for key in (_SEED, _GENERATOR) if state.get(key) is not None}
        seed = origin.get(_SEED)
        if seed is not None and (type(seed) is not int or not -(2**63) <= seed < 2**64):
            raise ValueError(f"a sampler's saved seed must be a 64-bit integer, not {seed!r}")
        generator = origin.get(_GENERATOR)
        if generator is not None and not (isinstance(generator, torch.Tensor) and generator.dtype == torch.uint8):
            raise ValueError(f"a sampler's saved generator state must be a byte tensor, not {type(generator).__name__}")
        self.origin, self.yielded, self._indices = {}, 0, None
        if not origin:
            if yielded:
                raise ValueError(f"a sampler position of {yielded} indices names no seed or generator state")
            return  # saved before the epoch's draw: it draws on its first index, as the saved run did
        self._start(origin)
        assert self._indices is not None
        next(itertools.islice(self._indices, yielded, yielded), None)  # skip the indices already trained on
        self.yielded = yielded


class PlainOrderRandomSampler(RandomSampler):
    """torch's ``RandomSampler``, draw for draw, with a position that saves and restores.

    A plain ``DataLoader(shuffle=True)`` is re-created with this sampler (``state.loaders``): the
    same indices in the same order from the same draws of the global RNG (one seed per epoch, drawn
    at the epoch's first index, when the sampler has no generator of its own), so adopting a loader
    changes nothing a run computes. It *is* a ``RandomSampler``: whoever asks whether a loader
    shuffles (Lightning, before it puts a ``DistributedSampler(shuffle=...)`` in its place) hears yes.
    """

    def __iter__(self) -> _PlainOrderIterator:
        return _PlainOrderIterator(self)
