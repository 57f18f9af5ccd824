"""lightning_field: recoverable, economically bounded training for PyTorch Lightning.

The public names below are imported on first use (PEP 562), so ``import lightning_field`` and its
pytest plugin cost nothing until something is used: a test suite that never asks for exact-resume
checks does not import torch at collection time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_field._version import __version__
from lightning_field.core.lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "PreflightSettings": "lightning_field.baseline",
    "StudyConfig": "lightning_field.baseline",
    "check_data": "lightning_field.baseline",
    "run_preflight": "lightning_field.baseline",
    "run_study": "lightning_field.baseline",
    "tiny_overfit": "lightning_field.baseline",
    "NO_PROGRESS_EXIT_CODE": "lightning_field.checkpoint",
    "PREEMPTED_EXIT_CODE": "lightning_field.checkpoint",
    "CheckpointCorruptError": "lightning_field.checkpoint",
    "CheckpointError": "lightning_field.checkpoint",
    "Checkpointer": "lightning_field.checkpoint",
    "CheckpointSaveError": "lightning_field.checkpoint",
    "ManifestCheckpoint": "lightning_field.checkpoint",
    "NoProgressError": "lightning_field.checkpoint",
    "NoRecoverableCheckpointError": "lightning_field.checkpoint",
    "ResumeMismatchError": "lightning_field.checkpoint",
    "StaleCheckpointError": "lightning_field.checkpoint",
    "TrainingPreempted": "lightning_field.checkpoint",
    "UnsafeCheckpointError": "lightning_field.checkpoint",
    "latest_recoverable": "lightning_field.checkpoint",
    "load_weights": "lightning_field.checkpoint",
    "verify_checkpoint": "lightning_field.checkpoint",
    "EventLog": "lightning_field.core.events",
    "read_events": "lightning_field.core.events",
    "select_run": "lightning_field.core.events",
    "Manifest": "lightning_field.core.manifest",
    "read_manifest": "lightning_field.core.manifest",
    "EvidenceSettings": "lightning_field.evidence",
    "RestoreDrill": "lightning_field.evidence",
    "StepTracer": "lightning_field.evidence",
    "check_bundle": "lightning_field.evidence",
    "FieldWandbLogger": "lightning_field.integrations",
    "WandbReview": "lightning_field.integrations",
    "log_evidence_bundle": "lightning_field.integrations",
    "read_offline_run": "lightning_field.integrations",
    "register_configs": "lightning_field.integrations.hydra_configs",
    "HANG_EXIT_CODE": "lightning_field.profiling",
    "HangWatchdog": "lightning_field.profiling",
    "ProfiledDDPStrategy": "lightning_field.profiling",
    "StragglerMonitor": "lightning_field.profiling",
    "FailureModel": "lightning_field.planning.intervals",
    "InterruptConfig": "lightning_field.checkpoint.options",
    "ResumeConfig": "lightning_field.checkpoint.options",
    "SnapshotConfig": "lightning_field.checkpoint.options",
    "StorageConfig": "lightning_field.checkpoint.options",
    "CheckpointCadence": "lightning_field.quality",
    "TimeToQuality": "lightning_field.quality",
    "goodput_ledger": "lightning_field.quality",
    "build_record": "lightning_field.record",
    "check_record": "lightning_field.record",
    "JumpRandomSampler": "lightning_field.state.samplers",
    "JumpSequentialSampler": "lightning_field.state.samplers",
    "ResumeCheckFailed": "lightning_field.testing",
    "assert_resumes_exactly": "lightning_field.testing",
}

__all__ = [
    "HANG_EXIT_CODE",
    "NO_PROGRESS_EXIT_CODE",
    "PREEMPTED_EXIT_CODE",
    "CheckpointCadence",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointSaveError",
    "Checkpointer",
    "EventLog",
    "EvidenceSettings",
    "FailureModel",
    "FieldWandbLogger",
    "HangWatchdog",
    "InterruptConfig",
    "JumpRandomSampler",
    "JumpSequentialSampler",
    "Manifest",
    "ManifestCheckpoint",
    "NoProgressError",
    "NoRecoverableCheckpointError",
    "PreflightSettings",
    "ProfiledDDPStrategy",
    "RestoreDrill",
    "ResumeCheckFailed",
    "ResumeConfig",
    "ResumeMismatchError",
    "SnapshotConfig",
    "StaleCheckpointError",
    "StepTracer",
    "StorageConfig",
    "StragglerMonitor",
    "StudyConfig",
    "TimeToQuality",
    "TrainingPreempted",
    "UnsafeCheckpointError",
    "WandbReview",
    "__version__",
    "assert_resumes_exactly",
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
    "select_run",
    "tiny_overfit",
    "verify_checkpoint",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from lightning_field.baseline import (
        PreflightSettings,
        StudyConfig,
        check_data,
        run_preflight,
        run_study,
        tiny_overfit,
    )
    from lightning_field.checkpoint import (
        NO_PROGRESS_EXIT_CODE,
        PREEMPTED_EXIT_CODE,
        CheckpointCorruptError,
        Checkpointer,
        CheckpointError,
        CheckpointSaveError,
        ManifestCheckpoint,
        NoProgressError,
        NoRecoverableCheckpointError,
        ResumeMismatchError,
        StaleCheckpointError,
        TrainingPreempted,
        UnsafeCheckpointError,
        latest_recoverable,
        load_weights,
        verify_checkpoint,
    )
    from lightning_field.checkpoint.options import InterruptConfig, ResumeConfig, SnapshotConfig, StorageConfig
    from lightning_field.core.events import EventLog, read_events, select_run
    from lightning_field.core.manifest import Manifest, read_manifest
    from lightning_field.evidence import EvidenceSettings, RestoreDrill, StepTracer, check_bundle
    from lightning_field.integrations import FieldWandbLogger, WandbReview, log_evidence_bundle, read_offline_run
    from lightning_field.integrations.hydra_configs import register_configs
    from lightning_field.planning.intervals import FailureModel
    from lightning_field.profiling import HANG_EXIT_CODE, HangWatchdog, ProfiledDDPStrategy, StragglerMonitor
    from lightning_field.quality import CheckpointCadence, TimeToQuality, goodput_ledger
    from lightning_field.record import build_record, check_record
    from lightning_field.state.samplers import JumpRandomSampler, JumpSequentialSampler
    from lightning_field.testing import ResumeCheckFailed, assert_resumes_exactly
