"""Where checkpoints live: one reader/writer store per kind of storage, chosen once from a location.

:func:`store_for` is the one place that tells a local directory from an object-store URL; every
reader (:func:`read_manifest`, the resolver, verification, the load, ``field ckpt``) and the commit
go through the store it returns, or through the one a user gave ``StorageConfig(store=...)``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import cast

from lightning_field.checkpoint.stores.base import (
    CheckpointReader,
    CheckpointStore,
    CheckpointWriter,
    RankOutcome,
    Receipt,
    describe_error,
)
from lightning_field.checkpoint.stores.key_value import KeyValueStore
from lightning_field.checkpoint.stores.local import LocalStore, named_checkpoint
from lightning_field.checkpoint.stores.object import DEFAULT_CONCURRENCY, DEFAULT_PART_BYTES, ObjectStore
from lightning_field.core.manifest import (
    DRILL_RECORD_NAME,
    MANIFEST_NAME,
    SHARED_STATE_FILE,
    Manifest,
    ManifestError,
    drill_record_bytes,
    manifest_from_bytes,
)
from lightning_field.core.member_paths import UnsafeMemberError
from lightning_field.core.storage import Location, StorageOptions, as_location, is_url, join

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_PART_BYTES",
    "CheckpointReader",
    "CheckpointStore",
    "CheckpointWriter",
    "KeyValueStore",
    "LocalStore",
    "ObjectStore",
    "RankOutcome",
    "Receipt",
    "checkpoint_location",
    "describe_error",
    "is_checkpoint",
    "location_exists",
    "read_manifest",
    "store_for",
    "write_drill_record",
]

log = logging.getLogger(__name__)


def store_for(
    location: str | os.PathLike[str],
    storage_options: StorageOptions | None = None,
    given: CheckpointWriter | None = None,
    object_store: ObjectStore | None = None,
) -> CheckpointStore:
    """The store for checkpoints at or under ``location``: ``given`` where it reads as well as
    writes; else a :class:`LocalStore` for a path (``file://`` included), and for any other fsspec
    URL ``object_store`` or an :class:`ObjectStore` with ``storage_options``.

    A ``given`` store that only writes (the protocol of earlier versions) keeps writing; its
    checkpoints are read through the default store of ``location``.
    """
    if isinstance(given, CheckpointReader):
        return cast(CheckpointStore, given)
    # Each serves the Location kind it is chosen for (LocalStore: a Path), which the Protocol cannot say.
    if is_url(location):
        return cast(CheckpointStore, object_store or ObjectStore(storage_options))
    return cast(CheckpointStore, LocalStore())


def checkpoint_location(path: str | os.PathLike[str]) -> Location:
    """The checkpoint ``path`` names: its folder where ``path`` is the ``<name>.ckpt`` a commit advertised
    beside it (:func:`~lightning_field.checkpoint.stores.local.advertise`) or another name of that file
    in the same folder (``save_last``'s ``last.ckpt``), the prefix where ``path`` is an object store's
    ``<prefix>/state.pt``, else ``path`` itself. Every reader takes either, so
    what ModelCheckpoint's ``best_model_path`` and ``last_model_path`` name is verified as the folder."""
    location = as_location(path)
    if isinstance(location, Path):
        return (named_checkpoint(location) or location) if location.is_file() else location
    # An object store's advertised path is the committed prefix's own state.pt (no links there).
    prefix, _, name = location.rpartition("/")
    return prefix if name == SHARED_STATE_FILE and "://" in prefix else location


def location_exists(
    location: str | os.PathLike[str],
    storage_options: StorageOptions | None = None,
    store: CheckpointStore | None = None,
) -> bool:
    """Whether ``location`` is an existing directory or prefix, as its store sees it; a store of
    your own without the optional ``exists`` says so by listing at least one checkpoint there."""
    reader = store_for(location, storage_options, store)
    where = as_location(location)
    exists = getattr(reader, "exists", None)
    return bool(exists(where)) if callable(exists) else bool(reader.checkpoints(where))


def read_manifest(
    checkpoint: str | os.PathLike[str],
    storage_options: StorageOptions | None = None,
    store: CheckpointReader | None = None,
) -> Manifest:
    """The checkpoint's manifest, with what was recorded of it after its commit (a restore drill's
    outcome, from ``restore_drill.json`` beside it): the one reader of both.

    Raises:
        ManifestError: naming the file, when the manifest or the drill record beside it is missing
            (the manifest), not JSON, of a format this version cannot read, or lacks a field.
    """
    location = checkpoint_location(checkpoint)
    reader = store or store_for(location, storage_options)
    try:
        raw = reader.read(location, MANIFEST_NAME)
        drill = reader.read(location, DRILL_RECORD_NAME) if raw is not None else None
    except OSError as err:
        raise ManifestError(f"{join(location, MANIFEST_NAME)}: cannot be read ({err})") from err
    except UnsafeMemberError as err:
        raise ManifestError(str(err)) from None
    return manifest_from_bytes(raw, join(location, MANIFEST_NAME), drill, join(location, DRILL_RECORD_NAME))


def is_checkpoint(
    location: str | os.PathLike[str],
    storage_options: StorageOptions | None = None,
    store: CheckpointReader | None = None,
) -> bool:
    """Whether ``location`` holds a committed checkpoint (its manifest is there)."""
    where = checkpoint_location(location)
    return (store or store_for(where, storage_options)).size(where, MANIFEST_NAME) is not None


def write_drill_record(
    checkpoint: str | os.PathLike[str],
    record: dict[str, object],
    passed: bool,
    storage_options: StorageOptions | None = None,
    store: CheckpointReader | None = None,
) -> None:
    """Record a restore drill of a committed checkpoint beside its manifest, which stays as its commit
    wrote it: atomically in a local folder, in one PUT under a URL."""
    where: Location = as_location(checkpoint)
    (store or store_for(where, storage_options)).put(where, DRILL_RECORD_NAME, drill_record_bytes(record, passed))
