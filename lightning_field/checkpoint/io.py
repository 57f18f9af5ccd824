"""Loading manifest checkpoints through Lightning's own restore path.

``ManifestCheckpoint`` installs this around the strategy's CheckpointIO during ``setup``, so
``trainer.fit(ckpt_path=...)`` with a checkpoint directory is verified before anything is
unpickled, merges this rank's own RNG and data position, and refuses a resume into a different run.
Plain ``.ckpt`` files are passed through to the wrapped CheckpointIO unchanged.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import CheckpointIO

from lightning_field.checkpoint.commit import remove_committed
from lightning_field.checkpoint.verify import require_intact
from lightning_field.core.distributed import global_rank
from lightning_field.core.manifest import (
    SHARED_STATE_FILE,
    Manifest,
    is_checkpoint_dir,
    rank_state_file,
    read_manifest,
)

log = logging.getLogger(__name__)

FIELD_KEY = "lightning_field"
"""Key under which a loaded checkpoint dict carries the manifest and this rank's own state."""


def torch_load_verified(path: Path, map_location: Any = None) -> Any:
    """Load a file whose hash was already verified; ``weights_only`` whenever the contents allow it.

    Only plain containers and tensors load under ``weights_only=True``. A checkpoint whose hparams
    hold arbitrary objects needs full unpickling, which is acceptable here because the bytes were
    just proven identical to what this library wrote.
    """
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        log.debug("%s needs full unpickling (%s); its hash was verified first", path, err)
        return torch.load(path, map_location=map_location, weights_only=False)


class ManifestCheckpointIO(CheckpointIO):
    def __init__(self, inner: CheckpointIO, on_manifest: Callable[[Manifest, Path], None] | None = None) -> None:
        self.inner = inner
        self.on_manifest = on_manifest

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        # ``trainer.save_checkpoint("x.ckpt")`` by the user keeps working as a plain export.
        self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        if not is_checkpoint_dir(path):
            return self.inner.load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        return load_manifest_checkpoint(Path(path), map_location, self.on_manifest)

    def remove_checkpoint(self, path: Any) -> None:
        if is_checkpoint_dir(path) or Path(path).is_dir():
            remove_committed(Path(path))
        else:
            self.inner.remove_checkpoint(path)

    def teardown(self) -> None:
        self.inner.teardown()


def load_manifest_checkpoint(
    path: Path, map_location: Any = None, on_manifest: Callable[[Manifest, Path], None] | None = None
) -> dict[str, Any]:
    """Verify, check compatibility (``on_manifest`` may raise), then load shared and per-rank state."""
    start = time.perf_counter()
    rank = global_rank()
    manifest = read_manifest(path)
    if on_manifest is not None:
        on_manifest(manifest, path)
    own = rank_state_file(rank)
    wanted = [SHARED_STATE_FILE] + ([own] if own in manifest.files else [])
    require_intact(path, wanted)
    # Like Lightning's own CheckpointIO: tensors land on the CPU and the strategy moves them.
    checkpoint = torch_load_verified(path / SHARED_STATE_FILE, map_location or "cpu")
    rank_state = torch_load_verified(path / own, map_location="cpu") if own in manifest.files else None
    if rank_state is not None:
        loader_states = rank_state.get("data_position", {}).get("loader_states")
        fit_loop = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict")
        if loader_states and fit_loop is not None:
            # Rank 0's copy in the shared file is replaced by this rank's own loader position.
            fit_loop["combined_loader"] = loader_states
    else:
        log.warning("Checkpoint %s has no state for rank %d: its RNG and data position start fresh", path, rank)
    checkpoint[FIELD_KEY] = {
        "manifest": manifest,
        "path": str(path),
        "rank_state": rank_state,
        "load_seconds": time.perf_counter() - start,
    }
    return checkpoint
