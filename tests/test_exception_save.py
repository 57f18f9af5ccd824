"""An exception in the user's code saves the step it reached, where that state is still provably the
step's end, and says why not where it is not (``checkpoint/exception_save.py``). The bitwise
continuation after such a save, beside plain Lightning, is the conformance row
``exception-in-training-step``; Ctrl-C's is ``keyboard-interrupt``."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torchmetrics
from conftest import make_trainer
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from torch import nn
from torch.utils.data import DataLoader

from lightning_field.checkpoint.manifest_checkpoint import NoRecoverableCheckpointError
from lightning_field.checkpoint.resolver import committed_checkpoints
from lightning_field.core.manifest import read_manifest


class Failing(BoringModel):
    """BoringModel with a metric and a batch norm, failing at ``fail_at`` where ``where`` says."""

    def __init__(self, fail_at: int, where: str) -> None:
        super().__init__()
        self.fail_at, self.where = fail_at, where
        self.norm = nn.BatchNorm1d(32)
        self.mean = torchmetrics.MeanMetric()

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        failing = self.trainer.global_step == self.fail_at
        if failing and self.where == "start":
            raise RuntimeError("a bad batch")
        out = self.layer(self.norm(batch) if self.where == "after-norm" else batch)
        if failing and self.where == "after-norm":
            raise RuntimeError("a NaN in the activations")
        loss = out.sum()
        self.mean(loss)
        if failing and self.where == "after-metric":
            raise RuntimeError("a NaN loss")
        return loss

    def train_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64), batch_size=4)  # batch norm needs more than one sample

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        if self.trainer.global_step == self.fail_at and self.where == "optimizer":
            raise RuntimeError("a gradient check")


def fit_failing(root: Path, where: str, **checkpoint: Any) -> tuple[list[str], list[str]]:
    """The checkpoints a run failing at step 6 left, and the warnings that say none was saved."""
    torch.manual_seed(0)
    run = make_trainer(root, 10, every_n_train_steps=100, snapshot_every_n_train_steps=None, **checkpoint)
    with pytest.raises(RuntimeError), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run.fit(Failing(5, where))
    said = [str(w.message) for w in caught if "no resume point saved" in str(w.message)]
    return [e.path.name for e in committed_checkpoints(root / "ckpts")], said


def test_an_exception_before_the_step_touched_anything_saves_the_step_reached(tmp_path: Path) -> None:
    saved, said = fit_failing(tmp_path, "start")
    assert saved == ["failed-step=5"] and said == []
    manifest = read_manifest(tmp_path / "ckpts" / "failed-step=5")
    assert manifest.recoverable and manifest.step == 5
    assert manifest.stopped is not None and manifest.stopped["by"] == "RuntimeError"
    assert manifest.stopped["finished"] is False and "a bad batch" in manifest.stopped["detail"]


@pytest.mark.parametrize(
    ("where", "why"),
    [
        ("after-norm", "buffer norm."),  # its batch counter and running statistics
        ("after-metric", "torchmetrics state mean.mean_value"),
        ("optimizer", "an optimizer step had begun"),
    ],
)
def test_an_exception_after_the_step_changed_state_saves_nothing_and_says_what(
    tmp_path: Path, where: str, why: str
) -> None:
    saved, said = fit_failing(tmp_path, where)
    assert saved == []
    assert len(said) == 1 and why in said[0] and "RuntimeError at step 6" in said[0], said


def test_an_exception_inside_a_gradient_accumulation_window_saves_nothing(tmp_path: Path) -> None:
    torch.manual_seed(0)
    run = make_trainer(tmp_path, 10, every_n_train_steps=100, snapshot_every_n_train_steps=None)
    run.accumulate_grad_batches = 2
    model = Failing(3, "start")
    original = model.training_step

    def second_micro_batch_fails(batch: Any, batch_idx: int) -> Any:
        if model.trainer.global_step == 3 and batch_idx % 2 == 1:
            raise RuntimeError("a bad batch")
        return original(batch, batch_idx) if model.trainer.global_step != 3 else model.layer(batch).sum()

    model.training_step = second_micro_batch_fails  # type: ignore[method-assign]
    with pytest.raises(RuntimeError), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run.fit(model)
    assert committed_checkpoints(tmp_path / "ckpts") == []
    said = [str(w.message) for w in caught if "no resume point saved" in str(w.message)]
    assert len(said) == 1 and "gradient-accumulation window" in said[0], said


def _plain_save_on_exception(root: Path, where: str) -> list[str]:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    torch.manual_seed(0)
    plain = ModelCheckpoint(
        dirpath=root, every_n_train_steps=100, filename="{epoch}-{step}-crash", save_on_exception=True
    )
    trainer = pl.Trainer(max_steps=10, default_root_dir=root, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0, callbacks=[plain])  # fmt: skip
    with pytest.raises(RuntimeError):
        trainer.fit(Failing(5, where))
    return sorted(p.name for p in root.iterdir())


def test_save_on_exception_names_the_saved_step_by_the_users_filename_as_model_checkpoint_does(tmp_path: Path) -> None:
    plain = _plain_save_on_exception(tmp_path / "plain", "start")
    saved, said = fit_failing(tmp_path, "start", save_on_exception=True, filename="{epoch}-{step}-crash")
    assert plain == ["epoch=0-step=5-crash.ckpt"] and saved == ["epoch=0-step=5-crash"] and said == []
    manifest = read_manifest(tmp_path / "ckpts" / "epoch=0-step=5-crash")
    assert manifest.step == 5 and manifest.recoverable and manifest.stopped == {
        "by": "RuntimeError", "detail": "RuntimeError in step 6: a bad batch", "finished": False
    }


def test_save_on_exception_saves_the_state_between_two_steps_as_not_recoverable(tmp_path: Path) -> None:
    """After an optimizer step began, ModelCheckpoint(save_on_exception=True) saves weights that are neither
    step's with the next batch already fetched. Kept, as the user asked, but its manifest says it is not
    recoverable: ckpt_path="last" passes it by instead of resuming a continuation that could not be exact."""
    plain = _plain_save_on_exception(tmp_path / "plain", "optimizer")
    saved, said = fit_failing(tmp_path, "optimizer", save_on_exception=True, filename="{epoch}-{step}-crash")
    assert plain == ["epoch=0-step=5-crash.ckpt"] and saved == ["epoch=0-step=5-crash"]
    assert said and "an optimizer step had begun" in said[0]
    manifest = read_manifest(tmp_path / "ckpts" / "epoch=0-step=5-crash")
    assert not manifest.recoverable and any("between two steps" in m for m in manifest.missing)
    rerun = make_trainer(tmp_path, 10, every_n_train_steps=100, snapshot_every_n_train_steps=None)
    with pytest.raises(NoRecoverableCheckpointError, match="epoch=0-step=5-crash"):
        rerun.fit(Failing(99, "start"), ckpt_path="last")
