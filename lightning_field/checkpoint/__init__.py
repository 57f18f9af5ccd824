"""Manifest-complete checkpoints: the Lightning-free ``Checkpointer`` (commit protocol, resolver,
verification, retention) and the Lightning callback that drives it."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from lightning_field.core.lazy import lazy_exports
from lightning_field.core.storage import StorageOptions

# Imported on first use (PEP 562), as the package's top level does: `field ckpt list/verify/inspect`
# read manifests and hashes, and must not pay ~4 s for Lightning, which the callback needs.
_EXPORTS: dict[str, str] = {
    "Checkpointer": "lightning_field.checkpoint.checkpointer",
    "NothingToRestoreError": "lightning_field.checkpoint.checkpointer",
    "Restored": "lightning_field.checkpoint.checkpointer",
    "Stateful": "lightning_field.checkpoint.checkpointer",
    "CheckpointSaveError": "lightning_field.checkpoint.commit",
    "CheckpointError": "lightning_field.core.errors",
    "ManifestCheckpointIO": "lightning_field.checkpoint.io",
    "ManifestCheckpoint": "lightning_field.checkpoint.manifest_checkpoint",
    "NO_PROGRESS_EXIT_CODE": "lightning_field.checkpoint.no_progress",
    "NoProgressError": "lightning_field.checkpoint.no_progress",
    "PREEMPTED_EXIT_CODE": "lightning_field.checkpoint.preemption",
    "TrainingPreempted": "lightning_field.checkpoint.preemption",
    "committed_checkpoints": "lightning_field.checkpoint.resolver",
    "latest_recoverable": "lightning_field.checkpoint.resolver",
    "read_last_pointer": "lightning_field.checkpoint.resolver",
    "NoRecoverableCheckpointError": "lightning_field.checkpoint.resume_last",
    "ResumeMismatchError": "lightning_field.checkpoint.resume_policy",
    "StaleCheckpointError": "lightning_field.checkpoint.freshness",
    "UnsafeCheckpointError": "lightning_field.checkpoint.safe_load",
    "CheckpointCorruptError": "lightning_field.checkpoint.verify",
    "VerifyReport": "lightning_field.checkpoint.verify",
    "require_intact": "lightning_field.checkpoint.verify",
    "verify_checkpoint": "lightning_field.checkpoint.verify",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from lightning_field.checkpoint.checkpointer import Checkpointer, NothingToRestoreError, Restored, Stateful
    from lightning_field.checkpoint.commit import CheckpointSaveError
    from lightning_field.checkpoint.freshness import StaleCheckpointError
    from lightning_field.checkpoint.io import ManifestCheckpointIO
    from lightning_field.checkpoint.manifest_checkpoint import ManifestCheckpoint
    from lightning_field.checkpoint.no_progress import NO_PROGRESS_EXIT_CODE, NoProgressError
    from lightning_field.checkpoint.preemption import PREEMPTED_EXIT_CODE, TrainingPreempted
    from lightning_field.checkpoint.resolver import committed_checkpoints, latest_recoverable, read_last_pointer
    from lightning_field.checkpoint.resume_last import NoRecoverableCheckpointError
    from lightning_field.checkpoint.resume_policy import ResumeMismatchError
    from lightning_field.checkpoint.safe_load import UnsafeCheckpointError
    from lightning_field.checkpoint.verify import (
        CheckpointCorruptError,
        VerifyReport,
        require_intact,
        verify_checkpoint,
    )
    from lightning_field.core.errors import CheckpointError


def load_weights(
    path: str | os.PathLike[str],
    map_location: Any = "cpu",
    trust_pickles: bool = False,
    *,
    strip_compile_prefix: bool = False,
    strip_prefixes: Iterable[str] = (),
    storage_options: StorageOptions | None = None,
) -> dict[str, Any]:
    """The model ``state_dict`` of any committed checkpoint, sharded (DCP) or not (including exports),
    verified first and loaded as untrusted input (``trust_pickles``: see
    :mod:`lightning_field.checkpoint.safe_load`); a sharded one is assembled whole on the CPU, in this
    process. ``strip_compile_prefix``: the ``_orig_mod.`` segments of a ``torch.compile``d module
    removed; ``strip_prefixes``: each removed from the start of the keys that have it (a prefix no key
    has raises ``ValueError``). ``path`` may be an fsspec URL, with its ``storage_options``.

    Raises:
        CheckpointCorruptError: a file it needs does not match the manifest, naming it.
        UnsafeCheckpointError: the file needs a full unpickle, naming what it holds (nothing was run).
    """
    # Imported here, as the lazy exports are: reading a manifest must not import torch.
    from lightning_field.checkpoint.weights import read_model_weights

    return read_model_weights(
        path,
        map_location,
        trust_pickles,
        strip_prefixes=strip_prefixes,
        strip_compile_prefix=strip_compile_prefix,
        storage_options=storage_options,
    ).state_dict


__all__ = [
    "NO_PROGRESS_EXIT_CODE",
    "PREEMPTED_EXIT_CODE",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointSaveError",
    "Checkpointer",
    "ManifestCheckpoint",
    "ManifestCheckpointIO",
    "NoProgressError",
    "NoRecoverableCheckpointError",
    "NothingToRestoreError",
    "Restored",
    "ResumeMismatchError",
    "StaleCheckpointError",
    "Stateful",
    "TrainingPreempted",
    "UnsafeCheckpointError",
    "VerifyReport",
    "committed_checkpoints",
    "latest_recoverable",
    "load_weights",
    "read_last_pointer",
    "require_intact",
    "verify_checkpoint",
]
