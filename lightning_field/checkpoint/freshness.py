"""``ResumeConfig(require_fresh=True)``: a deleted or replaced newer checkpoint is a refusal.

A writer of the checkpoint folder without the key cannot forge a checkpoint, but can still send a
run back: delete the newest checkpoints and point ``LAST`` at an older one, or copy an older folder
over this one. Every checkpoint left verifies; only their age is wrong. So, as TUF's timestamp role
does, rank 0 keeps beside them a signed record of the newest step committed (:data:`FRESHNESS_NAME`),
raised after every persistent commit and never lowered, and ``ckpt_path="last"`` refuses to resume a
step older than the record, a folder whose record is missing while checkpoints exist, or a record
whose signature does not verify. It needs a checkpoint key (``FIELD_CHECKPOINT_KEY``): without one
the record could be rewritten as easily as ``LAST``.

The record is read back as untrusted: at most 4 KiB of JSON, every field type-checked, its
signature checked before any field is believed; anything else is a refusal naming the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from lightning_field.checkpoint.stores import CheckpointStore, describe_error, read_manifest
from lightning_field.core.errors import ResumeMismatchError
from lightning_field.core.signing import KEY_ENV, ManifestKeys, canonical_bytes, keys_from_environment
from lightning_field.core.storage import Location, as_location, basename, join

__all__ = ["FORMAT", "FRESHNESS_NAME", "Freshness", "StaleCheckpointError"]

FRESHNESS_NAME = "FRESHNESS"
FORMAT = "lightning_field.freshness/1"
_MAX_BYTES = 4096


class StaleCheckpointError(ResumeMismatchError):
    """``ckpt_path="last"`` would resume an older step than the signed record of the newest commit."""

    def __init__(self, message: str) -> None:
        super().__init__(message, allowed_by=None)


class Freshness:
    """The record of one checkpoint directory: raised at each commit (rank 0), checked at a resume.

    Args:
        required: refuse a resume older than the record (``resume.require_fresh``); off, nothing is written.

    Raises:
        ValueError: ``required`` without a checkpoint key configured.
    """

    def __init__(self, required: bool) -> None:
        self.required = required
        if required:
            self.keys()  # refused at construction, before a run that cannot keep its record starts

    def keys(self) -> ManifestKeys:
        keys = keys_from_environment()
        if keys is None:
            raise ValueError(
                f"ResumeConfig(require_fresh=True) needs a checkpoint key ({KEY_ENV}): an unsigned record"
                " of the newest step could be rewritten by whoever can delete the checkpoints (docs/security.md)."
            )
        return keys

    def read(self, store: CheckpointStore, dirpath: Location, keys: ManifestKeys) -> int | None:
        """The newest step the record vouches for, or None where there is no record.

        Raises:
            StaleCheckpointError: the record is malformed or its signature does not verify.
        """
        where = join(dirpath, FRESHNESS_NAME)
        try:
            raw = store.read(dirpath, FRESHNESS_NAME)
        except Exception as err:  # a link out of the folder, a store's own error: refused, never trusted
            raise StaleCheckpointError(f"Refusing to resume: {where} cannot be read: {describe_error(err)}.") from None
        if raw is None:
            return None
        try:
            record = json.loads(raw) if len(raw) <= _MAX_BYTES else None
        except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser's depth
            record = None
        if not isinstance(record, dict) or record.get("format") != FORMAT:
            raise StaleCheckpointError(
                f"Refusing to resume: {where} is not a {FORMAT} record (resume.require_fresh=True)."
            )
        problem = keys.check(canonical_bytes(record), record.get("signature"))
        step = record.get("newest_step")
        if problem is None and (not isinstance(step, int) or isinstance(step, bool) or step < 0):
            problem = f"its newest_step is {step!r}, not a step"
        if problem is not None or not isinstance(step, int):
            raise StaleCheckpointError(f"Refusing to resume: {where}: {str(problem).replace('manifest', 'record')}.")
        return step

    def committed(
        self,
        leads: bool,
        store_at: Callable[[Location], CheckpointStore],
        dirpath: str | os.PathLike[str] | None,
        step: int,
        checkpoint: Location,
    ) -> None:
        """After a persistent commit of ``step``: the rank that ``leads`` (rank 0) raises the record to
        it, never lowers it."""
        if not self.required or not leads or dirpath is None:
            return
        where = as_location(dirpath)
        store, keys = store_at(where), self.keys()
        try:
            newest = self.read(store, where, keys)
        except StaleCheckpointError:
            newest = None  # a damaged record is replaced by this run's own, signed
        if newest is not None and newest >= step:
            return
        record: dict[str, Any] = {"format": FORMAT, "newest_step": step, "checkpoint": basename(checkpoint)}
        record["signature"] = keys.sign(canonical_bytes(record))
        store.put(where, FRESHNESS_NAME, json.dumps(record, indent=1).encode())

    def check_resume(
        self, store_at: Callable[[Location], CheckpointStore], dirpath: Location, found: Location | None
    ) -> None:
        """Before ``ckpt_path="last"`` loads ``found`` from under ``dirpath`` (None: nothing to resume,
        training would start at step 0); ``store_at`` reads a location.

        Raises:
            StaleCheckpointError: older than the record, no record beside checkpoints, or a bad record.
        """
        if not self.required:
            return
        step = read_manifest(found, store=store_at(found)).step if found is not None else None
        store = store_at(dirpath)
        newest = self.read(store, dirpath, self.keys())
        where = join(dirpath, FRESHNESS_NAME)
        resumed = "nothing (training would start at step 0)" if step is None else f"step {step}"
        if newest is None and step is not None:
            raise StaleCheckpointError(
                f"Refusing to resume {resumed} from {dirpath}: resume.require_fresh=True, and {where}, the signed"
                " record of the newest step committed, is missing: it was deleted, or these checkpoints were written"
                " without resume.require_fresh. Check the folder; to start trusting it as it is, delete its"
                " checkpoints"
                " or resume once with resume.require_fresh=False."
            )
        if newest is not None and (step is None or step < newest):
            raise StaleCheckpointError(
                f"Refusing to resume {resumed} from {dirpath}: {where} vouches that step {newest} was committed,"
                " and no checkpoint of that step or later is left that verifies. A newer checkpoint was deleted"
                " or replaced (a rollback: docs/security.md); restore it, or pass an explicit ckpt_path to"
                " resume an older one knowingly."
            )
