"""The run directory's layout: where every capability writes, relative to ``default_root_dir``.

One module, so a reader of a run (``field record``, ``field plan --from-run``, ``field wandb``) needs
no import of the training callbacks that write these files, and a new file cannot collide with
another capability's.
"""

from __future__ import annotations

from pathlib import Path

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
