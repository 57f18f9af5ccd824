"""A checkpoint that lacks a component is saved, but never advertised or used as a recovery point."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest

from lightning_field import ManifestCheckpoint, ResumeMismatchError, latest_recoverable, load_weights, read_manifest
from lightning_field.cli.main import main as field_main
from lightning_field.demo import DemoDataModule, DemoRegressor


def _fit(root: Path, datamodule: pl.LightningDataModule, **checkpoint_kwargs: object) -> Path:
    ckpts = root / "ckpts"
    trainer = pl.Trainer(
        default_root_dir=root,
        max_steps=4,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[ManifestCheckpoint(dirpath=ckpts, every_n_train_steps=2, save_top_k=-1, **checkpoint_kwargs)],
    )
    trainer.fit(DemoRegressor(), datamodule=datamodule)
    return ckpts


def test_plain_dataloader_checkpoint_is_marked_unrecoverable_with_the_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpts = _fit(tmp_path, DemoDataModule(size=64, stateful=False))
    manifest = read_manifest(ckpts / "epoch=0-step=4")
    assert manifest.recoverable is False
    assert any("data_position" in m and "DataLoader has no state_dict" in m for m in manifest.missing)
    assert manifest.components["data_position"] == []
    assert latest_recoverable(ckpts) is None
    assert field_main(["ckpt", "verify", str(ckpts / "epoch=0-step=4")]) == 1
    assert "NOT RECOVERABLE" in capsys.readouterr().out


def test_weights_only_save_is_an_export_not_a_recovery_point(tmp_path: Path) -> None:
    ckpts = _fit(tmp_path, DemoDataModule(size=64), save_weights_only=True)
    manifest = read_manifest(ckpts / "epoch=0-step=4")
    assert manifest.kind == "export" and not manifest.recoverable
    assert "optimizer" not in manifest.components
    assert latest_recoverable(ckpts) is None
    weights = load_weights(ckpts / "epoch=0-step=4")
    assert set(weights) == set(DemoRegressor().state_dict())


def test_resuming_explicitly_from_an_export_is_refused_with_what_it_lacks(tmp_path: Path) -> None:
    ckpts = _fit(tmp_path, DemoDataModule(size=64), save_weights_only=True)
    trainer = pl.Trainer(
        default_root_dir=tmp_path,
        max_steps=6,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        callbacks=[ManifestCheckpoint(dirpath=ckpts)],
        limit_val_batches=0,
    )
    with pytest.raises(ResumeMismatchError, match="not recoverable"):
        trainer.fit(DemoRegressor(), datamodule=DemoDataModule(size=64), ckpt_path=ckpts / "epoch=0-step=4")


def test_last_resolves_to_nothing_rather_than_an_unrecoverable_checkpoint(tmp_path: Path) -> None:
    ckpts = _fit(tmp_path, DemoDataModule(size=64, stateful=False))
    trainer = pl.Trainer(
        default_root_dir=tmp_path,
        max_steps=6,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        callbacks=[ManifestCheckpoint(dirpath=ckpts, every_n_train_steps=2)],
        limit_val_batches=0,
    )
    trainer.fit(DemoRegressor(), datamodule=DemoDataModule(size=64, stateful=False), ckpt_path="last")
    assert trainer.ckpt_path is None  # started fresh: nothing recoverable to resume from
