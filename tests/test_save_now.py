"""``ManifestCheckpoint.save_now``: the public, collective save that preemption and straggler stops use.

A user's own callback calls it on ordinary Lightning code (``BoringModel``, its plain DataLoader);
the checkpoint it makes must be committed and recoverable, and hold what plain Lightning's own
``trainer.save_checkpoint`` holds at the same step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_field import ManifestCheckpoint
from lightning_field.checkpoint.stores import checkpoint_location
from lightning_field.core.manifest import read_manifest


class SaveAt(pl.Callback):
    """Saves at ``step`` through ``save_now`` and, for comparison, through plain Lightning."""

    def __init__(self, checkpoint: ManifestCheckpoint, step: int, plain: Path, **save_now: Any) -> None:
        self.checkpoint, self.step, self.plain, self.save_now = checkpoint, step, plain, save_now
        self.paths: list[str | None] = []

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step and not self.paths:
            self.paths.append(self.checkpoint.save_now(trainer, "manual-{step}", **self.save_now))
            self.committed = self.checkpoint.last_committed
            self.paths.append(self.checkpoint.save_now(trainer, "again-{step}", unless_saved=True))
            trainer.save_checkpoint(self.plain)


def _fit(tmp_path: Path, **save_now: Any) -> tuple[ManifestCheckpoint, SaveAt]:
    checkpoint = ManifestCheckpoint(dirpath=tmp_path / "ckpts", async_save=save_now.pop("async_save", False))
    saver = SaveAt(checkpoint, 3, tmp_path / "plain.ckpt", **save_now)
    trainer = pl.Trainer(
        default_root_dir=tmp_path, max_steps=5, callbacks=[saver, checkpoint], logger=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
    )  # fmt: skip
    trainer.fit(BoringModel())
    return checkpoint, saver


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async-blocking"])
def test_save_now_commits_a_recoverable_checkpoint_holding_what_plain_lightning_saves_at_that_step(
    tmp_path: Path, async_save: bool
) -> None:
    checkpoint, saver = _fit(tmp_path, async_save=async_save, blocking=async_save)
    path, again = saver.paths
    assert path is not None and Path(path).name == "manual-step=3.ckpt"  # ModelCheckpoint's name for it
    assert again == path, "unless_saved names this step's checkpoint instead of saving it twice"
    assert saver.committed == (str(checkpoint_location(path)), 3), "advertised by the time save_now returns"
    assert checkpoint.save_failures == 0
    manifest = read_manifest(path)  # committed: a manifest exists only after the commit
    assert manifest.step == 3 and manifest.recoverable, manifest.missing
    ours = torch.load(path, weights_only=False)
    plain = torch.load(saver.plain, weights_only=False)
    assert ours["state_dict"].keys() == plain["state_dict"].keys()
    for name, tensor in plain["state_dict"].items():
        assert torch.equal(ours["state_dict"][name], tensor), name
    assert ours["global_step"] == plain["global_step"] == 3
    assert not (Path(tmp_path) / "ckpts" / "again-step=3").exists()
    assert not (Path(tmp_path) / "ckpts" / "again-step=3.ckpt").exists()
