"""``CheckpointStore``: where a checkpoint's bytes go, and how a save becomes visible there.

Modelled on torch DCP's ``StorageWriter``: the protocol says which side calls what, in which
order, so a new backend (a different object store, a test double that fails one save) implements
five methods and inherits every guarantee of the commit protocol in ``commit.py``. Two ship:
:class:`~lightning_field.checkpoint.commit.LocalStore` (a POSIX filesystem: hidden directory,
fsync, atomic rename) and :class:`~lightning_field.checkpoint.object_store.ObjectStore` (an fsspec
URL: local staging, multipart upload, the manifest PUT as the commit). Pass your own as
``ManifestCheckpoint(store=...)``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from lightning_field.checkpoint.commit import RankOutcome
from lightning_field.core.manifest import Manifest
from lightning_field.core.storage import Location


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
