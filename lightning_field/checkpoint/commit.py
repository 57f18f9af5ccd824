"""The commit protocol: how a checkpoint directory goes from nothing to advertised.

1. Every rank writes its files into a hidden temporary directory, hashing while writing, and fsyncs.
2. Every rank's receipts (file, size, hash) are gathered.
3. Rank 0 writes ``manifest.json`` (temporary file, fsync, rename), renames the directory into
   place, fsyncs the parent, and replaces the ``LAST`` pointer.

A crash at any point before step 3's directory rename leaves only a hidden ``.tmp-*`` directory,
which no resolver considers and the next run deletes. After it, the checkpoint is complete.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_field.checkpoint.resolver import LAST_POINTER, TEMP_PREFIXES
from lightning_field.compat.torch import save_without_crc32
from lightning_field.core.fsio import HashingWriter, atomic_write_bytes, exchange_or_replace_dir, fsync_dir
from lightning_field.core.manifest import FileEntry, Manifest


class CheckpointSaveError(RuntimeError):
    """A save failed on some rank; nothing was committed and earlier checkpoints are untouched."""


@dataclass
class Receipt:
    file: str
    size: int
    hash: str
    rank: int
    contents: list[str]


@dataclass
class RankOutcome:
    rank: int
    receipts: list[Receipt]
    error: str | None = None
    seconds: float = 0.0


def temp_dir_for(dirpath: Path, name: str, token: str) -> Path:
    return dirpath / f".tmp-{name}-{token}"


def save_durably(obj: Any, path: Path, durable: bool = True) -> tuple[int, str]:
    """``torch.save`` straight to disk through a hashing writer; returns (size, hash).

    ``durable=False`` skips the fsync, for local staging copies whose durability is the upload's job.
    """
    writer = HashingWriter(path)
    try:
        save_without_crc32(obj, writer)  # the manifest's hash covers every byte instead
        return writer.finish(sync=durable)
    except BaseException:
        writer.close()
        raise


def write_rank_files(
    tmp: Path, rank: int, files: dict[str, tuple[Any, list[str]]], durable: bool = True
) -> RankOutcome:
    """Write this rank's files into ``tmp``; errors are returned, not raised, so every rank still
    reaches the receipt exchange and nobody waits forever on a rank that failed."""
    start = time.perf_counter()
    receipts = []
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        for name, (obj, contents) in files.items():
            size, digest = save_durably(obj, tmp / name, durable)
            receipts.append(Receipt(name, size, digest, rank, contents))
        if durable:
            fsync_dir(tmp)
    except Exception as err:
        return RankOutcome(rank, receipts, describe_error(err), time.perf_counter() - start)
    return RankOutcome(rank, receipts, None, time.perf_counter() - start)


def describe_error(err: BaseException) -> str:
    """A one-line cause, calling out a full disk explicitly (torch wraps the OSError in a RuntimeError)."""
    chain: list[BaseException] = []
    cur: BaseException | None = err
    while cur is not None and cur not in chain:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    for e in chain:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return f"the disk is full or over quota ({e.strerror}) while writing {e.filename or 'checkpoint data'}"
        if isinstance(e, OSError) and e.errno == errno.EFBIG:
            return f"a file size limit was exceeded ({e.strerror}) while writing {e.filename or 'checkpoint data'}"
    text = " ".join(str(e) for e in chain)
    if "No space left" in text:
        return f"the disk is full (write failed: {chain[0]})"
    return f"{type(err).__name__}: {err}"


def manifest_files(outcomes: list[RankOutcome]) -> dict[str, FileEntry]:
    return {r.file: FileEntry(r.size, r.hash, r.rank, r.contents) for o in outcomes for r in o.receipts}


def write_last_pointer(dirpath: str | os.PathLike[str], checkpoint: str | os.PathLike[str]) -> None:
    """Point ``LAST`` at ``checkpoint`` by atomic replace: readers (``resolver.read_last_pointer``)
    never see it missing. Written last in :func:`publish`, after the directory rename."""
    atomic_write_bytes(Path(dirpath) / LAST_POINTER, (Path(checkpoint).name + "\n").encode())


def publish(tmp: Path, final: Path, manifest: Manifest) -> None:
    """Rank 0's step 3: manifest last, then the directory rename that makes it visible, then LAST."""
    manifest.write(tmp)
    fsync_dir(tmp)
    replaced = exchange_or_replace_dir(tmp, final)
    fsync_dir(final.parent)
    write_last_pointer(final.parent, final)
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)


def discard(tmp: Path) -> None:
    shutil.rmtree(tmp, ignore_errors=True)


def remove_committed(path: Path) -> None:
    """Delete a checkpoint so that no reader ever sees it half-deleted: hide it by rename first."""
    if not path.exists():
        return
    hidden = path.with_name(f".trash-{path.name}-{os.getpid()}")
    os.rename(path, hidden)
    fsync_dir(path.parent)
    shutil.rmtree(hidden, ignore_errors=True)


def clean_leftovers(dirpath: Path) -> list[Path]:
    """Delete the hidden directories interrupted saves and removals left behind."""
    removed = []
    if not dirpath.is_dir():
        return removed
    for child in dirpath.iterdir():
        if child.is_dir() and child.name.startswith(TEMP_PREFIXES):
            shutil.rmtree(child, ignore_errors=True)
            removed.append(child)
    return removed


class LocalStore:
    """The commit protocol on a POSIX filesystem: hidden temporary directory, fsync, atomic rename.
    A :class:`~lightning_field.checkpoint.store.CheckpointStore`."""

    writes_in_place = True

    def prepare(self, final: Path) -> None:
        """Nothing to do: the rename in :meth:`publish` swaps out any checkpoint of the same name."""

    def hidden_dir(self, final: Path, token: str) -> Path:
        """The hidden directory this save's files are written into before the rename publishes it."""
        return temp_dir_for(final.parent, final.name, token)

    @contextlib.contextmanager
    def staging(self, final: Path, token: str) -> Iterator[Path]:
        """The hidden directory itself: what is written there is what the rename publishes."""
        yield self.hidden_dir(final, token)

    def upload(self, final: Path, staging: Path, names: list[str]) -> str | None:
        """Nothing to upload: the files are already in place."""
        return None

    def write(self, final: Path, token: str, rank: int, files: dict[str, tuple[Any, list[str]]]) -> RankOutcome:
        return write_rank_files(self.hidden_dir(final, token), rank, files)

    def publish(self, final: Path, token: str, manifest: Manifest) -> None:
        publish(temp_dir_for(final.parent, final.name, token), final, manifest)

    def discard(self, final: Path, token: str) -> None:
        discard(temp_dir_for(final.parent, final.name, token))

    def remove(self, final: Path) -> None:
        remove_committed(final)

    def clean_leftovers(self, dirpath: Path) -> list[Path]:
        return clean_leftovers(dirpath)
