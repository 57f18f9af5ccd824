"""A checkpoint that lacks a component is saved, but never advertised or used as a recovery point."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
from conftest import make_trainer
from torch.utils.data import DataLoader

from lightning_field import ResumeMismatchError, latest_recoverable, load_weights, read_manifest
from lightning_field.checkpoint.manifest_checkpoint import NoRecoverableCheckpointError
from lightning_field.cli.main import main as field_main
from lightning_field.workloads.demo import DemoDataModule, DemoRegressor


class _OwnLoader(DataLoader):
    """A DataLoader subclass with a constructor of its own: it cannot be re-created as a stateful one."""

    def __init__(self, dataset: object) -> None:
        super().__init__(dataset, batch_size=8, shuffle=True)


class _OwnLoaderData(DemoDataModule):
    def train_dataloader(self) -> DataLoader:
        return _OwnLoader(self.train_set)


def _fit(root: Path, datamodule: pl.LightningDataModule, **checkpoint_kwargs: object) -> Path:
    ckpts = root / "ckpts"
    trainer = make_trainer(root, 4, ckpts, **checkpoint_kwargs)
    trainer.fit(DemoRegressor(), datamodule=datamodule)
    return ckpts


def test_a_plain_dataloader_is_adopted_so_its_checkpoints_are_recoverable(tmp_path: Path) -> None:
    ckpts = _fit(tmp_path, DemoDataModule(size=64, stateful=False))
    manifest = read_manifest(ckpts / "epoch=0-step=4")
    assert manifest.recoverable and manifest.components["data_position"] == [0]
    assert latest_recoverable(ckpts) == ckpts / "epoch=0-step=4"


def test_a_loader_that_cannot_be_adopted_is_marked_unrecoverable_with_the_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.warns(UserWarning, match="NOT recoverable"):
        ckpts = _fit(tmp_path, _OwnLoaderData(size=64))
    manifest = read_manifest(ckpts / "epoch=0-step=4")
    assert manifest.recoverable is False
    assert any("data_position" in m and "_OwnLoader is not a plain DataLoader" in m for m in manifest.missing)
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
    trainer = make_trainer(tmp_path, 6, ckpts)
    with pytest.raises(ResumeMismatchError, match="not recoverable"):
        trainer.fit(DemoRegressor(), datamodule=DemoDataModule(size=64), ckpt_path=ckpts / "epoch=0-step=4")


def test_last_never_resolves_to_an_unrecoverable_checkpoint_nor_silently_starts_over(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match="NOT recoverable"):
        ckpts = _fit(tmp_path, _OwnLoaderData(size=64))
    assert latest_recoverable(ckpts) is None
    trainer = make_trainer(tmp_path, 6, ckpts)
    with pytest.raises(NoRecoverableCheckpointError, match="none recoverable"):
        trainer.fit(DemoRegressor(), datamodule=_OwnLoaderData(size=64), ckpt_path="last")
