"""Logging a record to the released run's W&B run: an artifact, and the verdict in the run summary.

The run is found the way a restart finds it, through ``<run>/field/wandb.json`` (``FieldWandbLogger``).
Offline, the record is written as one more segment under ``<run>/wandb/attempt-<N>/``, the layout
``field wandb sync`` uploads in order, so the artifact and the summary reach the same W&B run as the
training attempts did.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import wandb

from lightning_field.integrations.wandb_identity import SEGMENTS_DIRNAME, read_wandb_identity

ARTIFACT_TYPE = "release-record"
_SEGMENT = re.compile(r"^attempt-(\d+)$")


def _next_segment(run_dir: Path) -> Path:
    root = run_dir / SEGMENTS_DIRNAME
    taken = [int(m.group(1)) for p in root.glob("attempt-*") if (m := _SEGMENT.match(p.name))] if root.is_dir() else []
    return root / f"attempt-{max(taken, default=0) + 1}"


def summary_of(record: Mapping[str, Any]) -> dict[str, Any]:
    """What goes into the run summary: filterable in the W&B runs table."""
    decision, exposure = record["decision"], record["exposure"]
    return {
        "field/record/verdict": decision["verdict"],
        "field/record/held_by": [h["name"] for h in decision["held_by"]],
        "field/record/exposure_level": exposure["supported"],
        "field/record/next_level_lacks": [x["name"] for x in exposure["next_lacks"]],
        "field/record/content_sha256": record["content_sha256"],
    }


def log_record(record: Mapping[str, Any], record_dir: Path, run_dir: Path, mode: str | None = None) -> dict[str, Any]:
    """Log ``record_dir`` (record.json, record.html, plots) to ``run_dir``'s W&B run; returns what was logged."""
    identity = read_wandb_identity(run_dir)
    if identity is None:
        raise FileNotFoundError(f"{run_dir}: no field/wandb.json, so this run has no W&B run to log the record to")
    segment = _next_segment(run_dir)
    segment.mkdir(parents=True, exist_ok=True)
    mode = mode or os.environ.get("WANDB_MODE") or None
    if mode not in (None, "online", "offline", "disabled", "shared"):
        raise ValueError(f"W&B mode {mode!r} is not one of online, offline, disabled, shared")
    run = wandb.init(
        id=identity["run_id"],
        project=identity.get("project"),
        entity=identity.get("entity"),
        resume="allow",
        dir=os.fspath(segment),
        job_type="release-record",
        mode=cast(Any, mode),
        reinit="create_new",
    )
    try:
        decision = record["decision"]
        artifact = wandb.Artifact(
            name=f"release-record-{identity['run_id']}",
            type=ARTIFACT_TYPE,
            metadata={
                "verdict": decision["verdict"],
                "held_by": [h["name"] for h in decision["held_by"]],
                "exposure_level": record["exposure"]["supported"],
                "content_sha256": record["content_sha256"],
                "conditions": {c["name"]: c["status"] for c in record["conditions"]},
                "created": record["created"],
            },
        )
        for path in sorted(p for p in record_dir.rglob("*") if p.is_file()):
            artifact.add_file(os.fspath(path), name=path.relative_to(record_dir).as_posix())
        run.log_artifact(artifact, aliases=["latest", decision["verdict"]])
        run.summary.update(summary_of(record))
    finally:
        run.finish()
    return {
        "run_id": identity["run_id"],
        "artifact": f"release-record-{identity['run_id']}",
        "segment": str(segment),
        "mode": mode or "online",
    }
