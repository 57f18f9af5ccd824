"""``CheckpointStore``: where a checkpoint's bytes go, how a save becomes visible there, and how
every byte is read back.

Modelled on torch DCP's ``StorageWriter`` and ``StorageReader``: the protocol says which side calls
what, in which order, so a new backend (a different object store, a test double that fails one
save) implements it and inherits every guarantee of the commit protocol in ``commit.py``, and every
reader (the resolver, verification, the load, ``field ckpt``) reads through it. Two ship, one module
each: :class:`~lightning_field.checkpoint.stores.local.LocalStore` (a POSIX filesystem: hidden
directory, fsync, atomic rename) and :class:`~lightning_field.checkpoint.stores.object.ObjectStore`
(an fsspec URL: local staging, multipart upload, the manifest PUT as the commit).
:func:`~lightning_field.checkpoint.stores.store_for` picks one from a ``dirpath``, once; pass your
own as ``StorageConfig(store=...)``.

The receipts a rank's write returns live here too, with the protocol that returns them, so that
the sharded writer can report in them without importing the commit that drives it.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from lightning_field.core.fsio import HashingWriter, fsync_dir
from lightning_field.core.manifest import Manifest
from lightning_field.core.storage import Location


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


@runtime_checkable
class CheckpointWriter(Protocol):
    """One save, as the callback drives it (``final`` is the checkpoint's path or URL, ``token``
    names this save's attempt, the coordinator is global rank 0):

    1. coordinator: :meth:`prepare` ``(final)``, before any rank writes;
    2. every rank: :meth:`write` ``(final, token, rank, files)`` hashes each file while writing it
       and returns its receipts, or the error, never raising, so every rank still reaches step 3;
       sharded saves write into :meth:`staging` ``(final, token)`` instead and then :meth:`upload`;
    3. the ranks exchange their receipts (a collective, the callback's job);
    4. coordinator: :meth:`publish` ``(final, token, manifest)`` when every rank succeeded, which
       makes the checkpoint visible in one atomic step, or :meth:`discard` ``(final, token)``.

    Outside saves: :meth:`remove` ``(final)`` for retention, on the coordinator;
    :meth:`clean_leftovers` ``(dirpath)`` at setup, on the coordinator, with no save in flight.
    Nothing a store does before ``publish`` may be visible to a reader as a checkpoint.
    """

    writes_in_place: bool
    """True when :meth:`staging` is where the published checkpoint will live (files are then
    written durably there); False when staged files are only a local copy for :meth:`upload`."""

    def prepare(self, final: Location) -> None: ...

    def write(self, final: Location, token: str, rank: int, files: dict[str, tuple[Any, list[str]]]) -> RankOutcome: ...

    def staging(self, final: Location, token: str) -> AbstractContextManager[Path]: ...

    def upload(self, final: Location, staging: Path, names: list[str]) -> str | None: ...

    def publish(self, final: Location, token: str, manifest: Manifest) -> None: ...

    def discard(self, final: Location, token: str) -> None: ...

    def remove(self, final: Location) -> None: ...

    def clean_leftovers(self, dirpath: Location) -> list[Any]: ...


@runtime_checkable
class CheckpointReader(Protocol):
    """Every read of a checkpoint, on any rank, at any time (other jobs may be writing: nothing is
    cached). ``checkpoint`` is one checkpoint's path or URL, ``name`` a file in it, as its manifest
    names it."""

    def checkpoints(self, dirpath: Location) -> list[Location]:
        """The committed checkpoints directly under ``dirpath``, in no order: those whose manifest
        was published, never a hidden in-flight save or removal; ``[]`` where ``dirpath`` is absent."""
        ...

    def read(self, checkpoint: Location, name: str) -> bytes | None:
        """A small document's bytes (the manifest, a record beside it), or None where there is none."""
        ...

    def put(self, checkpoint: Location, name: str, data: bytes) -> None:
        """A small document beside the manifest, replaced atomically (a restore drill's record)."""
        ...

    def size(self, checkpoint: Location, name: str) -> int | None:
        """The file's size in bytes, or None where there is no such file."""
        ...

    def digest(self, checkpoint: Location, name: str, on_chunk: Callable[[int], None], algorithm: str) -> str:
        """The file's hash (hex) by ``algorithm``, calling ``on_chunk(n)`` as each ``n`` bytes are read."""
        ...

    def describe(self, checkpoint: Location, name: str) -> str:
        """How an error names the file: its full path or URL."""
        ...

    def local_copy(self, checkpoint: Location, names: list[str]) -> AbstractContextManager[Path]:
        """A local directory holding ``names`` as stored, for as long as the context lasts: the
        checkpoint itself on a local disk, a private download elsewhere. What the load verifies
        and reads is this copy, so the bytes loaded are the bytes hashed."""
        ...


@runtime_checkable
class CheckpointStore(CheckpointWriter, CheckpointReader, Protocol):
    """A reader and a writer of one kind of storage: what :func:`~lightning_field.checkpoint.stores.store_for`
    returns, and what ``StorageConfig(store=...)`` takes. A store that only writes (this
    protocol's writing half, as earlier versions defined it) is still taken, and read through the
    default store of its ``dirpath``.

    Two optional methods, used where a store has them and done without where it does not:
    ``exists(dirpath) -> bool`` (``field ckpt list`` tells an absent location from an empty one;
    without it, one with no checkpoint counts as absent) and ``linked_copy(checkpoint, name)``
    (a copy sharing the files' bytes, which keeps a checkpoint a restore drill is loading whole
    through retention; without it, a drill may find its checkpoint removed, and says so)."""


def save_durably(obj: Any, path: Path, durable: bool = True) -> tuple[int, str]:
    """``torch.save`` straight to disk through a hashing writer; returns (size, hash).

    ``durable=False`` skips the fsync, for local staging copies whose durability is the upload's job.
    """
    # Imported here: reading a checkpoint (``field ckpt``) goes through the stores and must not pay for torch.
    from lightning_field.compat.torch import save_without_crc32

    writer = HashingWriter(path)
    try:
        save_without_crc32(obj, writer)  # the manifest's hash covers every byte instead
        return writer.finish(sync=durable)
    except BaseException:
        writer.close()
        raise


def write_staged(
    store: CheckpointWriter, final: Location, token: str, rank: int, files: dict[str, tuple[Any, list[str]]]
) -> RankOutcome:
    """``store.write`` for a store that does not write in place: this rank's files staged in
    ``store.staging`` (hashing while writing, no fsync: durability is the upload's), then
    ``store.upload``-ed. Errors are returned, not raised, like :func:`write_rank_files`'s."""
    with store.staging(final, token) as staging:
        outcome = write_rank_files(staging, rank, files, durable=False)
        if outcome.error is None:
            outcome.error = store.upload(final, staging, [receipt.file for receipt in outcome.receipts])
        return outcome


def write_rank_files(
    tmp: Path,
    rank: int,
    files: dict[str, tuple[Any, list[str]]],
    durable: bool = True,
    save: Callable[[Any, Path, bool], tuple[int, str]] = save_durably,
) -> RankOutcome:
    """Write this rank's files into ``tmp`` with ``save`` (``torch.save`` by default; the snapshot
    store's raw tensor files); errors are returned, not raised, so every rank still reaches the
    receipt exchange and nobody waits forever on a rank that failed."""
    start = time.perf_counter()
    receipts = []
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        for name, (obj, contents) in files.items():
            size, digest = save(obj, tmp / name, durable)
            receipts.append(Receipt(name, size, digest, rank, contents))
        if durable:
            fsync_dir(tmp)
    except Exception as err:
        return RankOutcome(rank, receipts, describe_error(err), time.perf_counter() - start)
    return RankOutcome(rank, receipts, None, time.perf_counter() - start)
