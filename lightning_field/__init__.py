"""lightning_field: recoverable, economically bounded training for PyTorch Lightning."""

__version__ = "0.1.0"

from lightning_field.baseline import (
    PreflightSettings,
    StudyConfig,
    check_data,
    run_preflight,
    run_study,
    tiny_overfit,
)
from lightning_field.checkpoint import (
    PREEMPTED_EXIT_CODE,
    CheckpointCorruptError,
    CheckpointSaveError,
    ManifestCheckpoint,
    NoRecoverableCheckpointError,
    ResumeMismatchError,
    TrainingPreempted,
    latest_recoverable,
    load_weights,
    verify_checkpoint,
)
from lightning_field.core.events import EventLog, read_events
from lightning_field.core.manifest import Manifest, read_manifest
from lightning_field.evidence import EvidenceSettings, RestoreDrill, StepTracer, check_bundle
from lightning_field.integrations import FieldWandbLogger, WandbReview, log_evidence_bundle, read_offline_run
from lightning_field.integrations.hydra_configs import register_configs
from lightning_field.profiling import ProfiledDDPStrategy, StragglerMonitor
from lightning_field.quality import CheckpointCadence, TimeToQuality, goodput_ledger
from lightning_field.record import build_record, check_record
from lightning_field.state.samplers import JumpRandomSampler, JumpSequentialSampler

__all__ = [
    "PREEMPTED_EXIT_CODE",
    "CheckpointCadence",
    "CheckpointCorruptError",
    "CheckpointSaveError",
    "EventLog",
    "EvidenceSettings",
    "FieldWandbLogger",
    "JumpRandomSampler",
    "JumpSequentialSampler",
    "Manifest",
    "ManifestCheckpoint",
    "NoRecoverableCheckpointError",
    "PreflightSettings",
    "ProfiledDDPStrategy",
    "RestoreDrill",
    "ResumeMismatchError",
    "StepTracer",
    "StragglerMonitor",
    "StudyConfig",
    "TimeToQuality",
    "TrainingPreempted",
    "WandbReview",
    "__version__",
    "build_record",
    "check_bundle",
    "check_data",
    "check_record",
    "goodput_ledger",
    "latest_recoverable",
    "load_weights",
    "log_evidence_bundle",
    "read_events",
    "read_manifest",
    "read_offline_run",
    "register_configs",
    "run_preflight",
    "run_study",
    "tiny_overfit",
    "verify_checkpoint",
]
