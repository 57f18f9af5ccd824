"""SIGTERM (and SLURM's SIGUSR1) become a checkpoint at the next step boundary, and the attempt
then ends as unfinished: TrainingPreempted, exit status 75."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch
from conftest import TRAIN_JOB, assert_bitwise_equal, run_child, run_train_job

from lightning_field import PREEMPTED_EXIT_CODE, latest_recoverable, read_events, verify_checkpoint

pytestmark = pytest.mark.slow  # every test here starts processes (tests/suite_budget.py)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The final state of the default single-device job run without interruption (run once here)."""
    root = tmp_path_factory.mktemp("uninterrupted")
    run_train_job(root, root / "u.pt")
    return torch.load(root / "u.pt")


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGUSR1"])
def test_signal_saves_at_the_next_step_exits_cleanly_and_the_resume_is_exact(
    tmp_path: Path, signame: str, uninterrupted: dict
) -> None:
    root = tmp_path / "preempted"
    # Signalled while step 12 runs: saved as step 12, which no regular save (every 5) covers.
    out = run_train_job(
        root, tmp_path / "p.pt", "--signal-after-step", "11", "--signal", signame, expect_rc=PREEMPTED_EXIT_CODE
    )
    assert f"Preempted ({signame}): saved recoverable checkpoint" in out
    checkpoint = root / "checkpoints" / "preempted-step=12.ckpt"  # what ModelCheckpoint would name it
    assert f"PREEMPTED-CHECKPOINT {checkpoint} at step 12" in out
    assert verify_checkpoint(checkpoint).recoverable
    events = read_events(root)
    assert [e["payload"]["signal"] for e in events if e["event"] == "preempted"] == [signame]
    assert [e["payload"]["status"] for e in events if e["event"] == "attempt_end"] == ["preempted"]
    run_train_job(root, tmp_path / "p.pt", "--resume")
    assert_bitwise_equal(uninterrupted, torch.load(tmp_path / "p.pt"))


def test_sigterm_with_an_async_save_in_flight_commits_it_before_the_final_save_and_resumes_exactly(
    tmp_path: Path, uninterrupted: dict
) -> None:
    root = tmp_path / "preempted"
    # The save of step 10 goes to the writer; SIGTERM arrives as step 11 starts.
    out = run_train_job(
        root, tmp_path / "p.pt", "--async-save", "--signal-after-step", "10", expect_rc=PREEMPTED_EXIT_CODE
    )
    checkpoint = root / "checkpoints" / "preempted-step=11.ckpt"
    assert f"PREEMPTED-CHECKPOINT {checkpoint} at step 11" in out
    events = [(e["event"], e["step"]) for e in read_events(root) if e["event"].startswith(("ckpt_", "preempted"))]
    # The in-flight save committed before the final one began, and the final one before "preempted".
    assert events[-5:] == [
        ("ckpt_save_start", 10),
        ("ckpt_committed", 10),
        ("ckpt_save_start", 11),
        ("ckpt_committed", 11),
        ("preempted", 11),
    ], events
    assert verify_checkpoint(root / "checkpoints" / "epoch=0-step=10").recoverable
    assert verify_checkpoint(checkpoint).recoverable
    run_train_job(root, tmp_path / "p.pt", "--async-save", "--resume")
    assert_bitwise_equal(uninterrupted, torch.load(tmp_path / "p.pt"))


def test_sigterm_to_rank_zero_alone_stops_every_ddp_rank_after_a_joint_save(tmp_path: Path) -> None:
    run_train_job(tmp_path / "uninterrupted", tmp_path / "u.pt", "--devices", "2")
    root = tmp_path / "preempted"
    out = run_train_job(
        root,
        tmp_path / "p.pt",
        "--devices",
        "2",
        "--signal-after-step",
        "7",
        "--signal-rank",
        "0",
        expect_rc=PREEMPTED_EXIT_CODE,
    )
    assert "Preempted (SIGTERM)" in out
    report = verify_checkpoint(root / "checkpoints" / "preempted-step=8")
    assert report.recoverable and report.manifest is not None and report.manifest.components["rng"] == [0, 1]
    run_train_job(root, tmp_path / "p.pt", "--devices", "2", "--resume")
    assert_bitwise_equal(torch.load(tmp_path / "u.pt"), torch.load(tmp_path / "p.pt"))


def test_a_preempted_user_script_exits_75_and_runs_nothing_after_fit_where_plain_lightning_exits_0(
    tmp_path: Path,
) -> None:
    script = TRAIN_JOB.parent / "user_preempted_job.py"
    plain = run_child([script, tmp_path / "plain", "plain"], timeout=90)
    # Plain Lightning's SIGTERMException also skips the code after fit, but exits 0: a launcher or
    # batch script reads the half-trained attempt as finished and never reruns it.
    assert plain.returncode == 0 and "AFTER-FIT" not in plain.stdout, plain.stdout[-3000:]
    field = run_child([script, tmp_path / "field", "manifest"], timeout=90)
    assert field.returncode == PREEMPTED_EXIT_CODE, field.stdout[-3000:]
    assert "AFTER-FIT" not in field.stdout and "TrainingPreempted (exit status 75" in field.stdout
    saved = latest_recoverable(tmp_path / "field" / "ckpts")
    assert saved is not None and saved.name == "preempted-step=4" and verify_checkpoint(saved).recoverable
    # The same command again resumes from it (the signal was for step 4, now behind it) and finishes.
    again = run_child([script, tmp_path / "field", "manifest"], timeout=90)
    assert again.returncode == 0 and "AFTER-FIT at step 8" in again.stdout, again.stdout[-3000:]


def test_slurm_requeue_signal_saves_requeues_the_job_exits_75_and_the_requeued_command_resumes_exactly(
    tmp_path: Path, uninterrupted: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SLURM itself is not on this machine: its `scontrol` is a script recording how it was called.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "scontrol.calls"}\n')
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    # What `sbatch --signal=USR1@90` gives one task (Lightning's SLURMEnvironment, auto-requeue on).
    for name, value in {
        "SLURM_NTASKS": "1",
        "SLURM_JOB_NAME": "train",
        "SLURM_JOB_ID": "4242",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_NODELIST": "localhost",
    }.items():
        monkeypatch.setenv(name, value)
    root = tmp_path / "run"
    out = run_train_job(
        root, tmp_path / "p.pt", "--signal-after-step", "11", "--signal", "SIGUSR1", expect_rc=PREEMPTED_EXIT_CODE
    )
    assert "Preempted (SIGUSR1)" in out
    assert (tmp_path / "scontrol.calls").read_text().split("\n")[0] == "requeue 4242"
    assert not list(root.glob("hpc_ckpt_*.ckpt")), "Lightning's own unverified SLURM save must not run as well"
    # The requeued job runs the same command; the resume is exact.
    run_train_job(root, tmp_path / "p.pt", "--resume")
    assert_bitwise_equal(uninterrupted, torch.load(tmp_path / "p.pt"))
    assert (tmp_path / "scontrol.calls").read_text().count("requeue") == 1
