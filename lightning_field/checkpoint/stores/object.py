"""The commit protocol on an object store (any fsspec URL): no rename, so the manifest is the commit.

S3-like stores make each single PUT atomic and strongly consistent, but cannot rename a prefix. So:

1. Rank 0 first un-commits any checkpoint of the same name (manifest object deleted before its data).
2. Every rank writes its files to a local staging directory, hashing while writing, then uploads
   them under the checkpoint's prefix. Large files go up as parallel multipart uploads.
3. After every rank's receipts are gathered, rank 0 PUTs ``manifest.json``, the one object whose
   existence commits the checkpoint.

A crash before step 3 leaves a prefix without a manifest: the resolver never lists it and the next
run's setup deletes it. There is no ``LAST`` pointer object: "last" is found by listing manifests.
"""

from __future__ import annotations

import contextlib
import logging
import numbers
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

from lightning_field.checkpoint.stores.base import CheckpointWriter, RankOutcome, describe_error, write_staged
from lightning_field.core.hashing import hash_stream
from lightning_field.core.manifest import MANIFEST_NAME, Manifest
from lightning_field.core.storage import StorageOptions, basename, open_fs, to_url

log = logging.getLogger(__name__)

DEFAULT_PART_BYTES = 64 << 20
"""Multipart part size: files of at least two parts are uploaded (and downloaded) in parts."""

DEFAULT_CONCURRENCY = 8
"""Parts in flight at once per file."""

MIN_PART_BYTES = 5 << 20
"""S3's minimum size of every part but the last."""


def check_multipart(
    part_bytes: Any, concurrency: Any, names: tuple[str, str] = ("part_bytes", "max_concurrency")
) -> None:
    """The multipart settings' one check; ``names``: how the caller's user spells them.

    Raises:
        ValueError: a part size that is not an integer of at least 5 MiB, or a concurrency below 1.
    """
    whole = (numbers.Integral,)
    if not isinstance(part_bytes, whole) or isinstance(part_bytes, bool) or part_bytes < MIN_PART_BYTES:
        raise ValueError(f"{names[0]} must be an integer >= 5 MiB (the S3 minimum part size), got {part_bytes!r}")
    if not isinstance(concurrency, whole) or isinstance(concurrency, bool) or concurrency < 1:
        raise ValueError(f"{names[1]} must be an integer >= 1, got {concurrency!r}")


_REMOTE_BLOCK = 16 << 20
"""Read size when hashing an object: large sequential reads, not fsspec's default 5 MiB ranges."""


class ObjectStore:
    """Checkpoint commits, removals and cleanup under an fsspec URL
    (a :class:`~lightning_field.checkpoint.stores.base.CheckpointStore`).

    Args:
        storage_options: passed to fsspec for every access, e.g. ``{"endpoint_url": ...}`` for s3fs.
        part_bytes: multipart part size. S3 requires at least 5 MiB for every part but the last.
        max_concurrency: parts uploaded in parallel per file.
    """

    def __init__(
        self,
        storage_options: StorageOptions | None = None,
        part_bytes: int = DEFAULT_PART_BYTES,
        max_concurrency: int = DEFAULT_CONCURRENCY,
    ) -> None:
        check_multipart(part_bytes, max_concurrency)
        self.storage_options = dict(storage_options or {})
        self.part_bytes = part_bytes
        self.max_concurrency = max_concurrency

    def _fs(self, url: str) -> tuple[Any, str]:
        return open_fs(url, self.storage_options)

    def transfer_options(self, fs: Any) -> dict[str, Any]:
        """s3fs's ``put_file``/``get_file`` split a file of at least two ``chunksize`` parts into a
        multipart transfer of ``max_concurrency`` parts at a time; other filesystems take no options."""
        protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
        if any(p in ("s3", "s3a") for p in protocols):
            return {"chunksize": self.part_bytes, "max_concurrency": self.max_concurrency}
        return {}

    # ------------------------------------------------------------------ the commit protocol
    def prepare(self, final: str) -> None:
        """Rank 0, before any rank writes: un-commit a checkpoint being replaced, manifest first, so
        no reader ever sees its manifest over a mix of old and new objects."""
        self.remove(final)

    writes_in_place = False

    @contextlib.contextmanager
    def staging(self, final: str, token: str) -> Iterator[Path]:
        """A private local directory for one rank's files of one save, removed afterwards: an
        object store has no temporary prefix a crash could not leave behind, the local disk does."""
        staging = Path(tempfile.mkdtemp(prefix=f"lightning-field-stage-{token}-"))
        try:
            yield staging
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def write(self, final: str, token: str, rank: int, files: dict[str, tuple[Any, list[str]]]) -> RankOutcome:
        """Stage this rank's files locally (hashing while writing), then upload them under ``final``.
        Errors are returned, not raised, so every rank still reaches the receipt exchange."""
        return write_staged(cast(CheckpointWriter, self), final, token, rank, files)  # it serves URLs (str)

    def upload(self, final: str, staging: Path, names: list[str]) -> str | None:
        """Put the staged files ``names`` under ``final`` (large ones as parallel multipart uploads);
        the error that stopped it, else None."""
        try:
            fs, prefix = self._fs(final)
            options = self.transfer_options(fs)
            for name in names:
                fs.put_file(str(staging / name), f"{prefix}/{name}", **options)
        except Exception as err:
            return f"upload to {final} failed: {describe_error(err)}"
        return None

    def download(self, url: str, local: Path, names: list[str]) -> None:
        """Copy ``names`` from the checkpoint at ``url`` into ``local`` (large ones in parallel parts)."""
        fs, prefix = self._fs(url)
        options = self.transfer_options(fs)
        for name in names:
            fs.get_file(f"{prefix}/{name}", str(local / name), **options)

    def publish(self, final: str, token: str, manifest: Manifest) -> None:
        """The commit: one PUT of the manifest, which object stores make visible atomically."""
        fs, prefix = self._fs(final)
        fs.pipe_file(f"{prefix}/{MANIFEST_NAME}", manifest.to_json().encode())

    def discard(self, final: str, token: str) -> None:
        fs, prefix = self._fs(final)
        with contextlib.suppress(FileNotFoundError):
            fs.rm(prefix, recursive=True)

    def remove(self, final: str) -> None:
        """Delete a checkpoint: its manifest first, so it is never listed while half-deleted."""
        fs, prefix = self._fs(final)
        with contextlib.suppress(FileNotFoundError):
            fs.rm_file(f"{prefix}/{MANIFEST_NAME}")
        with contextlib.suppress(FileNotFoundError):
            fs.rm(prefix, recursive=True)
        fs.invalidate_cache(prefix)

    def clean_leftovers(self, dirpath: str) -> list[str]:
        """Delete every prefix under ``dirpath`` that holds objects but no manifest: saves that were
        interrupted (or removals that were) before their commit. Run only when no save is in flight."""
        fs, root = self._fs(dirpath)
        fs.invalidate_cache(root)
        try:
            children = fs.ls(root, detail=True)
        except FileNotFoundError:
            return []
        removed = []
        for child in children:
            if child.get("type") != "directory":
                continue
            prefix = child["name"].rstrip("/")
            if fs.exists(f"{prefix}/{MANIFEST_NAME}"):
                continue
            fs.rm(prefix, recursive=True)
            removed.append(to_url(fs, prefix))
        return removed

    # ------------------------------------------------------------------ reading
    def exists(self, dirpath: str) -> bool:
        """Whether any object lies under ``dirpath`` (``field ckpt list`` tells absent from empty)."""
        fs, prefix = self._fs(dirpath)
        return bool(fs.exists(prefix))

    def checkpoints(self, dirpath: str) -> list[str]:
        # One listing of the committed manifests, never a pointer object: a pointer would be a second,
        # separately written truth that a crash could leave naming a checkpoint that does not exist.
        fs, prefix = self._fs(dirpath)
        found = (to_url(fs, manifest.rsplit("/", 1)[0]) for manifest in fs.glob(f"{prefix}/*/{MANIFEST_NAME}"))
        return [checkpoint for checkpoint in found if not basename(checkpoint).startswith(".")]

    def read(self, checkpoint: str, name: str) -> bytes | None:
        fs, prefix = self._fs(checkpoint)
        try:
            return bytes(fs.cat_file(f"{prefix}/{name}"))
        except (FileNotFoundError, IsADirectoryError):
            return None

    def put(self, checkpoint: str, name: str, data: bytes) -> None:
        fs, prefix = self._fs(checkpoint)
        fs.pipe_file(f"{prefix}/{name}", data)  # one PUT: atomic on S3-like stores

    def size(self, checkpoint: str, name: str) -> int | None:
        fs, prefix = self._fs(checkpoint)
        try:
            info = fs.info(f"{prefix}/{name}")
        except FileNotFoundError:
            return None
        return int(info["size"]) if info.get("type") == "file" else None

    def digest(self, checkpoint: str, name: str, on_chunk: Callable[[int], None], algorithm: str) -> str:
        fs, prefix = self._fs(checkpoint)
        with fs.open(f"{prefix}/{name}", "rb", block_size=_REMOTE_BLOCK) as f:
            return hash_stream(f, progress=on_chunk, algorithm=algorithm, threads=True)[1]

    def describe(self, checkpoint: str, name: str) -> str:
        return f"{checkpoint}/{name}"

    @contextlib.contextmanager
    def local_copy(self, checkpoint: str, names: list[str]) -> Iterator[Path]:
        with tempfile.TemporaryDirectory(prefix="lightning-field-load-") as staging:
            local = Path(staging)
            self.download(checkpoint, local, names)
            yield local
