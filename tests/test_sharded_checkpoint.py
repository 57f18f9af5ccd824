"""Sharded state (FSDP2 under ModelParallelStrategy, 2 gloo ranks on CPU) through DCP: every shard
in the manifest with its hash, per-rank RNG and data position, bitwise-exact resume after SIGKILL
(with synchronous and with async saves), and a corrupted shard named by ``field ckpt verify``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import assert_bitwise_equal, run_train_job

from lightning_field import latest_recoverable, load_weights, read_events, verify_checkpoint
from lightning_field.cli.main import main as field_main
from lightning_field.core.manifest import read_manifest

SHARDED = ["--sharded", "--devices", "2", "--max-steps", "20"]


def test_sharded_resume_after_sigkill_is_bitwise_identical_and_every_shard_is_in_the_manifest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_train_job(tmp_path / "uninterrupted", tmp_path / "u.pt", *SHARDED)
    root = tmp_path / "interrupted"
    run_train_job(root, tmp_path / "r.pt", *SHARDED, "--kill-after-step", "13", expect_rc=-9)
    checkpoints = root / "checkpoints"
    latest = latest_recoverable(checkpoints)
    assert latest is not None and latest.name == "epoch=1-step=10"

    manifest = read_manifest(latest)
    on_disk = {p.name for p in latest.iterdir()} - {"manifest.json"}
    assert set(manifest.files) == on_disk, "every file DCP wrote is in the manifest, and nothing else"
    shards = {name: entry for name, entry in manifest.files.items() if name.endswith(".distcp")}
    assert sorted(entry.rank for entry in shards.values()) == [0, 1]
    assert all(len(entry.hash) == 64 for entry in manifest.files.values())
    assert manifest.components["model"] == manifest.components["optimizer"] == [0, 1]
    assert manifest.components["rng"] == manifest.components["data_position"] == [0, 1]
    assert {"rank-00000.pt", "rank-00001.pt", ".metadata", "meta.pt"} <= set(manifest.files)
    assert manifest.recoverable, manifest.missing
    with pytest.raises(ValueError, match=r"is a sharded \(DCP\) checkpoint"):
        load_weights(latest)

    log = run_train_job(root, tmp_path / "r.pt", *SHARDED, "--resume")
    assert "step=10" in log
    expected, resumed = torch.load(tmp_path / "u.pt"), torch.load(tmp_path / "r.pt")
    assert resumed["step"] == expected["step"] == 20
    assert_bitwise_equal(expected["state_dict"], resumed["state_dict"], "weights")
    assert_bitwise_equal(expected["optimizer"], resumed["optimizer"], "optimizer")

    # A flipped byte in one rank's shard: named by `field ckpt verify`, skipped by the resolver.
    newest = latest_recoverable(checkpoints)
    assert newest is not None and newest.name == "epoch=3-step=20"
    shard = newest / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert field_main(["ckpt", "verify", str(newest)]) != 0
    assert "__1_0.distcp: content hash" in capsys.readouterr().out
    assert not verify_checkpoint(newest).intact
    assert latest_recoverable(checkpoints) == checkpoints / "epoch=2-step=15"


def test_async_sharded_save_blocks_only_for_the_snapshot_and_a_sigkill_mid_write_resumes_bitwise_identically(
    tmp_path: Path,
) -> None:
    run_train_job(tmp_path / "uninterrupted", tmp_path / "u.pt", *SHARDED)  # synchronous reference
    root, out = tmp_path / "interrupted", tmp_path / "r.pt"
    # The writer of step 10 is held before DCP writes a byte; both ranks are killed at the next batch.
    run_train_job(
        root, out, *SHARDED, "--async-save", "--hold-writer-step", "10", "--kill-after-step", "10", expect_rc=-9
    )
    seen = json.loads((tmp_path / "r.pt.seen.json").read_text())
    assert seen == {"latest": "epoch=0-step=5", "names": ["LAST", "epoch=0-step=5"], "last_committed": 5}, (
        "training went on past the save of step 10, which nobody could see before its commit"
    )
    checkpoints = root / "checkpoints"
    assert latest_recoverable(checkpoints) == checkpoints / "epoch=0-step=5"
    assert not (checkpoints / "epoch=1-step=10").exists()

    log = run_train_job(root, out, *SHARDED, "--async-save", "--resume")
    assert "step=5" in log
    expected, resumed = torch.load(tmp_path / "u.pt"), torch.load(out)
    assert resumed["step"] == expected["step"] == 20
    assert_bitwise_equal(expected["state_dict"], resumed["state_dict"], "weights")
    assert_bitwise_equal(expected["optimizer"], resumed["optimizer"], "optimizer")

    committed = [e for e in read_events(root) if e["event"] == "ckpt_committed" and e["attempt"] == 2]
    assert [e["step"] for e in committed] == [10, 15, 20] and all(e["payload"]["async"] for e in committed)
    for step in (10, 15, 20):
        checkpoint = next(checkpoints.glob(f"epoch=*-step={step}"))
        manifest = read_manifest(checkpoint)
        assert set(manifest.files) == {p.name for p in checkpoint.iterdir()} - {"manifest.json"}
        assert sorted(e.rank for n, e in manifest.files.items() if n.endswith(".distcp")) == [0, 1]
        assert verify_checkpoint(checkpoint).recoverable
        # Training moved on while the writer ran, yet every shard holds exactly the snapshot: the
        # same bytes as the synchronous run's save of that step.
        reference = read_manifest(tmp_path / "uninterrupted" / "checkpoints" / checkpoint.name).files
        shards = [name for name in manifest.files if name.endswith(".distcp")]
        assert [manifest.files[n].hash for n in shards] == [reference[n].hash for n in shards]
