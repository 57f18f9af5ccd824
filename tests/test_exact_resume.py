"""Exact resume: a run killed with SIGKILL after a save and resumed with ckpt_path="last" ends
bitwise identical to the uninterrupted run; plain ModelCheckpoint does not (so the check can fail).

The workload has dropout, a shuffled StatefulDataLoader and Python + NumPy randomness in the
dataset's transform; each case is killed in the middle of an epoch.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import assert_bitwise_equal, max_weight_difference, run_train_job

from lightning_field import latest_recoverable, verify_checkpoint

pytestmark = pytest.mark.slow  # every test here starts processes (tests/suite_budget.py)


def _interrupt_and_resume(tmp_path: Path, *args: str, kill_after: int) -> tuple[dict, dict, str]:
    run_train_job(tmp_path / "uninterrupted", tmp_path / "uninterrupted.pt", *args)
    interrupted = tmp_path / "interrupted"
    run_train_job(interrupted, tmp_path / "interrupted.pt", *args, "--kill-after-step", str(kill_after), expect_rc=-9)
    log = run_train_job(interrupted, tmp_path / "interrupted.pt", *args, "--resume")
    return torch.load(tmp_path / "uninterrupted.pt"), torch.load(tmp_path / "interrupted.pt"), log


# Main-process loading (workers=0) is covered elsewhere: on one device by test_evidence_protocol's
# SIGKILL test (bitwise, per step), under DDP by the epoch-boundary test below and the two-rank
# evidence test. The suite's time goes to the combinations nothing else runs.
@pytest.mark.parametrize(("devices", "workers"), [(1, 2), (2, 2)], ids=["single-workers2", "ddp2-workers2"])
def test_resume_after_sigkill_mid_epoch_is_bitwise_identical(tmp_path: Path, devices: int, workers: int) -> None:
    # 96 samples / batch 8 / world size: the kill at step 13 falls mid-epoch and resumes from step 10.
    args = ["--devices", str(devices), "--workers", str(workers), "--every", "5"]
    expected, resumed, log = _interrupt_and_resume(tmp_path, *args, kill_after=13)
    assert "Restoring states from the checkpoint path at" in log and "step=10" in log
    assert resumed["step"] == expected["step"] == 40
    assert_bitwise_equal(expected["state_dict"], resumed["state_dict"], "weights")
    assert_bitwise_equal(expected["optimizer"], resumed["optimizer"], "optimizer")


def test_resume_at_an_epoch_boundary_under_ddp_is_bitwise_identical(tmp_path: Path) -> None:
    # 6 batches per epoch per rank: the checkpoint at step 12 is the end of epoch 1, where Lightning
    # double-counts the restored epoch unless corrected, and DistributedSampler reshuffles by epoch.
    args = ["--devices", "2", "--every", "6", "--val-every", "3"]
    expected, resumed, _ = _interrupt_and_resume(tmp_path, *args, kill_after=12)
    assert_bitwise_equal(expected["state_dict"], resumed["state_dict"], "weights")
    assert_bitwise_equal(expected["optimizer"], resumed["optimizer"], "optimizer")


def test_plain_model_checkpoint_resume_diverges_so_the_comparison_can_fail(tmp_path: Path) -> None:
    expected, resumed, _ = _interrupt_and_resume(tmp_path, "--checkpoint", "plain", kill_after=13)
    assert max_weight_difference(expected["state_dict"], resumed["state_dict"]) > 1e-3


def test_every_committed_checkpoint_of_a_ddp_run_verifies_holds_both_ranks_and_a_bad_rank_file_fails_every_rank(
    tmp_path: Path,
) -> None:
    run_train_job(tmp_path / "run", tmp_path / "run.pt", "--devices", "2", "--max-steps", "10")
    checkpoints = tmp_path / "run" / "checkpoints"
    latest = latest_recoverable(checkpoints)
    assert latest is not None and latest.name == "epoch=1-step=10"
    report = verify_checkpoint(latest)
    assert report.recoverable, report.problems
    manifest = report.manifest
    assert manifest is not None and manifest.world_size == 2
    assert manifest.components["rng"] == [0, 1] and manifest.components["data_position"] == [0, 1]
    assert {"state.pt", "rank-00000.pt", "rank-00001.pt"} == set(manifest.files)

    # One rank's file damaged: only rank 1 reads it, yet every rank refuses the resume and names it,
    # instead of rank 0 failing later in DDP's setup with "connection closed by peer".
    own = latest / "rank-00001.pt"
    data = bytearray(own.read_bytes())
    data[len(data) // 2] ^= 0xFF
    own.write_bytes(bytes(data))
    log = run_train_job(tmp_path / "run", tmp_path / "resumed.pt", "--devices", "2", "--max-steps", "15",
                        "--ckpt-path", str(latest), expect_rc=1)  # fmt: skip
    rank_zero = "\n".join(line for line in log.splitlines() if line.startswith("[rank0]:"))
    assert "could not be loaded on every rank" in rank_zero
    assert "rank 1: CheckpointCorruptError" in rank_zero and "rank-00001.pt: content hash" in rank_zero
    assert "Connection closed by peer" not in log
