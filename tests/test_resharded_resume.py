"""Resuming a sharded (DCP) checkpoint with a different world size: refused by default, and when
allowed, resharded by DCP with weights and optimizer state equal to the saved ones, the epoch's data
position carried over from rank 0 and the change recorded in the next manifest."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import assert_bitwise_equal, run_train_job
from torch.utils.data import DataLoader, DistributedSampler

from lightning_field.core.manifest import read_manifest
from lightning_field.state.reshard import order_warnings, remap_rank_state

# 96 samples, batch 8: an epoch is 6 steps on 2 ranks and 12 on 1; step 10 is 4 batches into epoch 1.
SAVED_ON_TWO = ["--sharded", "--devices", "2", "--max-steps", "10"]
RESUMED_ON_ONE = ["--sharded", "--devices", "1", "--max-steps", "15", "--resume"]


def _samples(trace: Path, first: int, last: int) -> list[float]:
    """The sample identities each rank's trace saw in steps ``first..last``."""
    paths = sorted(trace.parent.glob(trace.name + ".rank*"))
    rows = [json.loads(line) for path in paths for line in path.read_text().splitlines()]
    return [v for row in rows if first <= row["step"] <= last for v in row["order"]]


@pytest.mark.slow
def test_resume_from_two_ranks_on_one_is_refused_by_default_and_when_allowed_reshards_exactly(
    tmp_path: Path,
) -> None:
    root = tmp_path / "run"
    run_train_job(root, tmp_path / "saved.pt", *SAVED_ON_TWO)  # its final state is the step-10 checkpoint's

    refused = run_train_job(root, tmp_path / "refused.pt", *RESUMED_ON_ONE, expect_rc=None)
    assert "world_size: 2 (checkpoint) != 1 (this run)" in refused
    assert "ResumeConfig(allow_mismatch=['world_size'])" in refused
    assert not (root / "checkpoints" / "epoch=2-step=15").exists()

    loaded = tmp_path / "loaded.pt"
    run_train_job(
        root, tmp_path / "resumed.pt", *RESUMED_ON_ONE, "--allow-mismatch", "world_size", "--dump-loaded", str(loaded)
    )
    saved, after_load = torch.load(tmp_path / "saved.pt"), torch.load(loaded)
    assert after_load["step"] == saved["step"] == 10
    assert_bitwise_equal(saved["state_dict"], after_load["state_dict"], "weights")
    assert_bitwise_equal(saved["optimizer"], after_load["optimizer"], "optimizer")

    # Epoch 1 is steps 7-12 on two ranks: steps 7-10 there plus the rest of the epoch on one rank
    # (steps 11-14) see every sample exactly once; step 15 opens epoch 2.
    before = _samples(tmp_path / "saved.pt.trace", 7, 10)
    after = _samples(tmp_path / "resumed.pt.trace", 11, 14)
    every_sample = _samples(tmp_path / "saved.pt.trace", 1, 6)
    assert len(before) + len(after) == len(every_sample) == 96
    assert sorted(before + after) == sorted(every_sample)

    manifest = read_manifest(root / "checkpoints" / "epoch=2-step=15")
    assert manifest.world_size == 1 and manifest.recoverable
    assert manifest.provenance["resharded_from"] == {
        "checkpoint": str(root / "checkpoints" / "epoch=1-step=10"),
        "step": 10,
        "world_size": 2,
        "to_world_size": 1,
    }


@pytest.mark.slow
def test_resume_from_one_rank_on_two_reshards_exactly_and_the_new_rank_starts_fresh_rng_with_a_warning(
    tmp_path: Path,
) -> None:
    root = tmp_path / "run"
    run_train_job(root, tmp_path / "saved.pt", "--sharded", "--devices", "1", "--max-steps", "10")
    loaded = tmp_path / "loaded.pt"
    log = run_train_job(
        root,
        tmp_path / "resumed.pt",
        *["--sharded", "--devices", "2", "--max-steps", "15", "--resume"],
        *["--allow-mismatch", "world_size", "--dump-loaded", str(loaded)],
    )
    assert "rank 1: the checkpoint was written by 1 ranks and has no RNG state for rank 1" in log
    saved, after_load = torch.load(tmp_path / "saved.pt"), torch.load(loaded)
    assert_bitwise_equal(saved["state_dict"], after_load["state_dict"], "weights")
    assert_bitwise_equal(saved["optimizer"], after_load["optimizer"], "optimizer")

    # Epoch 0 is 12 steps on one rank: 10 there, then one step of two ranks (6 batches each) ends it.
    before = _samples(tmp_path / "saved.pt.trace", 1, 10)
    after = _samples(tmp_path / "resumed.pt.trace", 11, 11)
    assert len(before) == 80 and len(after) == 16
    assert len(set(before + after)) == 96
    manifest = read_manifest(root / "checkpoints" / "epoch=1-step=15")
    assert manifest.world_size == 2 and manifest.provenance["resharded_from"]["world_size"] == 1


@pytest.mark.slow
def test_an_unsharded_ddp_checkpoint_resumes_on_one_rank_with_the_saved_state_and_the_rest_of_its_epoch(
    tmp_path: Path,
) -> None:
    root = tmp_path / "run"
    run_train_job(root, tmp_path / "saved.pt", "--devices", "2", "--max-steps", "10")
    refused = run_train_job(root, tmp_path / "refused.pt", "--devices", "1", "--max-steps", "15", "--resume",
                            expect_rc=None)  # fmt: skip
    assert "world_size: 2 (checkpoint) != 1 (this run)" in refused
    # Lightning's default strategy for one device adds no DistributedSampler: the rest of the epoch
    # would come from a RandomSampler's own order, and the allowed resume says so (in a copy of the
    # run, whose final save would otherwise become the next resume's starting point).
    shutil.copytree(root, tmp_path / "default-strategy")
    warned = run_train_job(tmp_path / "default-strategy", tmp_path / "warned.pt", "--devices", "1", "--max-steps",
                           "11", "--resume", "--allow-mismatch", "world_size")  # fmt: skip
    assert "draws from RandomSampler, not the DistributedSampler order of the 2-rank run it resumes" in warned

    loaded = tmp_path / "loaded.pt"
    run_train_job(root, tmp_path / "resumed.pt", "--devices", "1", "--strategy", "ddp", "--max-steps", "15",
                  "--resume", "--allow-mismatch", "world_size", "--dump-loaded", str(loaded))  # fmt: skip
    saved, after_load = torch.load(tmp_path / "saved.pt"), torch.load(loaded)
    assert after_load["step"] == saved["step"] == 10
    assert_bitwise_equal(saved["state_dict"], after_load["state_dict"], "weights")
    assert_bitwise_equal(saved["optimizer"], after_load["optimizer"], "optimizer")
    # The same epoch arithmetic as the sharded case: DDP's sampler splits the epoch the same way.
    before, after = _samples(tmp_path / "saved.pt.trace", 7, 10), _samples(tmp_path / "resumed.pt.trace", 11, 14)
    every_sample = _samples(tmp_path / "saved.pt.trace", 1, 6)
    assert len(before) + len(after) == len(every_sample) == 96
    assert sorted(before + after) == sorted(every_sample)
    manifest = read_manifest(root / "checkpoints" / "epoch=2-step=15")
    assert manifest.world_size == 1 and manifest.provenance["resharded_from"]["world_size"] == 2


def test_a_resharded_resume_warns_when_the_new_loader_does_not_draw_a_distributed_samplers_order() -> None:
    data = list(range(16))
    shuffled = DataLoader(data, batch_size=4, shuffle=True)
    distributed = DataLoader(data, batch_size=4, sampler=DistributedSampler(data, num_replicas=1, rank=0))
    in_order = DataLoader(data, batch_size=4)
    assert order_warnings([distributed, in_order], old=2, new=1) == []
    (warning,) = order_warnings([in_order, shuffled], old=2, new=1)
    assert warning.startswith("train loader 1 draws from RandomSampler, not the DistributedSampler order of the 2-rank")
    assert "strategy='ddp' with devices=1" in warning


def _saved_rank(rank: int, samples_yielded: int, batches: int) -> dict:
    loader = {"_sampler_iter_state": {"samples_yielded": samples_yielded}, "_num_yielded": batches}
    loader["_sampler_iter_yielded"] = batches
    position = {"loader_states": [loader], "samples_seen": 40, "tokens_seen": None}
    return {"rank": rank, "rng": {"torch": f"rank{rank}"}, "data_position": position}


def test_ranks_beyond_the_old_world_start_fresh_rng_and_an_uneven_position_rounds_down_with_warnings() -> None:
    zero = _saved_rank(0, samples_yielded=24, batches=3)  # 1 rank, 3 batches of 8 into the epoch

    same, warnings = remap_rank_state(zero, zero, old=1, new=2, rank=0)
    assert same["rng"] == {"torch": "rank0"}
    assert same["data_position"]["loader_states"][0]["_sampler_iter_state"]["samples_yielded"] == 8
    assert same["data_position"]["resharded_batches"] == 1
    assert same["data_position"]["samples_seen"] == 20
    assert warnings == [
        "rank 0: the epoch position on 1 ranks is not a whole number of batches on 2; it rounds down,"
        " so a few samples of this epoch are seen twice"
    ]

    fresh, warnings = remap_rank_state(None, zero, old=1, new=2, rank=1)
    assert fresh["rng"] is None
    assert fresh["data_position"]["loader_states"] == same["data_position"]["loader_states"]
    assert any("has no RNG state for rank 1; it starts fresh RNG streams" in w for w in warnings)

    even, warnings = remap_rank_state(None, _saved_rank(0, 32, 4), old=1, new=2, rank=1)
    assert even["data_position"]["loader_states"][0]["_num_yielded"] == 2
    assert not any("rounds down" in w for w in warnings)


@pytest.mark.slow
def test_a_tensor_parallel_run_resumes_on_one_device_at_its_data_parallel_position_not_its_world_sizes(
    tmp_path: Path,
) -> None:
    """ModelParallelStrategy at 2 ranks of tensor parallelism splits the data over 1 rank: both read every
    batch. Moved to one device, the position stays where it was (it was doubled, past the epoch's end)."""
    root = tmp_path / "run"
    run_train_job(root, tmp_path / "saved.pt", "--sharded", "--devices", "2", "--tensor-parallel", "2",
                  "--max-steps", "10")  # fmt: skip
    run_train_job(root, tmp_path / "resumed.pt", *RESUMED_ON_ONE, "--allow-mismatch", "world_size")
    # Epoch 0 is 12 steps of all 96 samples on each tensor-parallel rank: 10 before, 2 after the resume.
    before = [v for row in _rows(tmp_path / "saved.pt.trace.rank0") if row["step"] <= 10 for v in row["order"]]
    after = [v for row in _rows(tmp_path / "resumed.pt.trace.rank0") if 11 <= row["step"] <= 12 for v in row["order"]]
    assert len(before) == 80 and len(after) == 16
    assert len(set(before + after)) == 96  # the rest of the epoch, each sample once
    manifest = read_manifest(root / "checkpoints" / "epoch=1-step=15")
    assert manifest.world_size == 1 and manifest.provenance["resharded_from"]["world_size"] == 2


def _rows(trace: Path) -> list[dict]:
    return [json.loads(line) for line in trace.read_text().splitlines()]
