"""``field ckpt``: verify's exit status, list's table, inspect's readable manifest; and every ``field``
command's ``--help``."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import make_trainer, python_program, run_child

from lightning_field.cli.main import build_parser
from lightning_field.cli.main import main as field_main
from lightning_field.workloads.demo import DemoDataModule, DemoRegressor


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
    out = capsys.readouterr().out
    assert out.startswith("NOT A CHECKPOINT") and "without manifest.json" in out


def test_verify_tells_a_missing_path_a_checkpoints_folder_and_a_file_from_a_checkpoint_without_manifest(
    ckpts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert field_main(["ckpt", "verify", str(tmp_path / "nope")]) == 1
    out = capsys.readouterr().out
    assert out.startswith("DOES NOT EXIST") and "manifest" not in out
    assert field_main(["ckpt", "verify", str(ckpts)]) == 1
    out = capsys.readouterr().out
    assert "is a folder of 2 checkpoint(s)" in out and f"field ckpt list {ckpts}" in out and "epoch=0-step=4" in out
    assert field_main(["ckpt", "verify", str(ckpts / "epoch=0-step=4" / "manifest.json")]) == 1
    assert f"field ckpt verify {ckpts / 'epoch=0-step=4'}" in capsys.readouterr().out
    assert field_main(["ckpt", "verify", str(ckpts / "epoch=0-step=4" / "state.pt")]) == 1
    assert "is a file" in capsys.readouterr().out


def test_list_shows_step_status_size_age_and_marks_the_resume_pick(
    ckpts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert field_main(["ckpt", "list", str(ckpts), "--verify"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "tier", "step", "status", "drill", "size", "age"]
    newest = lines[1].split()
    assert newest[:5] == ["epoch=0-step=4", "persistent", "4", "recoverable", "-"] and lines[1].endswith("<- resume")
    assert lines[2].split()[:4] == ["epoch=0-step=2", "persistent", "2", "recoverable"] and "<-" not in lines[2]
    assert "resumes from epoch=0-step=4 (persistent, step 4)" in lines[-1]


def _corrupt(checkpoint: Path) -> None:
    state = checkpoint / "state.pt"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))


@pytest.mark.parametrize("verify", [[], ["--verify"]])
def test_list_marks_the_checkpoint_a_restart_resumes_not_the_newest_commit(
    ckpts: Path, tmp_path: Path, verify: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ckpts"
    shutil.copytree(ckpts, root)
    _corrupt(root / "epoch=0-step=4")  # still the newest commit, and what LAST names
    assert (root / "LAST").read_text().strip() == "epoch=0-step=4"
    assert field_main(["ckpt", "list", str(root), *verify]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("epoch=0-step=4") and "<-" not in lines[1]
    assert lines[2].startswith("epoch=0-step=2") and lines[2].endswith("<- resume")


def test_list_says_plainly_when_nothing_is_recoverable(
    ckpts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ckpts"
    shutil.copytree(ckpts, root)
    for checkpoint in ("epoch=0-step=4", "epoch=0-step=2"):
        _corrupt(root / checkpoint)
    assert field_main(["ckpt", "list", str(root)]) == 0
    out = capsys.readouterr().out
    assert "<-" not in out and "NOTHING RECOVERABLE" in out and "starts from step 0" in out
    (root.parent / "empty").mkdir()
    assert field_main(["ckpt", "list", str(root.parent / "empty")]) == 0
    assert "NOTHING RECOVERABLE: no committed checkpoints" in capsys.readouterr().out


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


@pytest.mark.slow
def test_the_installed_field_command_runs(ckpts: Path) -> None:
    result = subprocess.run(
        [python_program(), "-m", "lightning_field.cli.main", "ckpt", "verify", "-q", str(ckpts / "epoch=0-step=2")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name)
                yield from _commands(sub, (*prefix, name))


ARGPARSE_COMMANDS = [c for c in _commands(build_parser()) if c[0] != "preflight"]


@pytest.mark.parametrize("command", ARGPARSE_COMMANDS, ids=" ".join)
def test_every_field_subcommand_answers_help(command: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        field_main([*command, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: field {' '.join(command)}")


@pytest.mark.slow
def test_field_and_its_subcommands_answer_help_without_importing_torch_or_lightning() -> None:
    # A fresh interpreter (not the warm python, which has torch loaded): `field --help` and the
    # commands' usage stay instant because torch and Lightning load only when a command does work.
    program = (
        "import contextlib, io, sys\n"
        "from lightning_field.cli.main import main\n"
        f"for command in {[list(c) for c in ARGPARSE_COMMANDS]!r} + [[]]:\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "        main([*command, '--help'])\n"
        "print(sorted(m for m in ('torch', 'lightning', 'lightning.pytorch') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]", result.stdout


@pytest.mark.slow
def test_field_preflight_hands_help_and_leading_options_to_hydra(tmp_path: Path) -> None:
    assert {c[0] for c in _commands(build_parser())} >= {"preflight", "scale"}  # every command is covered
    shown = run_child(["-m", "lightning_field.cli.main", "preflight", "--help"], cwd=tmp_path)
    assert shown.returncode == 0, shown.stdout[-3000:]
    assert shown.stdout.startswith("usage: field preflight") and "Config groups (group=option):" in shown.stdout
    assert "field preflight: data checks" in shown.stdout and "hydra_app is powered by Hydra" not in shown.stdout
    # A leading Hydra option is Hydra's, not an unrecognized argument of `field`.
    composed = run_child(
        ["-m", "lightning_field.cli.main", "preflight", "--cfg", "job", "experiment=demo"], cwd=tmp_path
    )
    assert composed.returncode == 0, composed.stdout[-3000:]
    assert "preflight:" in composed.stdout and "unrecognized arguments" not in composed.stdout
