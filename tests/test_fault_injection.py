"""Faults during and after saving: SIGKILL mid-save, corrupted files, a full disk."""

from __future__ import annotations

import multiprocessing
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import pytest
from conftest import child_env, make_trainer

from lightning_field import CheckpointSaveError, NoRecoverableCheckpointError, latest_recoverable, verify_checkpoint
from lightning_field.checkpoint import committed_checkpoints
from lightning_field.checkpoint.verify import CheckpointCorruptError
from lightning_field.cli.main import main as field_main
from lightning_field.workloads.demo import DemoDataModule, DemoRegressor

KILL_TRIALS = 20


def _train_saving_every_step(root: Path, async_save: bool) -> None:
    """The forked child: saves a ~25 MB state at every step until it is killed."""
    import torch

    torch.set_num_threads(1)
    trainer = make_trainer(
        root, 100_000, root / "checkpoints", every_n_train_steps=1, save_top_k=1, save_last=True, async_save=async_save
    )
    trainer.fit(DemoRegressor(hidden=120_000), datamodule=DemoDataModule(size=64))


def _kill_during_saves(root: Path, rng: random.Random, async_save: bool) -> bool:
    """SIGKILL a training child at a random moment once it has begun saving; return whether it died
    with a save in flight (a hidden temp directory left behind).

    The child is forked from this already-initialised interpreter so each trial costs a save, not
    an import of torch and Lightning.
    """
    ckpts = root / "checkpoints"
    child = multiprocessing.get_context("fork").Process(
        target=_train_saving_every_step, args=(root, async_save), daemon=True
    )
    child.start()
    try:
        deadline = time.monotonic() + 60
        while not (ckpts.is_dir() and any(p.name.startswith(".tmp-") for p in ckpts.iterdir())):
            assert child.is_alive() and time.monotonic() < deadline, "the job never started saving"
            time.sleep(0.002)
        time.sleep(rng.uniform(0.0, 0.5))
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join()
    assert child.exitcode == -signal.SIGKILL
    return any(p.name.startswith(".tmp-") for p in ckpts.iterdir())


# With async saves the writer thread is almost always mid-commit (each save starts as the previous
# one ends), so every kill lands while it runs; half the trials suffice.
@pytest.mark.slow
@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_sigkill_at_random_moments_during_saving_never_leaves_an_advertised_bad_checkpoint(
    tmp_path: Path, async_save: bool
) -> None:
    rng = random.Random(20261130)
    killed_mid_save = 0
    trials = KILL_TRIALS // 2 if async_save else KILL_TRIALS
    for trial in range(trials):
        root = tmp_path / f"trial{trial}"
        killed_mid_save += _kill_during_saves(root, rng, async_save)
        for entry in committed_checkpoints(root / "checkpoints"):
            report = verify_checkpoint(entry.path)
            assert report.intact, f"trial {trial}: committed {entry.path} is corrupt: {report.problems}"
        latest = latest_recoverable(root / "checkpoints")
        if latest is not None:
            assert verify_checkpoint(latest).recoverable
        shutil.rmtree(root)
    # The kills must really land inside saves, or this test proves nothing.
    assert killed_mid_save >= trials // 4, f"only {killed_mid_save}/{trials} kills landed mid-save"


@pytest.fixture
def two_checkpoints(tmp_path: Path) -> Path:
    trainer = make_trainer(tmp_path, 4)
    trainer.fit(DemoRegressor(), datamodule=DemoDataModule(size=64))
    return tmp_path / "ckpts"


def _newest(ckpts: Path) -> Path:
    return ckpts / "epoch=0-step=4"


@pytest.mark.parametrize("damage", ["flipped_byte", "truncated", "deleted"])
def test_damaged_file_is_named_by_verify_and_skipped_by_the_resolver(
    two_checkpoints: Path, damage: str, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    victim = _newest(two_checkpoints) / "state.pt"
    if damage == "flipped_byte":
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0x01
        victim.write_bytes(bytes(data))
    elif damage == "truncated":
        os.truncate(victim, victim.stat().st_size - 10)
    else:
        victim.unlink()
    assert field_main(["ckpt", "verify", str(_newest(two_checkpoints))]) == 1
    out = capsys.readouterr().out
    assert "CORRUPT" in out and str(victim) in out
    assert latest_recoverable(two_checkpoints) == two_checkpoints / "epoch=0-step=2"
    assert any("failed verification" in r.message and str(victim) in r.message for r in caplog.records)
    assert any("trying the older epoch=0-step=2" in r.message for r in caplog.records)


def test_with_save_top_k_1_a_damaged_checkpoint_is_refused_by_name_with_ways_out_that_fit_a_damaged_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    make_trainer(tmp_path, 4, save_top_k=1).fit(DemoRegressor(), datamodule=DemoDataModule(size=64))
    victim = _newest(tmp_path / "ckpts") / "rank-00000.pt"
    os.truncate(victim, 5)
    rerun = make_trainer(tmp_path, 6, save_top_k=1)
    with pytest.raises(NoRecoverableCheckpointError) as refused:
        rerun.fit(DemoRegressor(), datamodule=DemoDataModule(size=64), ckpt_path="last")
    message = str(refused.value)
    assert str(victim) in message and "save_top_k=2" in message
    # resume_inexact cannot load bytes that are not what was saved: it is no way out here.
    assert "resume_inexact" not in message
    skips = [r.message for r in caplog.records if "Skipping checkpoint" in r.message]
    assert skips and all("no older recoverable checkpoint is left" in m and "trying" not in m for m in skips)


def test_resuming_explicitly_from_a_corrupt_checkpoint_fails_before_unpickling_and_names_the_file(
    two_checkpoints: Path, tmp_path: Path
) -> None:
    victim = _newest(two_checkpoints) / "rank-00000.pt"
    os.truncate(victim, 5)
    trainer = make_trainer(tmp_path, 6, two_checkpoints)
    with pytest.raises(CheckpointCorruptError, match=r"rank-00000\.pt"):
        trainer.fit(DemoRegressor(), datamodule=DemoDataModule(size=64), ckpt_path=_newest(two_checkpoints))


def _full_disk_child(target: Path) -> None:
    """In a child, where tmpfs can't be mounted: after a first save, cap the file size so the next fails."""
    _fit_saving_every_two_steps(target, max_steps=2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the cap then fails with EFBIG
    _fit_saving_every_two_steps(target, max_steps=4, ckpt_path="last")


def _fit_saving_every_two_steps(target: Path, max_steps: int = 4, ckpt_path: str | None = None) -> None:
    trainer = make_trainer(target, max_steps)
    # hidden=4000 makes each checkpoint ~0.8 MB: a 1.2 MB disk holds the first and not the second.
    trainer.fit(DemoRegressor(hidden=4000), datamodule=DemoDataModule(size=64), ckpt_path=ckpt_path)


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    return (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True
        ).returncode
        == 0
    )


def test_full_disk_during_a_save_raises_a_clear_error_and_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    if _mount_tmpfs(disk, "1200k"):
        try:
            with pytest.raises(CheckpointSaveError, match="disk is full") as info:
                _fit_saving_every_two_steps(disk)
            message = str(info.value)
            ckpts = disk / "ckpts"
            assert "previous checkpoint" in message and "epoch=0-step=2" in message
            assert [e.path.name for e in committed_checkpoints(ckpts)] == ["epoch=0-step=2"]
            assert verify_checkpoint(ckpts / "epoch=0-step=2").recoverable
            assert not [p for p in ckpts.iterdir() if p.name.startswith(".tmp-")]
        finally:
            subprocess.run(["umount", str(disk)], check=False)
    else:  # no privilege to mount: the same failure path through a file-size limit in a child
        code = (
            f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r});"
            " from test_fault_injection import _full_disk_child;"
            f" from pathlib import Path; _full_disk_child(Path({str(disk)!r}))"
        )
        result = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True)
        assert result.returncode != 0 and "CheckpointSaveError" in result.stderr
        assert "file size limit" in result.stderr and "epoch=0-step=2) is intact" in result.stderr
        assert [e.path.name for e in committed_checkpoints(disk / "ckpts")] == ["epoch=0-step=2"]
        assert verify_checkpoint(disk / "ckpts" / "epoch=0-step=2").recoverable


class _Killed(Exception):
    """Raised where the evidence drill's store would SIGKILL the job."""


def test_the_drills_kill_inside_a_save_lands_after_the_rank_files_are_written_and_before_the_commit(
    tmp_path: Path,
) -> None:
    from lightning.pytorch.demos.boring_classes import BoringModel

    from lightning_field.evidence.faults import KillDuringSave

    kills: list[tuple[int, str]] = []

    def record_and_stop(record: Path, step: int, mode: str) -> None:
        kills.append((step, mode))
        raise _Killed

    trainer: pl.Trainer | None = None
    store = KillDuringSave(lambda: trainer, 4, tmp_path / "kill.json", kill=record_and_stop)
    trainer = make_trainer(tmp_path, 8, store=store)
    with pytest.raises(_Killed):
        trainer.fit(BoringModel())
    assert kills == [(4, "save")]
    ckpts = tmp_path / "ckpts"
    assert [entry.path.name for entry in committed_checkpoints(ckpts)] == ["epoch=0-step=2"]
    (hidden,) = [p for p in ckpts.iterdir() if p.name.startswith(".tmp-")]
    assert any(hidden.iterdir()), "the kill landed before the rank's files were written"
    assert not (hidden / "manifest.json").exists(), "the kill landed after the commit"
