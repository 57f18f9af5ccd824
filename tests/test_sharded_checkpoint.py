"""Sharded state (FSDP2 under ModelParallelStrategy, 2 gloo ranks on CPU) through DCP: every shard
in the manifest with its hash, per-rank RNG and data position, bitwise-exact resume after SIGKILL
(with synchronous and with async saves, on local disk and on S3), and a corrupted shard named by
``field ckpt verify`` and skipped by the resolver."""

from __future__ import annotations

import json
import re
from pathlib import Path

import fsspec
import pytest
import torch
from conftest import assert_bitwise_equal, run_train_job

from lightning_field import latest_recoverable, load_weights, read_events, verify_checkpoint
from lightning_field.cli.main import main as field_main
from lightning_field.core.manifest import read_manifest

pytestmark = pytest.mark.slow  # every test here starts processes (tests/suite_budget.py)

SHARDED = ["--sharded", "--devices", "2", "--max-steps", "20"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One uninterrupted synchronous run to step 20, which every interrupted run must match: its
    final state is ``<dir>/u.pt`` and its checkpoints are under ``<dir>/uninterrupted``."""
    where = tmp_path_factory.mktemp("sharded-reference")
    run_train_job(where / "uninterrupted", where / "u.pt", *SHARDED)
    return where


def _assert_same_final_state(reference: Path, out: Path) -> None:
    expected, resumed = torch.load(reference / "u.pt"), torch.load(out)
    assert resumed["step"] == expected["step"] == 20
    assert_bitwise_equal(expected["state_dict"], resumed["state_dict"], "weights")
    assert_bitwise_equal(expected["optimizer"], resumed["optimizer"], "optimizer")


def test_sharded_resume_after_sigkill_is_bitwise_identical_and_every_shard_is_in_the_manifest(
    tmp_path: Path, reference: Path, capsys: pytest.CaptureFixture[str]
) -> None:
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
    # Its weights assemble whole in this one process (bitwise: tests/test_ckpt_export.py).
    assert load_weights(latest).keys() == torch.load(reference / "u.pt", weights_only=True)["state_dict"].keys()

    log = run_train_job(root, tmp_path / "r.pt", *SHARDED, "--resume")
    assert "step=10" in log
    _assert_same_final_state(reference, tmp_path / "r.pt")

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


def test_a_sigkill_among_the_first_steps_resumes_from_the_default_snapshot_of_every_shard_bitwise(
    tmp_path: Path, reference: Path
) -> None:
    """The default ("auto") snapshots are taken every step while their cost is measured: under FSDP2 a
    kill there, before any persistent checkpoint, resumes from the step it interrupted, each rank's DCP
    shards read back from the snapshot folder."""
    root, out = tmp_path / "interrupted", tmp_path / "r.pt"
    run_train_job(root, out, *SHARDED, "--kill-after-step", "4", expect_rc=-9)
    assert latest_recoverable(root / "checkpoints") is None, "a persistent checkpoint (every 5) would hold it"
    log = run_train_job(root, out, *SHARDED, "--resume")
    assert re.search(r"resuming from the snapshot \S+epoch=0-step=4 \(step 4\)", log), log[-3000:]
    _assert_same_final_state(reference, out)


def test_async_sharded_save_blocks_only_for_the_snapshot_and_a_sigkill_mid_write_resumes_bitwise_identically(
    tmp_path: Path, reference: Path
) -> None:
    root, out = tmp_path / "interrupted", tmp_path / "r.pt"
    # The writer of step 10 is held before DCP writes a byte; both ranks are killed at the next batch.
    # Without step snapshots, which would offer a newer resume point than the persistent step 5.
    run_train_job(
        root, out, *SHARDED, "--async-save", "--no-snapshots", "--hold-writer-step", "10", "--kill-after-step", "10",
        expect_rc=-9,
    )
    seen = json.loads((tmp_path / "r.pt.seen.json").read_text())
    assert seen == {"latest": "epoch=0-step=5", "names": ["LAST", "epoch=0-step=5"], "last_committed": 5}, (
        "training went on past the save of step 10, which nobody could see before its commit"
    )
    checkpoints = root / "checkpoints"
    assert latest_recoverable(checkpoints) == checkpoints / "epoch=0-step=5"
    assert not (checkpoints / "epoch=1-step=10").exists()

    log = run_train_job(root, out, *SHARDED, "--async-save", "--no-snapshots", "--resume")
    assert "step=5" in log
    _assert_same_final_state(reference, out)

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
        synchronous = read_manifest(reference / "uninterrupted" / "checkpoints" / checkpoint.name).files
        shards = [name for name in manifest.files if name.endswith(".distcp")]
        assert [manifest.files[n].hash for n in shards] == [synchronous[n].hash for n in shards]


def test_sharded_checkpoints_on_s3_resume_bitwise_identically_after_a_sigkill_and_a_corrupt_shard_is_skipped(
    tmp_path: Path, reference: Path, s3_bucket: tuple[str, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    bucket, options = s3_bucket
    url = f"{bucket}/run/checkpoints"
    s3 = [*SHARDED, "--ckpt-url", url, "--endpoint-url", options["endpoint_url"]]
    root, out = tmp_path / "run", tmp_path / "r.pt"
    run_train_job(root, out, *s3, "--kill-after-step", "13", expect_rc=-9)
    step10 = f"{url}/epoch=1-step=10"
    assert latest_recoverable(url, options) == step10
    manifest = read_manifest(step10, options)
    fs = fsspec.filesystem("s3", **options)
    uploaded = {p.rsplit("/", 1)[-1] for p in fs.ls(step10, refresh=True)} - {"manifest.json"}
    assert set(manifest.files) == uploaded, "each rank uploaded exactly what it wrote, all of it in the manifest"
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "meta.pt", "rank-00000.pt", "rank-00001.pt"} == uploaded
    # The same shard bytes as the local disk's checkpoint of the same step.
    local = read_manifest(reference / "uninterrupted" / "checkpoints" / "epoch=1-step=10").files
    assert {n: e.hash for n, e in manifest.files.items() if n.endswith(".distcp")} == {
        n: e.hash for n, e in local.items() if n.endswith(".distcp")
    }

    log = run_train_job(root, out, *s3, "--resume")
    assert f"RESUME-FROM {step10}" in log
    _assert_same_final_state(reference, out)

    newest = f"{url}/epoch=3-step=20"
    shard = f"{newest}/__0_0.distcp"
    data = bytearray(fs.cat_file(shard))
    data[len(data) // 2] ^= 0xFF
    fs.pipe_file(shard, bytes(data))
    capsys.readouterr()
    assert field_main(["ckpt", "verify", "-q", newest, "--storage-option", f"endpoint_url={options['endpoint_url']}"])
    assert "__0_0.distcp: content hash" in capsys.readouterr().out
    assert latest_recoverable(url, options) == f"{url}/epoch=2-step=15"
