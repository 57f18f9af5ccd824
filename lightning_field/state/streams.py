"""Streamed train datasets (``IterableDataset``) as the streaming libraries build them: their epoch,
and what keeps one from resuming exactly.

* **A loaded position, once.** A Hugging Face ``datasets`` stream applies a loaded position to every
  iteration while its epoch is the saved one, and its epoch is whatever the user's code sets: plain
  Lightning never calls its ``set_epoch``. Calling it for the user would change the order of every
  epoch after the first (its shards are reordered by the epoch); so the stream's epoch is left alone
  and a loaded position applies through the resumed epoch only (:func:`positions_for_the_resumed_epoch`).
* **Positions a library cannot restore.** ``datasets`` documents that a shuffle buffer's examples
  are not in its ``state_dict``: a resume loses them and refills the buffer.
* **What the stream reads.** :func:`stream_manifest` lists the shards (path or URL, size, content
  identity: a BLAKE3 of a local file, an object store's ETag or version, a Hugging Face shard's
  fingerprint), the library and its version, and the loader's workers and ``prefetch_factor``. It
  is part of the data provenance, so a resume over rewritten, added or removed shards is refused
  with the difference, shard by shard. :func:`stream_positions` says where each worker stands.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import fsspec
import torch
from torch.utils.data import DataLoader, IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_field.compat import hf_datasets
from lightning_field.core.hashing import file_digest
from lightning_field.core.storage import is_url
from lightning_field.state.rng import dataset_own_state

__all__ = [
    "has_own_position",
    "positions_for_the_resumed_epoch",
    "stream_manifest",
    "stream_positions",
    "torch_stream",
    "unrestorable_stream",
]


def torch_stream(loader: Any) -> Any | None:
    """The loader's dataset if it is an ``IterableDataset`` read by torch's or torchdata's own loader
    (not a library's loader, such as LitData's, that keeps its position and epoch itself)."""
    dataset = getattr(loader, "dataset", None)
    if type(loader) not in (DataLoader, StatefulDataLoader) or not isinstance(dataset, IterableDataset):
        return None
    return dataset


def has_own_position(dataset: Any) -> bool:
    return callable(getattr(dataset, "state_dict", None)) and callable(getattr(dataset, "load_state_dict", None))


def positions_for_the_resumed_epoch(loader_state: Any, active: torch.Tensor) -> int:
    """Make every Hugging Face stream position in a loaded loader state apply while ``active`` is set:
    through the resumed epoch, then never again (cleared at its end; never set where the saved epoch
    had ended, so the next one starts at its beginning); the positions found. Replaced in place, so
    whoever reads the state later (Lightning's restore, the loader's workers) gets them
    (:class:`~lightning_field.compat.hf_datasets.PositionForOneEpoch`)."""
    found = 0
    # Read back from a checkpoint: walked without recursion, as deep as a loader's state goes and no deeper.
    pending: list[tuple[Any, int]] = [(loader_state, 0)]
    while pending:
        container, depth = pending.pop()
        if not isinstance(container, (dict, list)) or depth > _MAX_STATE_DEPTH:
            continue
        items = container.items() if isinstance(container, dict) else enumerate(container)
        for key, value in list(items):
            if hf_datasets.is_position(value):
                container[key] = hf_datasets.PositionForOneEpoch(value, active)
                found += 1
            else:
                pending.append((value, depth + 1))
    return found


# A StatefulDataLoader's state nests a worker's dataset state about six levels down; far past it is no
# loader state of a library's, and a hostile one deeper still would only cost time to walk.
_MAX_STATE_DEPTH = 32


def unrestorable_stream(loader: Any) -> str | None:
    """Why the loader's stream cannot resume exactly from its own ``state_dict``, or None."""
    dataset = getattr(loader, "dataset", None)
    if not type(dataset).__module__.startswith("datasets."):
        return None
    for node in hf_datasets.examples_iterables(dataset):
        if type(node).__name__ == "BufferShuffledExamplesIterable":
            size = getattr(node, "buffer_size", "?")
            return (
                f"datasets' {type(dataset).__name__}.shuffle(buffer_size={size}) keeps a shuffle buffer that its"
                " state_dict does not hold, so a resume loses the buffered examples (as the datasets documentation"
                " says); shuffle a map-style Dataset before to_iterable_dataset() instead"
                " (Dataset.shuffle(seed=...)), or resume inexactly on purpose with ResumeConfig(inexact=True)"
            )
    return None


# ---------------------------------------------------------------------------------------- manifest
# The most shards listed one by one; beyond it (rare) only their count is kept (hashing them all at every
# start would cost more than the check is worth).
MAX_LISTED_SHARDS = 10_000
# A worker's position is recorded up to this many characters of JSON (its full state is in rank-N.pt).
MAX_POSITION_CHARS = 2_000


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _file_identity(location: str) -> dict[str, Any]:
    """Size and content identity of one shard: BLAKE3 of a local file, ETag or version of an object."""
    if not is_url(location):
        path = Path(location)
        if not path.is_file():
            return {"missing": True}
        return {"bytes": path.stat().st_size, "blake3": file_digest(path)}
    try:
        filesystem, key = fsspec.core.url_to_fs(location)
        info = filesystem.info(key)
    except Exception as err:  # unreachable now: recorded as such, compared like any other value
        return {"unreadable": type(err).__name__}
    identity = {"bytes": info.get("size")}
    for name in ("VersionId", "version_id", "ETag", "etag", "generation", "md5Hash"):
        if info.get(name):
            identity[name.lower()] = str(info[name]).strip('"')
    return identity


def _common_root(locations: Sequence[str]) -> str | None:
    """The folder that holds every local shard (None for URLs): shards are listed relative to it."""
    if not locations or any(is_url(location) for location in locations):
        return None
    root = os.path.commonpath(locations)
    return os.path.dirname(root) if root in locations else root


def _listed(root: str | None, locations: Sequence[str]) -> dict[str, Any]:
    names = sorted(locations)
    if len(names) > MAX_LISTED_SHARDS:
        return {"count": len(names), "listed": False}

    def key(location: str) -> str:
        return os.path.relpath(location, root) if root and not is_url(location) else location

    return {key(location): _file_identity(location) for location in names}


def _hf_shards(dataset: Any) -> tuple[str | None, dict[str, Any]]:
    tables, files = hf_datasets.shard_sources(dataset)
    if tables:
        return None, {f"shard-{i:05d}": {"fingerprint": fp, "rows": rows} for i, (fp, rows) in enumerate(tables)}
    return None, _listed(None, files) if files else {}


def _litdata_shards(dataset: Any) -> tuple[str | None, dict[str, Any]]:
    input_dir = getattr(dataset, "input_dir", None)
    root = getattr(input_dir, "path", None) or getattr(input_dir, "url", None)
    if not root:
        return None, {}
    index = os.path.join(root, "index.json")
    try:
        with open(index, encoding="utf-8") as f:
            chunks = [str(chunk["filename"]) for chunk in json.load(f)["chunks"]]
    except (OSError, ValueError, KeyError, TypeError):
        return root, _listed(root, [index])
    return root, _listed(root, [index, *(os.path.join(root, name) for name in chunks)])


def _webdataset_shards(dataset: Any) -> tuple[str | None, dict[str, Any]]:
    for stage in getattr(dataset, "pipeline", None) or []:
        urls = getattr(stage, "urls", None)
        if isinstance(urls, list) and all(isinstance(u, str) for u in urls):
            root = _common_root(urls)
            return root, _listed(root, urls)
    return None, {}


_LIBRARIES = {"datasets": _hf_shards, "litdata": _litdata_shards, "webdataset": _webdataset_shards}


def stream_manifest(loader: Any) -> dict[str, Any] | None:
    """What a train loader's stream reads, for the data manifest; None for a map-style dataset.

    A dataset of no known library may list its own files as a ``shards`` attribute (paths or URLs).
    """
    dataset = getattr(loader, "dataset", None)
    if not isinstance(dataset, IterableDataset):
        return None
    library = type(dataset).__module__.split(".")[0]
    root, shards = _LIBRARIES.get(library, lambda _: (None, {}))(dataset)
    own = getattr(dataset, "shards", None)
    if not shards and isinstance(own, Sequence) and own and all(isinstance(s, (str, os.PathLike)) for s in own):
        locations = [os.fspath(s) for s in own]
        root = _common_root(locations)
        shards = _listed(root, locations)
    workers = getattr(loader, "num_workers", 0) or 0
    return {
        "library": library if library in _LIBRARIES else "own",
        "version": _version(library) if library in _LIBRARIES else None,
        "dataset": f"{type(dataset).__module__}.{type(dataset).__qualname__}",
        "root": root,
        "shards": shards,
        "num_workers": workers,
        "prefetch_factor": getattr(loader, "prefetch_factor", None) if workers else None,
    }


def _json_safe(value: Any) -> Any:
    text = json.dumps(value, sort_keys=True, default=repr)
    if len(text) <= MAX_POSITION_CHARS:
        return json.loads(text)
    return f"{text[:MAX_POSITION_CHARS]}... ({len(text)} chars)"


def stream_positions(loader_state: Any) -> dict[str, Any]:
    """Where each worker of a saved loader state stands: its dataset's own state, per worker
    (``{"main": ...}`` without workers), as JSON for the manifest."""
    if not isinstance(loader_state, Mapping):
        return {}
    snapshot = loader_state.get("_snapshot")
    if isinstance(snapshot, Mapping):
        workers = snapshot.get("_worker_snapshots") or {}
        return {
            str(worker): _json_safe(dataset_own_state(state.get("dataset_state")))
            for worker, state in workers.items()
            if isinstance(state, Mapping)
        }
    if "dataset_state" in loader_state:
        return {"main": _json_safe(loader_state.get("dataset_state"))}
    return {"loader": _json_safe(dict(loader_state))}  # a library's own loader (LitData, MosaicML)
