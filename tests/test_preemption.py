"""SIGTERM (and SLURM's SIGUSR1) become a checkpoint at the next step boundary and a clean exit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import assert_bitwise_equal, run_train_job

from lightning_field import read_events, verify_checkpoint


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
    out = run_train_job(root, tmp_path / "p.pt", "--signal-after-step", "11", "--signal", signame)
    assert f"Preempted ({signame}): saved recoverable checkpoint" in out
    checkpoint = root / "checkpoints" / "preempted-step=12"
    assert f"PREEMPTED-CHECKPOINT {checkpoint} at step 12" in out
    assert verify_checkpoint(checkpoint).recoverable
    assert [e["payload"]["signal"] for e in read_events(root) if e["event"] == "preempted"] == [signame]
    run_train_job(root, tmp_path / "p.pt", "--resume")
    assert_bitwise_equal(uninterrupted, torch.load(tmp_path / "p.pt"))


def test_sigterm_with_an_async_save_in_flight_commits_it_before_the_final_save_and_resumes_exactly(
    tmp_path: Path, uninterrupted: dict
) -> None:
    root = tmp_path / "preempted"
    # The save of step 10 goes to the writer; SIGTERM arrives as step 11 starts.
    out = run_train_job(root, tmp_path / "p.pt", "--async-save", "--signal-after-step", "10")
    checkpoint = root / "checkpoints" / "preempted-step=11"
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
    out = run_train_job(root, tmp_path / "p.pt", "--devices", "2", "--signal-after-step", "7", "--signal-rank", "0")
    assert "Preempted (SIGTERM)" in out
    report = verify_checkpoint(root / "checkpoints" / "preempted-step=8")
    assert report.recoverable and report.manifest is not None and report.manifest.components["rng"] == [0, 1]
    run_train_job(root, tmp_path / "p.pt", "--devices", "2", "--resume")
    assert_bitwise_equal(torch.load(tmp_path / "u.pt"), torch.load(tmp_path / "p.pt"))
