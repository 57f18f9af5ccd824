"""Which checkpoint ``ckpt_path="last"`` resumes, and the refusal when none may be.

The newest recoverable checkpoint (or a newer step snapshot that verifies); with ``ResumeConfig.inexact``
the newest unrecoverable one, said so in the :class:`~lightning_field.checkpoint.resolver.Resolution`;
none at all starts at step 0 and says so. Checkpoints that exist but none of which may be resumed
are refused (:class:`NoRecoverableCheckpointError`) rather than silently starting over.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from lightning_field.checkpoint.resolver import (
    CheckpointEntry,
    InexactChoice,
    Resolution,
    committed_checkpoints,
    last_pointer_rollback,
    latest_recoverable,
)
from lightning_field.checkpoint.stores import CheckpointReader
from lightning_field.checkpoint.verify import VerifyReport
from lightning_field.core.errors import CheckpointError
from lightning_field.core.launcher_env import env_global_rank, restart_of
from lightning_field.core.storage import Location, basename, same_location

log = logging.getLogger(__name__)

__all__ = ["NoRecoverableCheckpointError", "no_recoverable_message", "resolve_last"]


class NoRecoverableCheckpointError(CheckpointError, RuntimeError):
    """``ckpt_path="last"`` found committed checkpoints, but none that resumes exactly.

    Training from step 0 instead would silently throw the run's work away, so it is refused; the
    message lists every checkpoint with what it lacks, and the ways out.
    """


def no_recoverable_message(
    where: Location, entries: Sequence[Any], skipped: Mapping[Location, str] | None = None
) -> str:
    """Why ``ckpt_path="last"`` refuses: each checkpoint (up to 10) with what it lacks or why it was
    passed over (``skipped``: a damaged file, a failed drill), and the ways out that fit."""
    skipped = skipped or {}
    lines = []
    for entry in entries[:10]:
        manifest = entry.manifest
        if entry.path in skipped:
            why = skipped[entry.path]
        elif manifest is None:
            why = f"unreadable manifest ({entry.error})"
        elif manifest.kind != "recovery":
            why = "a weights-only export"
        else:
            why = "; ".join(manifest.missing) or "failed verification"
        lines.append(f"  {basename(entry.path)}: {why}")
    more = f"\n  ... and {len(entries) - 10} more" if len(entries) > 10 else ""
    ways = []
    if any(e.path in skipped for e in entries):
        ways.append(
            "a damaged checkpoint cannot be resumed, exactly or not: put the named file back from a copy if you"
            " have one; a fallback needs an older recoverable checkpoint, so keep two or more"
            " (ManifestCheckpoint(save_top_k=2) or -1, as docs/checkpoints.md says)"
        )
    if any(e.manifest is not None and e.manifest.kind == "recovery" and e.path not in skipped for e in entries):
        ways.append(
            "fix what they lack and start a new run (these checkpoints stay as they are); or resume their weights"
            " and optimizer anyway, knowing the continuation is not exact, with"
            " ManifestCheckpoint(resume=ResumeConfig(inexact=True))"
        )
    ways.append("pass ckpt_path=None to start over on purpose")
    return (
        f'ckpt_path="last": {len(entries)} checkpoint(s) under {where}, none recoverable, so this run would'
        " silently start over from step 0. Refusing.\n" + "\n".join(lines) + more + "\n"
        "Ways out: " + "; or ".join(ways) + "."
    )


def resolve_last(
    where: Location,
    allow_inexact: bool = False,
    store: CheckpointReader | None = None,
    snapshot: Resolution | None = None,
) -> Resolution:
    """``ckpt_path="last"``: the newest recoverable checkpoint under a local ``where``, with its
    verification for the load to hand on, or a path of None when there is no committed checkpoint at
    all (training starts at step 0, and says so). ``snapshot``: the newest step snapshot that
    verified, taken instead where it is newer (one resume rule over the tiers: the newest verified
    step wins, a persistent checkpoint on a tie).

    With ``allow_inexact`` (``ResumeConfig(inexact=True)``), the newest unrecoverable recovery checkpoint
    is chosen when no recoverable one exists, and the resolution says what it lacks.

    Raises:
        ValueError: ``where`` is a URL, which ``ckpt_path="last"`` cannot resolve through Lightning.
        NoRecoverableCheckpointError: checkpoints exist, but none may be resumed.
    """
    if not isinstance(where, Path):  # a URL (a local location is a Path)
        # Lightning would re-open the found URL without the storage options and read a prefix's
        # modification time, which object stores do not have: resolve it explicitly instead.
        raise ValueError(
            f'ckpt_path="last" cannot be resolved by Lightning for the object-store dirpath {where}. Pass'
            f" ckpt_path=lightning_field.latest_recoverable({str(where)!r}, storage_options) instead."
        )
    skipped: dict[Location, str] = {}
    entries = committed_checkpoints(where, store=store)  # each manifest read once, here
    if snapshot is None:
        found = _resolve_persistent(where, allow_inexact, store, skipped, entries)
        _warn_rollback(where, found, store, skipped, entries)
        return found
    verified = snapshot.verification
    if snapshot.path is None or verified is None or verified.manifest is None:
        raise ValueError(f"resolve_last: the snapshot pick {snapshot} carries no verification of its own")
    snapshot_step = verified.manifest.step
    try:
        persistent = _resolve_persistent(where, allow_inexact, store, skipped, entries)
    except NoRecoverableCheckpointError:
        persistent = Resolution(None)  # none of them may be resumed; the snapshot, which verified, may
    if persistent.path is not None and _step_of(persistent, entries) >= snapshot_step:
        _warn_rollback(where, persistent, store, skipped, entries)
        return persistent
    rank_zero_info(
        f"lightning_field: resuming from the snapshot {snapshot.path} (step {snapshot_step}),"
        f" newer than every recoverable checkpoint under {where}."
    )
    _warn_rollback(where, snapshot, store, skipped, entries)
    return snapshot  # recoverable: this continuation is exact


def no_checkpoint_on_restart_message(where: Path, restart: str) -> str:
    """What a restarted job that finds nothing to resume is told: it starts over, and the likely why."""
    return (
        f"lightning_field: this process is a restart ({restart}), but there is no committed checkpoint under"
        f" {where}: training starts over at step 0. If each attempt writes to a new directory (a timestamped"
        " run directory, as Hydra's default outputs/${now:...} and lightning-hydra-template's paths.output_dir"
        " are), the earlier attempts' checkpoints are elsewhere: give the job a run directory that survives"
        " requeues, e.g. hydra.run.dir=outputs/${oc.env:SLURM_JOB_ID} (docs/hydra.md)."
    )


def _step_of(resolution: Resolution, entries: list[CheckpointEntry]) -> int:
    """The step of a resolution's pick, from its verification's manifest or the listing's (read once)."""
    verified = resolution.verification
    if verified is not None and verified.manifest is not None:
        return verified.manifest.step
    entry = next(e for e in entries if e.manifest is not None and same_location(e.path, str(resolution.path)))
    assert entry.manifest is not None
    return entry.manifest.step


def _warn_rollback(
    where: Path,
    resumed: Resolution,
    store: CheckpointReader | None,
    skipped: dict[Location, str],
    entries: list[CheckpointEntry],
) -> None:
    """Warn (rank 0) where ``LAST`` names a newer checkpoint than the one resumed that is gone or was
    refused (:func:`~lightning_field.checkpoint.resolver.last_pointer_rollback`): a rollback is never silent."""
    if env_global_rank() != 0:
        return
    pick = (Path(resumed.path), _step_of(resumed, entries)) if resumed.path is not None else None
    message = last_pointer_rollback(where, pick, entries, skipped, store)
    if message is not None:
        log.warning(message)


def _resolve_persistent(
    where: Path,
    allow_inexact: bool,
    store: CheckpointReader | None,
    skipped: dict[Location, str],
    entries: list[CheckpointEntry],
) -> Resolution:
    reports: dict[Location, VerifyReport] = {}
    found = latest_recoverable(
        where, reports=reports, skipped=skipped, log_skips=env_global_rank() == 0, store=store, entries=entries
    )
    if found is not None and not Path(found).exists():
        # Lightning drops a "last" it cannot see on the filesystem and starts over: never silently.
        raise ValueError(
            f'ckpt_path="last" found {found} in the store given to ManifestCheckpoint, where Lightning cannot'
            f" see it, and would start over. Pass ckpt_path=lightning_field.latest_recoverable({str(where)!r},"
            " store=store) instead."
        )
    if found is not None:
        return Resolution(str(found), verification=reports.get(found))
    if not entries:
        restart = restart_of(os.environ)
        if restart is None:
            rank_zero_info(f"lightning_field: no committed checkpoint under {where} yet: training starts at step 0.")
        elif env_global_rank() == 0:
            log.warning(no_checkpoint_on_restart_message(where, restart))
        return Resolution(None)
    # A damaged checkpoint cannot be resumed inexactly either: its bytes are not what was saved.
    resumable = [
        e for e in entries if e.manifest is not None and e.manifest.kind == "recovery" and e.path not in skipped
    ]
    if allow_inexact and resumable:
        chosen = resumable[0]
        assert chosen.manifest is not None
        rank_zero_warn(
            f"lightning_field: resuming from {chosen.path}, which is NOT recoverable"
            f" ({'; '.join(chosen.manifest.missing)}): weights, optimizer and loop state are restored, but"
            " this continuation is not exact. Every later manifest records provenance.inexact_resume."
        )
        return Resolution(str(chosen.path), inexact=InexactChoice(str(chosen.path), tuple(chosen.manifest.missing)))
    raise NoRecoverableCheckpointError(no_recoverable_message(where, entries, skipped))
