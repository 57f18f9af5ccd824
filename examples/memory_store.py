"""A checkpoint store of your own: checkpoints kept in a dict (a test double, or the start of a
backend for storage lightning_field has no store for). It passes the same conformance tests as the
stores that ship (tests/test_stores.py), and
``ManifestCheckpoint(storage=StorageConfig(store=MemoryStore()))`` uses it for every write and every
read. docs/checkpoints.md walks through it.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from lightning_field.checkpoint.stores.base import RankOutcome, write_staged
from lightning_field.core.hashing import new_hasher
from lightning_field.core.manifest import MANIFEST_NAME, Manifest


class MemoryStore:
    """Checkpoints as ``{checkpoint: {file name: bytes}}``; a checkpoint exists once its manifest does."""

    writes_in_place = False  # staged files are a local copy, handed over by upload

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, bytes]] = {}
        self.pending: dict[str, dict[str, bytes]] = {}  # a save's files, until its publish

    # --- writing: stage locally, upload into pending, publish makes it visible in one step
    def prepare(self, final: Any) -> None:
        self.remove(final)

    @contextlib.contextmanager
    def staging(self, final: Any, token: str) -> Iterator[Path]:
        with tempfile.TemporaryDirectory() as staging:
            yield Path(staging)

    def write(self, final: Any, token: str, rank: int, files: dict[str, tuple[Any, list[str]]]) -> RankOutcome:
        return write_staged(self, final, token, rank, files)  # stage, then upload

    def upload(self, final: Any, staging: Path, names: list[str]) -> str | None:
        self.pending.setdefault(str(final), {}).update({name: (staging / name).read_bytes() for name in names})
        return None

    def publish(self, final: Any, token: str, manifest: Manifest) -> None:
        files = self.pending.pop(str(final), {})
        self.objects[str(final)] = {**files, MANIFEST_NAME: manifest.to_json().encode()}

    def discard(self, final: Any, token: str) -> None:
        self.pending.pop(str(final), None)

    def remove(self, final: Any) -> None:
        self.objects.pop(str(final), None)

    def clean_leftovers(self, dirpath: Any) -> list[Any]:
        return []  # nothing outlives the process, so nothing is left over

    # --- reading
    def checkpoints(self, dirpath: Any) -> list[str]:
        return [name for name in self.objects if name.rpartition("/")[0] == str(dirpath).rstrip("/")]

    def read(self, checkpoint: Any, name: str) -> bytes | None:
        return self.objects.get(str(checkpoint), {}).get(name)

    def put(self, checkpoint: Any, name: str, data: bytes) -> None:
        self.objects.setdefault(str(checkpoint), {})[name] = data  # a checkpoint's file, or the directory's own

    def size(self, checkpoint: Any, name: str) -> int | None:
        data = self.read(checkpoint, name)
        return None if data is None else len(data)

    def digest(self, checkpoint: Any, name: str, on_chunk: Callable[[int], None], algorithm: str) -> str:
        data = self.objects[str(checkpoint)][name]
        hasher = new_hasher(algorithm)  # the algorithm the manifest's format names
        hasher.update(data)
        on_chunk(len(data))
        return str(hasher.hexdigest())

    def describe(self, checkpoint: Any, name: str) -> str:
        return f"memory:{checkpoint}/{name}"

    @contextlib.contextmanager
    def local_copy(self, checkpoint: Any, names: list[str]) -> Iterator[Path]:
        with tempfile.TemporaryDirectory() as copy:
            for name in names:
                (Path(copy) / name).write_bytes(self.objects[str(checkpoint)][name])
            yield Path(copy)
