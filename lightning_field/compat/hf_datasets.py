"""Hugging Face ``datasets``' private ``IterableDataset`` internals that the stream manifest, the
shuffle-buffer refusal and a resumed position read (``lightning_field.state.streams``); never imports
``datasets``.

An ``IterableDataset`` keeps its pipeline as a chain of "examples iterables" (``_ex_iterable``, each
wrapping the next as ``ex_iterable``); its shards are the ``kwargs`` of the innermost one, as
in-memory tables with a ``_fingerprint`` or as data files. No public API lists either.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

_MAX_DEPTH = 32


def examples_iterables(dataset: Any) -> Iterator[Any]:
    """The chain of examples iterables under a Hugging Face ``IterableDataset``, outermost first."""
    node = getattr(dataset, "_ex_iterable", None)
    for _ in range(_MAX_DEPTH):
        if node is None:
            return
        yield node
        node = getattr(node, "ex_iterable", None)


def shard_sources(dataset: Any) -> tuple[list[tuple[str, int]], list[str]]:
    """The stream's shards: ``(fingerprint, rows)`` of in-memory tables, or data file locations."""
    for node in examples_iterables(dataset):
        kwargs = getattr(node, "kwargs", None) or {}
        tables = kwargs.get("shards")
        if isinstance(tables, list) and all(hasattr(table, "_fingerprint") for table in tables):
            return [(str(table._fingerprint), len(table)) for table in tables], []
        files = kwargs.get("files") or kwargs.get("filepaths")
        if isinstance(files, list) and files and all(isinstance(f, str) for f in files):
            return [], list(files)
    return [], []


class PositionForOneEpoch(dict[str, Any]):
    """A Hugging Face ``IterableDataset`` position that its ``__iter__`` applies while ``active`` is set.

    ``IterableDataset.load_state_dict`` keeps the state (``_starting_state_dict``), and every later
    ``__iter__`` starts from it while the dataset's epoch is the saved one (``if
    self._starting_state_dict and self.epoch == ...``). A loop that never calls the stream's
    ``set_epoch`` (Lightning calls it on samplers, not datasets, and calling it for the user would
    reorder every later epoch's shards) keeps epoch 0 throughout, so a resumed position would start
    every later epoch too. This dict reads as empty once ``active`` is cleared at the resumed epoch's
    end; ``active`` is a tensor in shared memory, as ``datasets`` keeps its own epoch, so that loader
    workers, persistent ones included, see it cleared.
    """

    def __init__(self, state: dict[str, Any], active: torch.Tensor) -> None:
        super().__init__(state)
        self.active = active

    def __len__(self) -> int:
        return super().__len__() if bool(self.active) else 0


def is_position(value: Any) -> bool:
    """Whether ``value`` is an ``IterableDataset.state_dict()``: its epoch and its examples' position."""
    return isinstance(value, dict) and isinstance(value.get("epoch"), int) and "examples_iterable" in value
