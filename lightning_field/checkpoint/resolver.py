"""Finding the checkpoint to resume from: the newest one that is committed, recoverable and intact."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lightning_field.checkpoint.verify import VerifyReport, verify_checkpoint
from lightning_field.core.manifest import MANIFEST_NAME, Manifest, ManifestError, is_checkpoint_dir, read_manifest
from lightning_field.core.storage import Location, StorageOptions, as_location, basename, is_url, open_fs, to_url

log = logging.getLogger(__name__)

LAST_POINTER = "LAST"
TEMP_PREFIXES = (".tmp-", ".trash-")


@dataclass
class CheckpointEntry:
    path: Location
    manifest: Manifest | None
    error: str | None = None


def committed_checkpoints(
    dirpath: str | os.PathLike[str], storage_options: StorageOptions | None = None
) -> list[CheckpointEntry]:
    """Every committed checkpoint directory under ``dirpath``, newest first.

    Hidden directories (in-flight ``.tmp-*`` writes, ``.trash-*`` removals) are never candidates:
    their manifest, if any, was not published by the commit rename. Under a URL, a prefix is a
    candidate only if its manifest object exists: that object is written last, so a prefix without
    it is an interrupted or half-removed save.
    """
    root = as_location(dirpath)
    if not isinstance(root, Path):
        return _committed_objects(root, storage_options)
    if not root.is_dir():
        return []
    entries = []
    for child in root.iterdir():
        if child.name.startswith(".") or not child.is_dir() or not is_checkpoint_dir(child):
            continue
        try:
            entries.append(CheckpointEntry(child, read_manifest(child)))
        except ManifestError as err:
            entries.append(CheckpointEntry(child, None, str(err)))
    return _newest_first(entries)


def _committed_objects(url: str, storage_options: StorageOptions | None) -> list[CheckpointEntry]:
    # One listing of the committed manifests, never a pointer object: a pointer would be a second,
    # separately written truth that a crash could leave naming a checkpoint that does not exist.
    fs, prefix = open_fs(url, storage_options)
    entries = []
    for manifest_path in fs.glob(f"{prefix}/*/{MANIFEST_NAME}"):
        checkpoint = to_url(fs, manifest_path.rsplit("/", 1)[0])
        if basename(checkpoint).startswith("."):
            continue
        try:
            entries.append(CheckpointEntry(checkpoint, read_manifest(checkpoint, storage_options)))
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
    reports: Mapping[Location, VerifyReport] | None = None,
    skipped: dict[Location, str] | None = None,
    log_skips: bool = True,
) -> Location | None:
    """The newest checkpoint under ``dirpath`` that is recoverable and passes full verification.

    A newer checkpoint that fails verification is skipped with a warning naming the bad file, so a
    corrupt save costs only the progress since the previous one. So is one whose restore drill
    failed: it verifiably does not continue the run it came from.

    ``reports``: verifications already made, by checkpoint path (``field ckpt list --verify`` has
    hashed every file once; the pick must not hash them again, nor differ from what it showed).
    ``skipped``, when given, is filled with each recoverable-marked checkpoint passed over and why;
    ``log_skips=False`` keeps the warnings out of the log (every rank resolves ``ckpt_path="last"``,
    and only one should say it).
    """
    warn = log.warning if log_skips else log.debug
    entries = committed_checkpoints(dirpath, storage_options)
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
            report = (reports or {}).get(entry.path) or verify_checkpoint(entry.path, storage_options=storage_options)
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


def read_last_pointer(dirpath: str | os.PathLike[str]) -> Path | None:
    """The local ``LAST`` pointer; object stores have none (``latest_recoverable`` lists manifests)."""
    if is_url(dirpath):
        return None
    pointer = Path(dirpath) / LAST_POINTER
    if not pointer.is_file():
        return None
    name = pointer.read_text().strip()
    return Path(dirpath) / name if name else None
