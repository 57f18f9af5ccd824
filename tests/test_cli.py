"""``field ckpt``: verify's exit status, list's table, inspect's readable manifest."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_trainer

from lightning_field.cli.main import main as field_main
from lightning_field.demo import DemoDataModule, DemoRegressor


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("run")
    trainer = make_trainer(root, 4)
    trainer.fit(DemoRegressor(), datamodule=DemoDataModule(size=64))
    return root / "ckpts"


def test_verify_exits_zero_for_an_intact_recoverable_checkpoint(
    ckpts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert field_main(["ckpt", "verify", str(ckpts / "epoch=0-step=4")]) == 0
    assert capsys.readouterr().out.startswith("OK ")


def test_verify_exits_one_for_a_directory_that_is_not_a_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert field_main(["ckpt", "verify", str(tmp_path)]) == 1
    assert "NOT A CHECKPOINT" in capsys.readouterr().out


def test_list_shows_step_status_size_age_and_marks_last(ckpts: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert field_main(["ckpt", "list", str(ckpts), "--verify"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "step", "status", "drill", "size", "age"]
    newest = lines[1].split()
    assert newest[:4] == ["epoch=0-step=4", "4", "recoverable", "-"] and "LAST" in lines[1] and "resume" in lines[1]
    assert lines[2].split()[:3] == ["epoch=0-step=2", "2", "recoverable"]


def test_inspect_prints_components_files_and_provenance(ckpts: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert field_main(["ckpt", "inspect", str(ckpts / "epoch=0-step=2")]) == 0
    out = capsys.readouterr().out
    for expected in (
        "recoverable: yes",
        "rng",
        "data_position",
        "state.pt",
        "rank-00000.pt",
        "architecture_hash",
        "not drilled",
    ):
        assert expected in out


def test_the_installed_field_command_runs(ckpts: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "lightning_field.cli.main", "ckpt", "verify", "-q", str(ckpts / "epoch=0-step=2")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
