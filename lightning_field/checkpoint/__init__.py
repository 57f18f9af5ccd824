"""Manifest-complete checkpoints: commit protocol, resolver, verification and the Lightning callback."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lightning_field.checkpoint.commit import CheckpointSaveError
from lightning_field.checkpoint.io import ManifestCheckpointIO, torch_load_verified
from lightning_field.checkpoint.manifest_checkpoint import ManifestCheckpoint
from lightning_field.checkpoint.preemption import PREEMPTED_EXIT_CODE, TrainingPreempted
from lightning_field.checkpoint.resolver import committed_checkpoints, latest_recoverable, read_last_pointer
from lightning_field.checkpoint.resume_policy import NoRecoverableCheckpointError, ResumeMismatchError
from lightning_field.checkpoint.verify import CheckpointCorruptError, VerifyReport, require_intact, verify_checkpoint
from lightning_field.core.manifest import SHARED_STATE_FILE, read_manifest


def load_weights(path: str | os.PathLike[str], map_location: Any = "cpu") -> dict[str, Any]:
    """The model ``state_dict`` of any committed unsharded checkpoint (including exports), verified first."""
    if SHARED_STATE_FILE not in read_manifest(path).files:
        raise ValueError(
            f"{path} is a sharded (DCP) checkpoint: its weights are spread over .distcp files; load it with"
            " torch.distributed.checkpoint or resume from it under the strategy that wrote it"
        )
    require_intact(path, [SHARED_STATE_FILE])
    return torch_load_verified(Path(path) / SHARED_STATE_FILE, map_location)["state_dict"]


__all__ = [
    "PREEMPTED_EXIT_CODE",
    "CheckpointCorruptError",
    "CheckpointSaveError",
    "ManifestCheckpoint",
    "ManifestCheckpointIO",
    "NoRecoverableCheckpointError",
    "ResumeMismatchError",
    "TrainingPreempted",
    "VerifyReport",
    "committed_checkpoints",
    "latest_recoverable",
    "load_weights",
    "read_last_pointer",
    "require_intact",
    "verify_checkpoint",
]
