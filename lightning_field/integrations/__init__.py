"""Weights & Biases for runs that are killed and restarted: one W&B run per training run.

One module per job: ``wandb_identity`` (the run id kept beside the checkpoints, offline segments),
``wandb_logger`` (``FieldWandbLogger``), ``wandb_review`` (checkpoint artifacts as they commit, the
run summary at every attempt's end), ``wandb_evidence`` (evidence bundles as artifacts) and
``wandb_offline`` (reading the ``.wandb`` transaction log back). The summary itself, independent of
W&B, is ``quality/run_summary.py``. wandb is imported only when a run is created or read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_field.core.lazy import lazy_exports

# Imported on first use: reading a run's W&B identity must not pay for Lightning, which the logger needs.
_EXPORTS: dict[str, str] = {
    "WANDB_RELPATH": "lightning_field.core.layout",
    "EVIDENCE_ARTIFACT_TYPE": "lightning_field.integrations.wandb_evidence",
    "log_evidence_bundle": "lightning_field.integrations.wandb_evidence",
    "offline_segments": "lightning_field.integrations.wandb_identity",
    "read_wandb_identity": "lightning_field.integrations.wandb_identity",
    "scrub_config": "lightning_field.integrations.wandb_identity",
    "FieldWandbLogger": "lightning_field.integrations.wandb_logger",
    "read_offline_run": "lightning_field.integrations.wandb_offline",
    "CHECKPOINT_ARTIFACT_TYPE": "lightning_field.integrations.wandb_review",
    "MANIFEST_ARTIFACT_TYPE": "lightning_field.integrations.wandb_review",
    "WandbReview": "lightning_field.integrations.wandb_review",
    "manifest_metadata": "lightning_field.integrations.wandb_review",
    "field_summary": "lightning_field.quality.run_summary",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from lightning_field.core.layout import WANDB_RELPATH
    from lightning_field.integrations.wandb_evidence import EVIDENCE_ARTIFACT_TYPE, log_evidence_bundle
    from lightning_field.integrations.wandb_identity import offline_segments, read_wandb_identity, scrub_config
    from lightning_field.integrations.wandb_logger import FieldWandbLogger
    from lightning_field.integrations.wandb_offline import read_offline_run
    from lightning_field.integrations.wandb_review import (
        CHECKPOINT_ARTIFACT_TYPE,
        MANIFEST_ARTIFACT_TYPE,
        WandbReview,
        manifest_metadata,
    )
    from lightning_field.quality.run_summary import field_summary

__all__ = [
    "CHECKPOINT_ARTIFACT_TYPE",
    "EVIDENCE_ARTIFACT_TYPE",
    "MANIFEST_ARTIFACT_TYPE",
    "WANDB_RELPATH",
    "FieldWandbLogger",
    "WandbReview",
    "field_summary",
    "log_evidence_bundle",
    "manifest_metadata",
    "offline_segments",
    "read_offline_run",
    "read_wandb_identity",
    "scrub_config",
]
