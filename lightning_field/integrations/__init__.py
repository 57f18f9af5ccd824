"""Integrations with experiment trackers. wandb itself is imported only when a run is created or read,
so importing this package works without the optional ``wandb`` extra installed."""

from lightning_field.integrations.wandb_run import (
    CHECKPOINT_ARTIFACT_TYPE,
    EVIDENCE_ARTIFACT_TYPE,
    MANIFEST_ARTIFACT_TYPE,
    WANDB_RELPATH,
    FieldWandbLogger,
    WandbReview,
    field_summary,
    log_evidence_bundle,
    manifest_metadata,
    offline_segments,
    read_offline_run,
    read_wandb_identity,
    scrub_config,
)

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
