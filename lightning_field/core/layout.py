"""The run directory's layout: where every capability writes, relative to ``default_root_dir``.

One module, so a reader of a run (``field record``, ``field plan --from-run``, ``field wandb``) needs
no import of the training callbacks that write these files, and a new file cannot collide with
another capability's.
"""

from __future__ import annotations

import os
from pathlib import Path

from lightning_field.core.storage import as_location

FIELD_DIR = Path("field")
"""Everything lightning_field writes into a run directory lives under this folder."""

EVENTS_RELPATH = FIELD_DIR / "events.jsonl"
"""The event log (``core/events.py``): every attempt, save, load, evaluation and preemption."""

PROFILE_RELPATH = FIELD_DIR / "profile"
"""StragglerMonitor's per-rank reports (``profiling/straggler.py``)."""

SUMMARY_RELPATH = FIELD_DIR / "time_to_quality.json"
"""TimeToQuality's summary across attempts (``quality/time_to_quality.py``)."""

WANDB_RELPATH = FIELD_DIR / "wandb.json"
"""The W&B run identity that every restart resumes (``integrations/wandb_identity.py``)."""

PLAN_RELPATH = FIELD_DIR / "plan.json"
"""A saved ``field plan --json``, which the release record reads."""

RECORD_RELPATH = FIELD_DIR / "record"
"""The release record's default output directory (``record/build.py``)."""

DRILLS_RELPATH = FIELD_DIR / "drills"
"""Restore drills' working directories and logs (``evidence/drill.py``)."""

EVIDENCE_RELPATH = FIELD_DIR / "evidence"
"""Evidence bundles written by ``field-evidence`` inside a Hydra run directory."""

HEARTBEAT_RELPATH = FIELD_DIR / "heartbeat"
"""Per-rank heartbeats: how a crashed attempt's last moment is known (``core/heartbeat.py``)."""

PREFLIGHT_RELPATH = FIELD_DIR / "preflight"
"""``field preflight`` reports (``preflight.json``, ``preflight.md``, ``baseline.png``)."""

FAULT_RELPATH = FIELD_DIR / "fault.json"
"""``field-train fault.kill_at_step``'s record that the drill fired (once per run directory)."""

LAUNCH_RELPATH = FIELD_DIR / "launch"
"""``field-train``'s per-rank launch files for Lightning's DDP launcher."""


def run_directory(
    default_root_dir: str | os.PathLike[str], has_logger: bool, checkpoint_dir: str | os.PathLike[str] | None
) -> Path:
    """The run directory, under which ``FIELD_DIR`` lives: the Trainer's ``default_root_dir``, where
    Lightning's loggers write. With no logger, Lightning writes nothing there but its checkpoints; where
    those go elsewhere (``logger=False`` and a ``dirpath`` outside ``default_root_dir``, which is the
    working directory when not given), the run directory is that ``dirpath``. So nothing of ours lands
    in a directory Lightning leaves alone, and scripts run from one working directory keep their logs
    with their checkpoints. An object-store ``dirpath`` (a URL) is never a run directory.
    """
    root = Path(default_root_dir)
    checkpoints = as_location(checkpoint_dir) if checkpoint_dir is not None else None
    if has_logger or not isinstance(checkpoints, Path):
        return root
    return root if checkpoints.resolve().is_relative_to(root.resolve()) else checkpoints
