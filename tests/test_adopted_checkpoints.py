"""Switching between ``ModelCheckpoint`` and ``ManifestCheckpoint`` keeps the callback's bookkeeping.

Both key their state in a checkpoint by ``ModelCheckpoint``'s own state key, so a run that resumes a
plain ``ModelCheckpoint`` ``.ckpt`` under ``ManifestCheckpoint`` (and the reverse) picks up its
``best_model_path``, ``best_k_models`` and scores, as a run with the same callback would.
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_field import ManifestCheckpoint, read_manifest


class Logged(BoringModel):
    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self.log("val_loss", self.layer(batch).sum())


class Restored(pl.Callback):
    """Records a checkpoint callback's bookkeeping as the restore left it, before any new save."""

    def __init__(self, callback: ModelCheckpoint, into: dict, key: type) -> None:
        self.callback, self.into, self.key = callback, into, key

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        c = self.callback
        self.into[self.key] = (c.best_model_path, dict(c.best_k_models), c.best_model_score)


def _trainer(root: Path, steps: int, callback: ModelCheckpoint) -> pl.Trainer:
    return pl.Trainer(default_root_dir=root, max_steps=steps, val_check_interval=2, logger=False, callbacks=[callback],
                      enable_progress_bar=False, enable_model_summary=False)  # fmt: skip


def test_our_state_is_saved_under_model_checkpoints_key_too_and_a_model_checkpoint_beside_ours_keeps_its_own(
    tmp_path: Path,
) -> None:
    settings = {"monitor": "val_loss", "every_n_train_steps": 2}
    ours = ManifestCheckpoint(dirpath=tmp_path / "ours", snapshot_every_n_train_steps=None, **settings)
    beside = ModelCheckpoint(dirpath=tmp_path / "plain", **settings)  # one Trainer, both: Lightning allows it
    pl.seed_everything(0)
    _trainer(tmp_path, 4, ours).fit(Logged())
    saved = torch.load(ours.best_model_path, weights_only=False)["callbacks"]
    assert saved[ours.model_checkpoint_state_key] == saved[ours.state_key]
    pl.seed_everything(0)
    ours = ManifestCheckpoint(dirpath=tmp_path / "both", snapshot_every_n_train_steps=None, **settings)
    trainer = _trainer(tmp_path / "both-run", 4, ours)
    trainer.callbacks.append(beside)
    trainer.fit(Logged())
    saved = torch.load(ours.best_model_path, weights_only=False)["callbacks"]
    assert saved[ours.model_checkpoint_state_key]["dirpath"] == str(tmp_path / "plain")  # the plain one's own
    assert saved[ours.state_key]["dirpath"] == str(tmp_path / "both")


def test_a_model_checkpoint_ckpt_resumed_under_manifest_checkpoint_keeps_its_best_and_top_k(tmp_path: Path) -> None:
    def checkpoint(cls: type[ModelCheckpoint]) -> ModelCheckpoint:
        return cls(dirpath=tmp_path / "plain", monitor="val_loss", save_top_k=2, every_n_train_steps=2)

    written = checkpoint(ModelCheckpoint)
    pl.seed_everything(0)
    _trainer(tmp_path, 6, written).fit(Logged())
    assert len(written.best_k_models) == 2
    resumed: dict = {}
    for cls in (ModelCheckpoint, ManifestCheckpoint):  # plain Lightning's restore, then ours, of the same file
        callback = checkpoint(cls)
        pl.seed_everything(0)
        trainer = _trainer(tmp_path / cls.__name__, 6, callback)
        trainer.callbacks.append(Restored(callback, resumed, cls))
        trainer.fit(Logged(), ckpt_path=written.best_model_path)
    assert resumed[ManifestCheckpoint] == resumed[ModelCheckpoint]
    assert resumed[ManifestCheckpoint][0] == written.best_model_path  # was "": ModelCheckpoint's key was not read


def test_a_run_switched_to_manifest_checkpoint_resumes_model_checkpoints_last_ckpt_not_step_0(tmp_path: Path) -> None:
    """Plain Lightning's ckpt_path="last" takes ``last.ckpt``; ours did not see it and trained from step 0."""
    plain = ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=2, save_last=True)
    pl.seed_everything(0)
    _trainer(tmp_path, 4, plain).fit(Logged())
    ours = ManifestCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=2, snapshot_every_n_train_steps=None)
    pl.seed_everything(0)
    trainer = _trainer(tmp_path, 6, ours)
    with pytest.warns(UserWarning, match="resuming from ModelCheckpoint's .*last.ckpt, as plain Lightning would"):
        trainer.fit(Logged(), ckpt_path="last")
    assert trainer.global_step == 6
    newest = read_manifest(tmp_path / "ckpts" / "epoch=0-step=6")
    assert newest.provenance["inexact_resume"]["checkpoint"] == str(tmp_path / "ckpts" / "last.ckpt")


@pytest.mark.parametrize("cls", [ModelCheckpoint, ManifestCheckpoint])
def test_a_resume_of_the_callbacks_own_checkpoint_tells_no_one_to_add_a_model_checkpoint(
    tmp_path: Path, recwarn: pytest.WarningsRecorder, cls: type[ModelCheckpoint]
) -> None:
    """Lightning warns of every callback state in a checkpoint that no callback of the Trainer takes.
    The copy of our state under ModelCheckpoint's key (for a run switched back to it) is taken by
    the load, so a resume warns no more than plain Lightning's."""
    settings = {"dirpath": tmp_path / "ckpts", "monitor": "val_loss", "every_n_train_steps": 2}
    first = cls(**settings)
    pl.seed_everything(0)
    _trainer(tmp_path, 4, first).fit(Logged())
    resumed = cls(**settings)
    pl.seed_everything(0)
    trainer = _trainer(tmp_path, 6, resumed)
    trainer.fit(Logged(), ckpt_path=first.best_model_path)
    assert trainer.global_step == 6 and resumed.best_model_path
    assert not [w for w in recwarn if "Please add the following callbacks" in str(w.message)]
