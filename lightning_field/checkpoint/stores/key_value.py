"""``KeyValueStore``: a whole checkpoint store over any storage that gets, sets, lists and deletes
objects by key. Subclass it, write those four methods, and ``StorageConfig(store=...)`` or
``Checkpointer(store=...)`` uses it for every write and read, with the same commit rule as the
object store: a checkpoint's files go up first, and its manifest, set last, is the commit.

A checkpoint is the key prefix ``<dirpath>/<name>``; each file is the key ``<checkpoint>/<file>``.
The one thing the backend must give is that a single :meth:`KeyValueStore.set` is atomic: a reader
sees the whole value or none of it. ``examples/sqlite_store.py`` is one in about 30 lines.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from lightning_field.checkpoint.stores.base import RankOutcome, describe_error, write_staged
from lightning_field.core.hashing import new_hasher
from lightning_field.core.manifest import MANIFEST_NAME, Manifest
from lightning_field.core.member_paths import check_member_name

__all__ = ["KeyValueStore"]


class KeyValueStore:
    """The :class:`~lightning_field.checkpoint.stores.base.CheckpointStore` protocol over four methods a
    subclass writes: :meth:`get`, :meth:`set`, :meth:`keys` and :meth:`delete`."""

    writes_in_place = False  # files are staged locally, then set one key each

    # ------------------------------------------------------------------ what a subclass writes
    def get(self, key: str) -> bytes | None:
        """The value of ``key``, or None where there is none."""
        raise NotImplementedError

    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key``, atomically (a reader sees all of it or none), replacing any."""
        raise NotImplementedError

    def keys(self, prefix: str) -> list[str]:
        """Every key that starts with ``prefix``, in any order."""
        raise NotImplementedError

    def delete(self, key: str) -> None:
        """Remove ``key``; nothing happens where there is none."""
        raise NotImplementedError

    # ------------------------------------------------------------------ writing
    def prepare(self, final: Any) -> None:
        self.remove(final)  # a checkpoint of the same name is un-committed first, manifest first

    @contextlib.contextmanager
    def staging(self, final: Any, token: str) -> Iterator[Path]:
        with tempfile.TemporaryDirectory(prefix=f"lightning-field-stage-{token}-") as staging:
            yield Path(staging)

    def write(self, final: Any, token: str, rank: int, files: dict[str, tuple[Any, list[str]]]) -> RankOutcome:
        return write_staged(self, final, token, rank, files)

    def upload(self, final: Any, staging: Path, names: list[str]) -> str | None:
        try:
            for name in names:
                self.set(_key(final, name), (staging / name).read_bytes())
        except Exception as err:  # returned, not raised: every rank still reaches the receipt exchange
            return f"upload to {final} failed: {describe_error(err)}"
        return None

    def publish(self, final: Any, token: str, manifest: Manifest) -> None:
        self.set(_key(final, MANIFEST_NAME), manifest.to_json().encode())

    def discard(self, final: Any, token: str) -> None:
        self._delete_all(final)

    def remove(self, final: Any) -> None:
        self.delete(_key(final, MANIFEST_NAME))  # first: never listed while half-deleted
        self._delete_all(final)

    def clean_leftovers(self, dirpath: Any) -> list[Any]:
        """Delete every checkpoint prefix under ``dirpath`` with files but no manifest (run with no save in flight)."""
        root = _prefix(dirpath)
        children = {key[len(root) :].split("/", 1)[0] for key in self.keys(root) if "/" in key[len(root) :]}
        prefixes = [f"{root}{child}" for child in sorted(children)]
        leftovers = [prefix for prefix in prefixes if self.get(_key(prefix, MANIFEST_NAME)) is None]
        for leftover in leftovers:
            self._delete_all(leftover)
        return leftovers

    def _delete_all(self, checkpoint: Any) -> None:
        for key in self.keys(_prefix(checkpoint)):
            self.delete(key)

    # ------------------------------------------------------------------ reading
    def exists(self, dirpath: Any) -> bool:
        return bool(self.keys(_prefix(dirpath)))

    def checkpoints(self, dirpath: Any) -> list[str]:
        root = _prefix(dirpath)
        found = [key[len(root) :].split("/") for key in self.keys(root)]
        return [f"{root}{parts[0]}" for parts in found if parts[1:] == [MANIFEST_NAME] and not parts[0].startswith(".")]

    def read(self, checkpoint: Any, name: str) -> bytes | None:
        return self.get(_key(checkpoint, name))

    def put(self, checkpoint: Any, name: str, data: bytes) -> None:
        self.set(_key(checkpoint, name), data)

    def size(self, checkpoint: Any, name: str) -> int | None:
        value = self.get(_key(checkpoint, name))
        return None if value is None else len(value)

    def digest(self, checkpoint: Any, name: str, on_chunk: Callable[[int], None], algorithm: str) -> str:
        value = self.get(_key(checkpoint, name))
        if value is None:
            raise FileNotFoundError(self.describe(checkpoint, name))
        hasher = new_hasher(algorithm)
        hasher.update(value)
        on_chunk(len(value))
        return str(hasher.hexdigest())

    def describe(self, checkpoint: Any, name: str) -> str:
        return f"{type(self).__name__}:{_key(checkpoint, name)}"

    @contextlib.contextmanager
    def local_copy(self, checkpoint: Any, names: list[str]) -> Iterator[Path]:
        with tempfile.TemporaryDirectory(prefix="lightning-field-copy-") as copy:
            for name in names:
                value = self.get(_key(checkpoint, name))
                if value is not None:  # an absent one is what verification of the copy reports
                    (Path(copy) / name).write_bytes(value)
            yield Path(copy)


def _prefix(location: Any) -> str:
    return f"{os.fspath(location).rstrip('/')}/"


def _key(checkpoint: Any, name: str) -> str:
    # Names come from manifests others can write: one that leaves its checkpoint is refused.
    return f"{_prefix(checkpoint)}{check_member_name(name, checkpoint)}"
