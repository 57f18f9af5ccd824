"""One error type to catch: every checkpoint failure is a ``CheckpointError``.

A user wraps a resume or an export in one ``except CheckpointError`` and handles a corrupt file, a
refusal to resume, an unreadable manifest and a failed save alike; code written against the built-in
bases the errors had before (``RuntimeError``, ``ValueError``, ``FileNotFoundError``) still catches them.
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
from lightning.pytorch.demos.boring_classes import BoringModel

import lightning_field
from lightning_field import CheckpointError, ManifestCheckpoint
from lightning_field.checkpoint.checkpointer import NothingToRestoreError
from lightning_field.checkpoint.export import ExportRefusedError
from lightning_field.checkpoint.weights import UnreadableWeightsError
from lightning_field.core.manifest import ManifestError, read_manifest

ERRORS_AND_THEIR_BUILT_IN_BASES = [
    (lightning_field.CheckpointCorruptError, RuntimeError),
    (lightning_field.CheckpointSaveError, RuntimeError),
    (lightning_field.NoRecoverableCheckpointError, RuntimeError),
    (lightning_field.ResumeMismatchError, RuntimeError),
    (lightning_field.StaleCheckpointError, RuntimeError),
    (lightning_field.UnsafeCheckpointError, RuntimeError),
    (UnreadableWeightsError, RuntimeError),
    (NothingToRestoreError, FileNotFoundError),
    (ExportRefusedError, ValueError),
    (ManifestError, ValueError),
]


@pytest.mark.parametrize(("error", "base"), ERRORS_AND_THEIR_BUILT_IN_BASES, ids=lambda e: e.__name__)
def test_each_checkpoint_error_is_a_checkpoint_error_and_keeps_its_built_in_base(
    error: type[Exception], base: type[Exception]
) -> None:
    assert issubclass(error, CheckpointError) and issubclass(error, base)


def _fit(root: Path, max_steps: int, ckpt_path: str | None = None) -> ManifestCheckpoint:
    pl.seed_everything(0)
    checkpoint = ManifestCheckpoint(dirpath=root / "ckpts", every_n_train_steps=2, snapshot_every_n_train_steps=None)
    trainer = pl.Trainer(max_steps=max_steps, callbacks=[checkpoint], default_root_dir=root, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)  # fmt: skip
    trainer.fit(BoringModel(), ckpt_path=ckpt_path)
    return checkpoint


def test_one_except_clause_catches_a_corrupt_checkpoint_and_a_missing_manifest(tmp_path: Path) -> None:
    saved = Path(_fit(tmp_path, 4).best_model_path)
    caught: list[str] = []

    state = saved.with_suffix("") / "rank-00000.pt"
    state.write_bytes(state.read_bytes()[:-8])  # truncated: the manifest's size no longer matches
    try:
        _fit(tmp_path, 6, ckpt_path=str(saved))
    except CheckpointError as err:
        caught.append(type(err).__name__)
    try:
        read_manifest(tmp_path / "nowhere")
    except CheckpointError as err:
        caught.append(type(err).__name__)
    assert caught == ["CheckpointCorruptError", "ManifestError"]
