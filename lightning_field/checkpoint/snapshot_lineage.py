"""Which run a machine's step snapshots belong to.

Snapshots live outside the checkpoint directory (``/dev/shm``, keyed by the directory's path or URL),
so they outlive it: a user who deletes ``run/`` and starts over, or a new bucket under an old name,
finds the previous run's snapshots still there, newer than anything the new run has, and a resume
would load them. A random token ties the two together: the persistent checkpoint directory holds it
(:data:`LINEAGE_NAME`, written once, by rank 0, at the first setup that finds none), and each
machine's snapshot folder holds a copy. Snapshots are resumed only where both tokens exist and
agree; at setup, a folder whose token differs is emptied before it takes the directory's token.

The token files are read back as untrusted: anything but 32 lowercase hex digits reads as no token,
which refuses the snapshots (the safe direction: the run falls back to its persistent checkpoints).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

from lightning_field.checkpoint.snapshot_dirs import private_folder_problem
from lightning_field.checkpoint.stores import CheckpointStore, describe_error
from lightning_field.core.fsio import atomic_write_bytes
from lightning_field.core.storage import Location

__all__ = ["LINEAGE_NAME", "join_run", "lineage_mismatch", "prepared_for_run", "same_run"]

log = logging.getLogger(__name__)

LINEAGE_NAME = "SNAPSHOT_LINEAGE"
_TOKEN = re.compile(rb"[0-9a-f]{32}")


def _parse(data: bytes | None) -> str | None:
    if data is None or len(data) > 64:
        return None
    token = data.strip()  # ASCII whitespace only: the bytes, not a decoding of them, are compared
    return token.decode() if _TOKEN.fullmatch(token) else None


def persistent_lineage(store: CheckpointStore, checkpoint_dir: Location) -> str | None:
    """The token the checkpoint directory holds, or None (none yet, not a token, or unreadable)."""
    try:
        data = store.read(checkpoint_dir, LINEAGE_NAME)
    except Exception:  # a link out of the folder, a store's own error: no token, so no snapshot is trusted
        return None
    return _parse(data)


def ensure_persistent_lineage(store: CheckpointStore, checkpoint_dir: Location) -> str:
    """The checkpoint directory's token, written first where it holds none (rank 0 only)."""
    found = persistent_lineage(store, checkpoint_dir)
    if found is not None:
        return found
    token = os.urandom(16).hex()
    if isinstance(checkpoint_dir, Path):
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
    store.put(checkpoint_dir, LINEAGE_NAME, (token + "\n").encode())
    return token


def snapshot_lineage(root: Path) -> str | None:
    """The token a machine's snapshot folder holds, or None."""
    try:
        with (root / LINEAGE_NAME).open("rb") as f:
            return _parse(f.read(65))
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None


def lineage_mismatch(root: Path, store: CheckpointStore, checkpoint_dir: Location) -> str | None:
    """Why the snapshots in ``root`` may not resume the run of ``checkpoint_dir``, or None where they may."""
    ours, theirs = persistent_lineage(store, checkpoint_dir), snapshot_lineage(root)
    if ours is not None and ours == theirs:
        return None
    held = "no run's token" if theirs is None else f"run token {theirs[:8]}"
    wanted = "holds none (deleted, or new)" if ours is None else f"holds {ours[:8]}"
    return f"the snapshots in {root} carry {held}, and {checkpoint_dir}/{LINEAGE_NAME} {wanted}"


def same_run(root: Path, store: CheckpointStore, checkpoint_dir: Location, log_skips: bool) -> bool:
    """Whether the snapshots in ``root`` are the run's of ``checkpoint_dir``; where a folder holding
    any is another run's, says so (``log_skips``) and why."""
    mismatch = lineage_mismatch(root, store, checkpoint_dir)
    if mismatch is None:
        return True
    if log_skips and any(child.name != LINEAGE_NAME for child in root.iterdir()):
        log.warning(
            "lightning_field: not resuming from step snapshots of another run: %s. They are left from a"
            " run whose checkpoint directory was deleted or replaced; this run resumes from its own"
            " checkpoints, and its setup deletes them.",
            mismatch,
        )
    return False


def join_run(root: Path, store: CheckpointStore, checkpoint_dir: Location, leader: bool) -> None:
    """At setup: rank 0 reads the checkpoint directory's run token, or writes it where there is none;
    every rank learns it; each machine's ``leader`` empties ``root`` of another run's snapshots and
    gives it the token, before any rank writes a snapshot. Collective.

    Raises:
        OSError: the token could not be read or written, or a folder not emptied (on every rank alike).
    """
    from lightning_field.core.distributed import all_gather_objects, broadcast_object, global_rank  # torch

    found: tuple[str | None, str | None] = (None, None)
    if global_rank() == 0:
        try:
            found = (ensure_persistent_lineage(store, checkpoint_dir), None)
        except Exception as err:  # a user's store may raise anything; every rank must learn of it
            found = (None, f"cannot record the run token {checkpoint_dir}/{LINEAGE_NAME}: {describe_error(err)}")
    token, problem = broadcast_object(found)
    if problem is not None or token is None:
        raise OSError(problem)
    problems = [p for p in all_gather_objects(adopted(root, token) if leader else None) if p]
    if problems:
        raise OSError(problems[0])


def adopted(root: Path, token: str) -> str | None:
    """Make ``root`` hold the snapshots of the run whose token is ``token`` (a machine's leader): where
    it holds another run's, delete them first and say which. A problem, else None."""
    if snapshot_lineage(root) == token:
        return None
    removed = []
    try:
        for child in sorted(root.iterdir()):
            if child.name == LINEAGE_NAME:
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink(missing_ok=True)
            removed.append(child.name)
        atomic_write_bytes(root / LINEAGE_NAME, (token + "\n").encode(), False)
    except OSError as err:
        return f"cannot clear the snapshot folder {root} of another run's snapshots: {err}"
    if removed:
        names = ", ".join(removed[:4]) + (", ..." if len(removed) > 4 else "")
        log.warning(
            "lightning_field: deleted %d entries of another run from the snapshot folder %s (%s): its checkpoint"
            " directory no longer holds that run.",
            len(removed),
            root,
            names,
        )
    return None


def prepared_for_run(root: Path, store: CheckpointStore, checkpoint_dir: Location) -> str | None:
    """A machine's folder about to receive the run's snapshot from other machines (a resume over
    several nodes): made private, and the run's (another run's snapshots deleted first, the run
    token given), so that setup keeps what it received. A problem, else None."""
    token = persistent_lineage(store, checkpoint_dir)
    return private_folder_problem(root) or (adopted(root, token) if token is not None else None)
