"""A run that stops before its limits leaves its resume point at the stop, and retention counts the
checkpoints of every attempt: on Lightning's own BoringModel, beside plain ModelCheckpoint.

The bitwise comparisons with an uninterrupted run (max_time, should_stop under max_epochs and
max_steps, inside an accumulation window) are conformance rows (test_conformance.py).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_field import ManifestCheckpoint
from lightning_field.checkpoint.resolver import committed_checkpoints

sys.path.insert(0, str(Path(__file__).parent / "jobs"))
from conformance_job import StopAtStep


def _fit(root: Path, callback: ModelCheckpoint, max_steps: int, *extra: Callback, resume: bool = False) -> pl.Trainer:
    trainer = pl.Trainer(
        default_root_dir=root, max_steps=max_steps, accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, callbacks=[callback, *extra],
    )  # fmt: skip
    pl.seed_everything(7)
    trainer.fit(BoringModel(), ckpt_path="last" if resume else None)
    return trainer


def _saved(dirpath: Path) -> list[str]:
    return sorted(p.name for p in dirpath.iterdir() if p.is_dir() and not p.name.startswith("."))


def test_with_save_top_k_1_a_stopped_and_rerun_run_keeps_only_its_newest_checkpoint_where_plain_lightning_keeps_two(
    tmp_path: Path,
) -> None:
    field_dir, plain_dir = tmp_path / "field" / "ckpts", tmp_path / "plain" / "ckpts"
    field = ManifestCheckpoint(dirpath=field_dir, every_n_train_steps=4, save_top_k=1)
    first = _fit(tmp_path / "field", field, 20, StopAtStep(6))
    assert first.global_step == 6 and field.last_saved_step == 6, "the stop step was not saved"
    assert _saved(field_dir) == ["stopped-step=6"], "the stop replaces the step-4 checkpoint, as top-1 keeps the newest"
    rerun = ManifestCheckpoint(dirpath=field_dir, every_n_train_steps=4, save_top_k=1)
    _fit(tmp_path / "field", rerun, 12, resume=True)
    assert _saved(field_dir) == ["epoch=0-step=12"], "the earlier attempt's checkpoint outlived save_top_k=1"
    assert [e.manifest.step for e in committed_checkpoints(field_dir) if e.manifest] == [12]

    # Lightning alone: the stop is not saved, and the checkpoint it resumed from is kept for good.
    _fit(tmp_path / "plain", ModelCheckpoint(dirpath=plain_dir, every_n_train_steps=4, save_top_k=1), 20, StopAtStep(6))
    _fit(tmp_path / "plain", ModelCheckpoint(dirpath=plain_dir, every_n_train_steps=4, save_top_k=1), 12, resume=True)
    assert sorted(p.name for p in plain_dir.iterdir()) == ["epoch=0-step=12.ckpt", "epoch=0-step=4.ckpt"]


def test_save_top_k_minus_1_keeps_every_attempts_stop_point_and_the_final_step_of_max_steps(tmp_path: Path) -> None:
    dirpath = tmp_path / "ckpts"
    _fit(tmp_path, ManifestCheckpoint(dirpath=dirpath, every_n_train_steps=4, save_top_k=-1), 20, StopAtStep(6))
    rerun = ManifestCheckpoint(dirpath=dirpath, every_n_train_steps=4, save_top_k=-1, save_on_train_end=True)
    _fit(tmp_path, rerun, 10, resume=True)
    assert _saved(dirpath) == ["epoch=0-step=4", "epoch=0-step=8", "final-step=10", "stopped-step=6"]


class StopsInItsOwnBatchEndHook(BoringModel):
    """Sets ``trainer.should_stop`` in ``LightningModule.on_train_batch_end``, which Lightning calls after
    every callback's: no callback sees the stop before the epoch's end has begun."""

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.trainer.global_step == 6:
            self.trainer.should_stop = True


def test_a_stop_no_callback_could_see_in_time_is_named_and_not_saved_as_a_resume_point(tmp_path: Path) -> None:
    dirpath = tmp_path / "ckpts"
    callback = ManifestCheckpoint(dirpath=dirpath, every_n_train_steps=4, save_top_k=-1, save_on_train_end=True)
    trainer = pl.Trainer(
        default_root_dir=tmp_path, max_steps=20, accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, callbacks=[callback],
    )  # fmt: skip
    with pytest.warns(UserWarning, match="LightningModule.on_train_batch_end"):
        trainer.fit(StopsInItsOwnBatchEndHook())
    assert trainer.global_step == 6
    # The epoch's end has run by then: a save there would resume one epoch ahead (the bug this prevents).
    assert _saved(dirpath) == ["epoch=0-step=4"]


class LogsItsLoss(BoringModel):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        out = super().training_step(batch, batch_idx)
        self.log("logged_loss", out["loss"])
        return out


def test_a_monitored_top_k_retires_the_earlier_attempts_stop_point_once_the_rerun_commits_a_newer_checkpoint(
    tmp_path: Path,
) -> None:
    dirpath = tmp_path / "ckpts"

    def callback() -> ManifestCheckpoint:
        return ManifestCheckpoint(dirpath=dirpath, every_n_train_steps=4, save_top_k=2, monitor="logged_loss")

    for attempt, (max_steps, extra) in enumerate([(20, [StopAtStep(6)]), (12, [])]):
        trainer = pl.Trainer(
            default_root_dir=tmp_path, max_steps=max_steps, accelerator="cpu", logger=False,
            enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
            callbacks=[callback(), *extra],
        )  # fmt: skip
        pl.seed_everything(7)
        trainer.fit(LogsItsLoss(), ckpt_path="last" if attempt else None)
        if attempt == 0:
            assert "stopped-step=6" in _saved(dirpath)
    saved = _saved(dirpath)
    assert not any(name.startswith("stopped") for name in saved), saved
    assert len(saved) == 2, f"save_top_k=2 kept {saved}"


def test_resume_points_read_back_from_a_checkpoint_never_name_anything_outside_its_dirpath_for_removal(
    tmp_path: Path,
) -> None:
    dirpath = tmp_path / "ckpts"
    dirpath.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    callback = ManifestCheckpoint(dirpath=dirpath)
    hostile = [str(victim), str(dirpath / ".." / "victim"), "/etc", 7, str(dirpath / "stopped-step=6")]
    callback.load_state_dict({**callback.state_dict(), "resume_points": hostile})
    assert callback.state_dict()["resume_points"] == [str(dirpath / "stopped-step=6")]
    trainer = pl.Trainer(default_root_dir=tmp_path, logger=False)
    assert not callback._should_remove_checkpoint(trainer, str(dirpath / ".." / "victim"), str(dirpath / "x"))
    assert callback._should_remove_checkpoint(trainer, str(dirpath / "epoch=0-step=4"), str(dirpath / "x"))
