"""Finding the checkpoint to resume from: the newest one that is committed, recoverable and intact."""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping
from dataclasses import dataclass, field

from lightning_field.checkpoint.stores import CheckpointReader, read_manifest, store_for
from lightning_field.checkpoint.stores.local import LAST_POINTER, TEMP_PREFIXES
from lightning_field.checkpoint.verify import VerifyReport, name_step_problem, steps_in_name, verify_checkpoint
from lightning_field.core.manifest import Manifest, ManifestError
from lightning_field.core.member_paths import UnsafeMemberError, member_name_problem
from lightning_field.core.storage import Location, StorageOptions, as_location, basename, join, same_location

log = logging.getLogger(__name__)

__all__ = [
    "LAST_POINTER",
    "TEMP_PREFIXES",
    "CheckpointEntry",
    "InexactChoice",
    "Resolution",
    "committed_checkpoints",
    "last_pointer_rollback",
    "latest_recoverable",
    "read_last_pointer",
    "steps_in_name",
]


@dataclass(frozen=True)
class InexactChoice:
    """An unrecoverable checkpoint resumed on purpose (``ResumeConfig(inexact=True)``), and what it lacks:
    every later manifest records it as ``provenance.inexact_resume``."""

    checkpoint: str
    missing: tuple[str, ...]

    def record(self) -> dict[str, object]:
        return {"checkpoint": self.checkpoint, "missing": list(self.missing)}


@dataclass(frozen=True)
class Resolution:
    """What ``ckpt_path="last"`` resolved to, decided once over the tiers: the path every rank loads
    (None: nothing committed, training starts at step 0), the tier it came from, this process's
    verification of it, and whether it is an unrecoverable checkpoint chosen on purpose. The callback
    hands it to its resume guard and its load; nothing that resolves writes either."""

    path: str | None
    tier: str = "persistent"  # "persistent", "snapshot" (this node held it) or "replica" (received from a node)
    inexact: InexactChoice | None = None
    verification: VerifyReport | None = field(default=None, compare=False, hash=False)
    """The pick's verification made here, which the load hands on instead of hashing the files again
    (a file changed since is hashed again: :func:`~lightning_field.checkpoint.verify.verify_against`);
    None where nothing here verified it (an inexact pick, a copy received from another node)."""

    def verification_of(self, checkpoint: Location) -> VerifyReport | None:
        """:attr:`verification`, where ``checkpoint`` is the one resolved; else None."""
        if self.path is None or not same_location(self.path, checkpoint):
            return None
        return self.verification


@dataclass
class CheckpointEntry:
    path: Location
    manifest: Manifest | None
    error: str | None = None


def committed_checkpoints(
    dirpath: str | os.PathLike[str],
    storage_options: StorageOptions | None = None,
    store: CheckpointReader | None = None,
) -> list[CheckpointEntry]:
    """Every committed checkpoint directly under ``dirpath``, newest first, as ``store`` lists them
    (default: the store :func:`~lightning_field.checkpoint.stores.store_for` picks for ``dirpath``).

    Hidden directories (in-flight ``.tmp-*`` writes, ``.trash-*`` removals) are never candidates:
    their manifest, if any, was not published by the commit. Under a URL, a prefix is a candidate
    only if its manifest object exists: that object is written last, so a prefix without it is an
    interrupted or half-removed save.
    """
    root = as_location(dirpath)
    reader = store or store_for(root, storage_options)
    entries = []
    for checkpoint in reader.checkpoints(root):
        try:
            entries.append(CheckpointEntry(checkpoint, read_manifest(checkpoint, store=reader)))
        except ManifestError as err:
            entries.append(CheckpointEntry(checkpoint, None, str(err)))
    return _newest_first(entries)


def _newest_first(entries: list[CheckpointEntry]) -> list[CheckpointEntry]:
    def order(entry: CheckpointEntry) -> tuple[int, float]:
        m = entry.manifest
        return (m.step, m.created_unix) if m else (-1, 0.0)

    return sorted(entries, key=order, reverse=True)


def latest_recoverable(
    dirpath: str | os.PathLike[str],
    storage_options: StorageOptions | None = None,
    reports: MutableMapping[Location, VerifyReport] | None = None,
    skipped: dict[Location, str] | None = None,
    log_skips: bool = True,
    store: CheckpointReader | None = None,
    entries: list[CheckpointEntry] | None = None,
) -> Location | None:
    """The newest checkpoint under ``dirpath`` that is recoverable and passes full verification.

    A newer checkpoint that fails verification is skipped with a warning naming the bad file, so a
    corrupt save costs only the progress since the previous one. So is one whose restore drill
    failed: it verifiably does not continue the run it came from.

    ``reports``: verifications already made, by checkpoint path (``field ckpt list --verify`` has
    hashed every file once; the pick must not hash them again, nor differ from what it showed);
    the ones this call makes are added to it, for the load of the one it picks.
    ``skipped``, when given, is filled with each recoverable-marked checkpoint passed over and why;
    ``log_skips=False`` keeps the warnings out of the log (every rank resolves ``ckpt_path="last"``,
    and only one should say it). ``store``: what reads them (see :func:`committed_checkpoints`).
    ``entries``: that listing, where the caller made it already (each manifest is read once).
    """
    warn = log.warning if log_skips else log.debug
    reader = store or store_for(as_location(dirpath), storage_options)
    if entries is None:
        entries = committed_checkpoints(dirpath, store=reader)
    for index, entry in enumerate(entries):
        if entry.manifest is None:
            warn("Skipping %s: %s", entry.path, entry.error)
            continue
        if not entry.manifest.recoverable:
            continue
        why = None
        if (entry.manifest.restore_drill or {}).get("outcome") == "mismatch":
            # A drill replayed the next step from it and got a different result: it is not a faithful
            # recovery point, like a corrupt one. An explicit ckpt_path can still load it.
            why = f"its restore drill failed ({(entry.manifest.restore_drill or {}).get('log')})"
        else:
            report = (reports or {}).get(entry.path) or verify_checkpoint(
                entry.path, store=reader, manifest=entry.manifest
            )
            if reports is not None:
                reports[entry.path] = report  # the load hands it on and hashes none of it again
            if report.recoverable:
                tested = "restore-tested by a drill" if entry.manifest.restore_tested else "not restore-tested"
                log.info("Latest recoverable checkpoint: %s (step %d, %s)", entry.path, entry.manifest.step, tested)
                return entry.path
            why = "it failed verification:\n  " + "\n  ".join(report.problems)
        if skipped is not None:
            skipped[entry.path] = why
        # "Falling back" only where there is something to fall back to.
        older = next((e for e in entries[index + 1 :] if e.manifest is not None and e.manifest.recoverable), None)
        then = f"trying the older {basename(older.path)}" if older else "no older recoverable checkpoint is left"
        warn("Skipping checkpoint %s, %s\n(%s)", entry.path, why, then)
    return None


def read_last_pointer(dirpath: str | os.PathLike[str], store: CheckpointReader | None = None) -> Location | None:
    """The ``LAST`` pointer a local store keeps; object stores keep none (``latest_recoverable``
    lists manifests), so there it is None."""
    root = as_location(dirpath)
    try:
        raw = (store or store_for(root)).read(root, LAST_POINTER)
    except UnsafeMemberError as err:
        log.warning("Ignored: %s", err)
        return None
    name = raw.decode(errors="replace").strip() if raw else ""
    if name and (member_name_problem(name) is not None or "/" in name):
        log.warning("%s: ignored, it names %r, not a checkpoint in its directory", join(root, LAST_POINTER), name)
        return None
    return join(root, name) if name else None


def last_pointer_rollback(
    dirpath: Location,
    resumed: tuple[Location, int] | None,
    entries: list[CheckpointEntry],
    skipped: dict[Location, str],
    store: CheckpointReader | None = None,
) -> str | None:
    """Why the ``LAST`` pointer's checkpoint was not resumed, when the resume (``resumed``: its path and
    step, or None for step 0) is older than it: the checkpoint ``LAST`` names is gone, has no readable
    manifest, or was refused (``skipped``: it failed verification). None when ``LAST`` names the
    resumed checkpoint, an older one, or one passed over only for not being recoverable."""
    named = read_last_pointer(dirpath, store)
    if named is None or (resumed is not None and same_location(named, resumed[0])):
        return None
    entry = next((e for e in entries if same_location(e.path, named)), None)
    if entry is None:
        if isinstance(named, os.PathLike) and os.path.isdir(named):
            why = "has no manifest.json (it never committed, or its manifest was deleted)"
        else:
            why = f"is gone (no such checkpoint in {dirpath})"
    elif entry.manifest is None:
        why = f"has a manifest that cannot be read ({entry.error})"
    elif entry.path in skipped:
        why = "was refused: " + skipped[entry.path].replace(":\n  ", ": ").replace("\n  ", "; ")
    elif (misnamed := name_step_problem(entry.path, entry.manifest)) is not None:
        # Sorted by its manifest's older step, it was never reached: said here, in the words of its refusal.
        why = "was refused: " + misnamed.removeprefix(f"{entry.path}: ").removesuffix(": refused")
    else:
        return None  # there and intact: passed over as not recoverable, which is no rollback
    stated = steps_in_name(basename(named)) | ({entry.manifest.step} if entry and entry.manifest else set())
    if resumed is not None and stated and max(stated) <= resumed[1]:
        return None  # it names an older step than the one resumed: nothing is lost
    step = f" (step {max(stated)})" if stated else ""
    instead = (
        f"resuming from the older {basename(resumed[0])} (step {resumed[1]}) instead"
        if resumed is not None
        else "no older checkpoint is left, so training starts at step 0"
    )
    return (
        f'lightning_field: ckpt_path="last": {join(as_location(dirpath), LAST_POINTER)} names {basename(named)}{step},'
        f" which {why}; {instead}. If you did not delete or replace it, whoever can write {dirpath} may have"
        ' rolled this run back (docs/security.md, "Rollback").'
    )
