"""``CheckpointStore``: where a checkpoint's bytes go, and how a save becomes visible there.

Modelled on torch DCP's ``StorageWriter``: the protocol says which side calls what, in which
order, so a new backend (a different object store, a test double that fails one save) implements
five methods and inherits every guarantee of the commit protocol in ``commit.py``. Two ship:
:class:`~lightning_field.checkpoint.commit.LocalStore` (a POSIX filesystem: hidden directory,
fsync, atomic rename) and :class:`~lightning_field.checkpoint.object_store.ObjectStore` (an fsspec
URL: local staging, multipart upload, the manifest PUT as the commit). Pass your own as
``ManifestCheckpoint(store=...)``.

The receipts a rank's write returns live here too, with the protocol that returns them, so that
the sharded writer can report in them without importing the commit that drives it.
"""

from __future__ import annotations

import errno
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

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
class CheckpointStore(Protocol):
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
