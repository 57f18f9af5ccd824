"""Checkpoints under an ``s3://`` URL, against a real S3 API (moto's server on loopback).

The manifest object, written last in one PUT, is the commit; prefixes without it are never resumed
from and are deleted by the next run; corrupted objects are named by verification and skipped.
"""

from __future__ import annotations

from pathlib import Path

import boto3
import fsspec
import pytest
import torch
from conftest import assert_bitwise_equal, make_trainer, run_train_job

from lightning_field import CheckpointCorruptError, latest_recoverable, verify_checkpoint
from lightning_field.checkpoint import committed_checkpoints
from lightning_field.checkpoint.stores import ObjectStore
from lightning_field.cli.main import main as field_main
from lightning_field.core.manifest import SHARED_STATE_FILE, read_manifest
from lightning_field.workloads.demo import DemoDataModule, DemoRegressor


@pytest.mark.slow
def test_run_killed_before_its_s3_manifest_resumes_bitwise_exact_from_the_previous_commit(
    tmp_path: Path, s3_bucket: tuple[str, dict[str, str]]
) -> None:
    bucket, options = s3_bucket
    url = f"{bucket}/run/checkpoints"
    s3 = ["--ckpt-url", url, "--endpoint-url", options["endpoint_url"], "--max-steps", "20"]
    run_train_job(tmp_path / "uninterrupted", tmp_path / "u.pt", "--max-steps", "20")
    # Killed after step 15's objects were uploaded, before its manifest: step 10 is the last commit.
    run_train_job(tmp_path / "run", tmp_path / "r.pt", *s3, "--kill-before-commit-step", "15", expect_rc=-9)
    fs = fsspec.filesystem("s3", **options)
    prefixes = {p.rsplit("/", 1)[-1] for p in fs.ls(url.removeprefix("s3://"), refresh=True)}
    assert "epoch=1-step=15" in prefixes, prefixes
    assert fs.ls(f"{url}/epoch=1-step=15", refresh=True), "the killed save should have left its objects"
    assert not fs.exists(f"{url}/epoch=1-step=15/manifest.json")
    assert latest_recoverable(url, options) == f"{url}/epoch=0-step=10"

    log = run_train_job(tmp_path / "run", tmp_path / "r.pt", *s3, "--resume")
    assert f"RESUME-FROM {url}/epoch=0-step=10" in log
    expected, resumed = torch.load(tmp_path / "u.pt"), torch.load(tmp_path / "r.pt")
    assert resumed["step"] == expected["step"] == 20
    assert_bitwise_equal(expected["state_dict"], resumed["state_dict"], "weights")
    assert_bitwise_equal(expected["optimizer"], resumed["optimizer"], "optimizer")
    # The resumed run deleted the uncommitted prefix at setup and then committed step 15 afresh.
    step15 = read_manifest(f"{url}/epoch=1-step=15", options)
    assert step15.step == 15 and verify_checkpoint(f"{url}/epoch=1-step=15", storage_options=options).intact
    assert not any(p.startswith(".") for p in prefixes), "no LAST pointer or hidden objects on a store"


def _train_to_s3(root: Path, url: str, options: dict[str, str], max_steps: int) -> None:
    trainer = make_trainer(root, max_steps, dirpath=url, storage_options=options)  # type: ignore[arg-type]
    trainer.fit(DemoRegressor(), datamodule=DemoDataModule(size=48))


@pytest.mark.slow
def test_corrupted_s3_object_is_named_by_verify_skipped_by_the_resolver_and_refused_on_load(
    tmp_path: Path, s3_bucket: tuple[str, dict[str, str]], quiet_lightning: None, capsys: pytest.CaptureFixture[str]
) -> None:
    bucket, options = s3_bucket
    url = f"{bucket}/ckpts"
    _train_to_s3(tmp_path, url, options, max_steps=4)
    newest, older = (e.path for e in committed_checkpoints(url, options))
    assert (newest, older) == (f"{url}/epoch=0-step=4", f"{url}/epoch=0-step=2")
    fs = fsspec.filesystem("s3", **options)
    state = f"{newest}/{SHARED_STATE_FILE}"
    data = bytearray(fs.cat_file(state))
    data[len(data) // 2] ^= 0xFF  # same size: only the hash can tell
    fs.pipe_file(state, bytes(data))

    report = verify_checkpoint(newest, storage_options=options)
    assert not report.intact
    assert len(report.problems) == 1 and state in report.problems[0] and "content hash" in report.problems[0]
    assert latest_recoverable(url, options) == older

    # The command line reaches the same store through --storage-option.
    endpoint = f"endpoint_url={options['endpoint_url']}"
    capsys.readouterr()
    assert field_main(["ckpt", "verify", "-q", newest, "--storage-option", endpoint]) == 1
    assert f"CORRUPT  {newest} (step 4)" in capsys.readouterr().out
    assert field_main(["ckpt", "list", url, "--verify", "--storage-option", endpoint]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "corrupt" in rows["epoch=0-step=4"] and rows["epoch=0-step=2"].endswith("<- resume")
    trainer = make_trainer(tmp_path / "again", 6, dirpath=url, storage_options=options)  # type: ignore[arg-type]
    with pytest.raises(CheckpointCorruptError, match=r"state\.pt: content hash"):
        trainer.fit(DemoRegressor(), datamodule=DemoDataModule(size=48), ckpt_path=newest)


@pytest.mark.slow
def test_large_files_go_up_as_parallel_multipart_uploads_and_verify(s3_bucket: tuple[str, dict[str, str]]) -> None:
    bucket, options = s3_bucket
    part = 5 << 20
    store = ObjectStore(options, part_bytes=part, max_concurrency=4)
    final = f"{bucket}/big/ckpt"
    weights = torch.arange(3 * part // 4 - 4096, dtype=torch.float32)  # just under 15 MiB: three parts
    outcome = store.write(final, "tok", 0, {"state.pt": ({"w": weights}, ["state_dict"])})
    assert outcome.error is None
    head = boto3.client("s3", endpoint_url=options["endpoint_url"]).head_object(
        Bucket=bucket.removeprefix("s3://"), Key="big/ckpt/state.pt"
    )
    # S3 gives a multipart object the ETag "<md5 of part md5s>-<part count>".
    assert head["ETag"].strip('"').endswith("-3"), head["ETag"]
    assert head["ContentLength"] == outcome.receipts[0].size
    assert not committed_checkpoints(f"{bucket}/big", options), "uploaded but unpublished: not committed"
    assert [p.rsplit("/", 1)[-1] for p in store.clean_leftovers(f"{bucket}/big")] == ["ckpt"]


def test_object_store_refuses_a_part_size_below_the_s3_minimum() -> None:
    refusal = r"part_bytes must be an integer >= 5 MiB \(the S3 minimum part size\), got 1048576"
    with pytest.raises(ValueError, match=refusal):
        ObjectStore(part_bytes=1 << 20)
