"""Every save of ManifestCheckpoint goes through ``Trainer.save_checkpoint``, as ModelCheckpoint's do.

A user who overrides ``Trainer.save_checkpoint`` (to log, to upload, to count) sees each save, with
ModelCheckpoint's arguments; the dict it builds is what the commit writes, verified and atomic as
always. A ``trainer.save_checkpoint("x.ckpt")`` of the user's own still writes Lightning's plain file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_field import ManifestCheckpoint
from lightning_field.checkpoint.stores import read_manifest


class CountingTrainer(pl.Trainer):
    """A user's Trainer that notes each save before making it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.saves: list[tuple[str, bool]] = []

    def save_checkpoint(self, filepath: Any, weights_only: bool = False, storage_options: Any = None) -> None:
        self.saves.append((os.path.basename(filepath), weights_only))
        super().save_checkpoint(filepath, weights_only, storage_options)


def _fit(callback: ModelCheckpoint, root: Path) -> CountingTrainer:
    pl.seed_everything(0)
    trainer = CountingTrainer(max_steps=9, callbacks=[callback], default_root_dir=root, logger=False,
                              enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)  # fmt: skip
    trainer.fit(BoringModel())
    return trainer


def test_a_users_save_checkpoint_override_sees_every_save_as_with_model_checkpoint(tmp_path: Path) -> None:
    settings = {"every_n_train_steps": 3, "save_top_k": -1, "save_weights_only": False}
    plain = _fit(ModelCheckpoint(dirpath=tmp_path / "plain", **settings), tmp_path / "plain-root")  # type: ignore[arg-type]
    ours = ManifestCheckpoint(dirpath=tmp_path / "ours", snapshot_every_n_train_steps=None, **settings)  # type: ignore[arg-type]
    trainer = _fit(ours, tmp_path / "ours-root")
    assert trainer.saves == plain.saves == [("epoch=0-step=3.ckpt", False), ("epoch=0-step=6.ckpt", False),
                                            ("epoch=0-step=9.ckpt", False)]  # fmt: skip
    # What the override saw is what was committed: the same dict, verified and recoverable.
    for name, _ in trainer.saves:
        manifest = read_manifest(tmp_path / "ours" / name)
        assert manifest.recoverable and manifest.step == int(name.removesuffix(".ckpt").rsplit("=", 1)[1])

    # The user's own save is Lightning's file, written by the strategy as ever; the callback's saves go on.
    trainer.save_checkpoint(tmp_path / "mine.ckpt")
    assert torch.load(tmp_path / "mine.ckpt", weights_only=False)["global_step"] == 9
    assert not (tmp_path / "mine").exists()


def test_a_save_checkpoint_that_never_reaches_the_strategy_commits_nothing_and_training_goes_on(
    tmp_path: Path,
) -> None:
    class NoSaves(CountingTrainer):
        def save_checkpoint(self, filepath: Any, weights_only: bool = False, storage_options: Any = None) -> None:
            self.saves.append((os.path.basename(filepath), weights_only))  # as a test's mock: nothing saved

    pl.seed_everything(0)
    ours = ManifestCheckpoint(dirpath=tmp_path / "ours", every_n_train_steps=3, snapshot_every_n_train_steps=None)
    trainer = NoSaves(max_steps=6, callbacks=[ours], default_root_dir=tmp_path, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)  # fmt: skip
    trainer.fit(BoringModel())
    assert trainer.global_step == 6 and [name for name, _ in trainer.saves] == ["epoch=0-step=3.ckpt",
                                                                               "epoch=0-step=6.ckpt"]  # fmt: skip
    assert not list((tmp_path / "ours").glob("epoch=*")) and ours.last_committed is None
