"""Hugging Face ``datasets``' private ``IterableDataset`` internals that the stream manifest and the
shuffle-buffer refusal read (``lightning_field.state.streams``); never imports ``datasets``.

An ``IterableDataset`` keeps its pipeline as a chain of "examples iterables" (``_ex_iterable``, each
wrapping the next as ``ex_iterable``); its shards are the ``kwargs`` of the innermost one, as
in-memory tables with a ``_fingerprint`` or as data files. No public API lists either.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

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
