"""An evidence bundle as a W&B artifact: the verdict, the gate and the identity as metadata, the
bundle's files (manifests and traces, not the checkpoints' tensors) as contents."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import WandbLogger

from lightning_field.core.documents import read_document
from lightning_field.core.manifest import MANIFEST_NAME, is_checkpoint_dir
from lightning_field.evidence.bundle_format import EVIDENCE_DOCUMENT, EVIDENCE_JSON
from lightning_field.integrations.wandb_review import artifact_name

EVIDENCE_ARTIFACT_TYPE = "evidence"


# ---------------------------------------------------------------------------------------------- evidence
def _checkpoint_payload(path: Path, root: Path) -> bool:
    """A checkpoint's state file inside a bundle (its manifest is evidence; its tensors are not)."""
    if path.name == MANIFEST_NAME:
        return False
    parent = path.parent
    while parent != root and root in parent.parents:
        if is_checkpoint_dir(parent):
            return True
        parent = parent.parent
    return False


# Logging describes whatever the bundle holds (every field is read with .get): its format must be one
# this version reads, but the fields a recovery claim needs are `field evidence check`'s to demand.
_LOGGED_EVIDENCE = dataclasses.replace(EVIDENCE_DOCUMENT, required=())


def log_evidence_bundle(run: Any, bundle_dir: str | os.PathLike[str], aliases: list[str] | None = None) -> Any:
    """Log an evidence bundle (``field-evidence``'s output) to ``run``: an artifact and its plots.

    The artifact ``evidence-<bundle id>`` (type "evidence") holds ``evidence.json``, ``evidence.md``,
    the plots and the raw logs and manifest copies the evidence cites, but not checkpoint state files
    (their manifests and hashes are the evidence). Its metadata carries the verdict and the gate
    (passed, failed conditions, each critical condition), so runs can be filtered by them in W&B.
    Each ``*.png`` is logged as ``evidence/<name>`` ``wandb.Image``. ``run``: a W&B run or a WandbLogger.

    Returns the logged ``wandb.Artifact``.
    """
    import wandb  # wandb takes ~1 s to import: only runs that log to W&B pay it

    if isinstance(run, WandbLogger):
        run = run.experiment
    bundle_dir = Path(bundle_dir)
    path = bundle_dir / EVIDENCE_JSON
    if not path.is_file():
        raise FileNotFoundError(
            f"{bundle_dir} is not an evidence bundle: {EVIDENCE_JSON} is missing (it is written last, so the"
            " bundle is incomplete or the path is wrong)"
        )
    evidence = read_document(path, _LOGGED_EVIDENCE, ValueError)
    gate = evidence.get("gate") or {}
    metadata = {
        "format": evidence.get("format"),
        "id": evidence.get("id"),
        "created": evidence.get("created"),
        "verdict": evidence.get("verdict"),
        "summary": evidence.get("summary"),
        "gate_passed": gate.get("passed"),
        "gate_failed": list(gate.get("failed") or []),
        "critical_conditions": {c["name"]: c["passed"] for c in evidence.get("critical_conditions") or []},
        "config_hash": (evidence.get("tested_configuration") or {}).get("config_hash"),
    }
    artifact = wandb.Artifact(
        name=artifact_name("evidence", str(evidence.get("id") or bundle_dir.name)),
        type=EVIDENCE_ARTIFACT_TYPE,
        metadata=metadata,
    )
    for file in sorted(p for p in bundle_dir.rglob("*") if p.is_file()):
        if not _checkpoint_payload(file, bundle_dir):
            artifact.add_file(os.fspath(file), name=file.relative_to(bundle_dir).as_posix())
    run.log_artifact(artifact, aliases=["latest", *(aliases or [])])
    verdict = metadata["verdict"]
    images = {
        f"evidence/{png.stem}": wandb.Image(os.fspath(png), caption=f"{png.name}: verdict {verdict}")
        for png in sorted(bundle_dir.glob("*.png"))
    }
    if images:
        run.log(images)
    run.summary.update({"field/evidence/verdict": verdict, "field/evidence/gate_passed": gate.get("passed")})
    return artifact
