"""Streamed train data beyond the conformance matrix: the data manifest of a stream (its shards,
library, workers and each worker's position), a resume over changed shards, and the input-pipeline
stall share on a stream. Each on the user's own code, beside plain Lightning where that applies.
The exact resume itself is the conformance suite's (tests/test_conformance.py, rows stream-*,
hf-*, litdata-*, webdataset).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from conftest import python_program
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from torch.utils.data import DataLoader, IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_field import ManifestCheckpoint, ResumeMismatchError, StragglerMonitor
from lightning_field.checkpoint.resolver import latest_recoverable
from lightning_field.core.manifest import read_manifest
from lightning_field.state.streams import stream_manifest

sys.path.insert(0, str(Path(__file__).parent / "jobs"))
import stream_data  # tests/jobs is not a package
from conformance_job import classification_tensors


class ShardFiles(IterableDataset):
    """A user's stream over local shard files of 32-float rows, listing them as ``shards``, with its
    position (shard, row) in its own state_dict; optionally slow to read (an input-bound pipeline)."""

    def __init__(self, shards: list[Path], seconds_per_row: float = 0.0) -> None:
        self.shards = [str(path) for path in shards]
        self.seconds_per_row = seconds_per_row
        self.shard, self.row = 0, 0

    def __iter__(self) -> Iterator[torch.Tensor]:
        while self.shard < len(self.shards):
            rows = torch.load(self.shards[self.shard], weights_only=True)
            while self.row < len(rows):
                time.sleep(self.seconds_per_row)
                self.row += 1
                yield rows[self.row - 1]
            self.shard, self.row = self.shard + 1, 0
        self.shard = 0

    def state_dict(self) -> dict[str, int]:
        return {"shard": self.shard, "row": self.row}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.shard, self.row = int(state["shard"]), int(state["row"])


def write_shards(folder: Path, count: int, rows: int = 16, seed: int = 0) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(count):
        path = folder / f"shard-{index:03d}.pt"
        torch.save(torch.randn(rows, 32, generator=torch.Generator().manual_seed(seed + index)), path)
        paths.append(path)
    return paths


def trainer(root: Path, callback: pl.Callback, max_steps: int, **kwargs: Any) -> pl.Trainer:
    return pl.Trainer(default_root_dir=root, max_steps=max_steps, callbacks=[callback], logger=False,
                      enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                      limit_val_batches=0, **kwargs)  # fmt: skip


def test_a_resume_over_rewritten_added_or_removed_shards_is_refused_shard_by_shard_where_plain_lightning_resumes(
    tmp_path: Path,
) -> None:
    shards = write_shards(tmp_path / "data", 3)
    saved = {"field": tmp_path / "field", "plain": tmp_path / "plain"}
    for kind, dirpath in saved.items():
        callback = (ManifestCheckpoint if kind == "field" else ModelCheckpoint)(dirpath=dirpath, every_n_train_steps=2)
        trainer(tmp_path / kind, callback, max_steps=4).fit(BoringModel(), DataLoader(ShardFiles(shards), batch_size=4))
    manifest = read_manifest(latest_recoverable(saved["field"]))
    stream = manifest.provenance["data"]["stream"]
    assert stream["library"] == "own" and stream["root"] == str(tmp_path / "data")
    assert sorted(stream["shards"]) == ["shard-000.pt", "shard-001.pt", "shard-002.pt"]
    assert all(entry["blake3"].startswith("blake3:") and entry["bytes"] > 0 for entry in stream["shards"].values())

    torch.save(torch.zeros(16, 32), shards[1])  # rewritten
    shards[2].unlink()  # removed
    added = tmp_path / "data" / "shard-003.pt"
    torch.save(torch.ones(16, 32), added)
    changed = [*shards[:2], added]
    # Plain Lightning resumes over the changed data without a word.
    plain = trainer(tmp_path / "plain", ModelCheckpoint(dirpath=saved["plain"]), max_steps=6)
    plain_checkpoint = str(saved["plain"] / "epoch=0-step=4.ckpt")
    plain.fit(BoringModel(), DataLoader(ShardFiles(changed), batch_size=4), ckpt_path=plain_checkpoint)
    assert plain.global_step == 6

    refused = trainer(tmp_path / "field", ManifestCheckpoint(dirpath=saved["field"]), max_steps=6)
    with pytest.raises(ResumeMismatchError) as excinfo:
        refused.fit(BoringModel(), DataLoader(ShardFiles(changed), batch_size=4), ckpt_path="last")
    message = str(excinfo.value)
    assert "data.stream.shards.shard-001.pt.blake3" in message  # rewritten
    assert "data.stream.shards.shard-002.pt" in message  # removed
    assert "data.stream.shards.shard-003.pt" in message  # added
    assert refused.global_step == 4

    allowed = ManifestCheckpoint(dirpath=saved["field"], allow_resume_mismatch=["data.stream.shards"])
    resumed = trainer(tmp_path / "field", allowed, max_steps=6)
    with pytest.warns(UserWarning, match="Resuming despite allowed difference data.stream.shards"):
        resumed.fit(BoringModel(), DataLoader(ShardFiles(changed), batch_size=4), ckpt_path="last")
    assert resumed.global_step == 6


@pytest.mark.parametrize("workers", [0, 2])
def test_the_manifest_says_where_each_worker_of_a_stream_stands_and_with_which_prefetch(
    tmp_path: Path, workers: int
) -> None:
    shards = write_shards(tmp_path / "data", 4)
    loader = StatefulDataLoader(ShardFiles(shards), batch_size=4, num_workers=workers,
                                **({"prefetch_factor": 3} if workers else {}))  # fmt: skip
    dirpath = tmp_path / "ckpt"
    callback = ManifestCheckpoint(dirpath=dirpath, every_n_train_steps=3)
    trainer(tmp_path, callback, max_steps=3).fit(BoringModel(), loader)
    manifest = read_manifest(latest_recoverable(dirpath))
    assert manifest.recoverable, manifest.missing
    stream = manifest.provenance["data"]["stream"]
    assert (stream["num_workers"], stream["prefetch_factor"]) == (workers, 3 if workers else None)
    (positions,) = manifest.stream_positions["0"]
    if workers == 0:
        # 3 batches of 4 rows trained; the batch Lightning fetched ahead is not counted.
        assert positions == {"main": {"shard": 0, "row": 12}}
    else:
        # Each worker copies the dataset and reads every shard: batches alternate between them.
        assert set(positions) == {"worker_0", "worker_1"}, positions
        assert sorted(p["row"] for p in positions.values()) == [4, 8], positions


@pytest.mark.slow
def test_the_stream_manifest_names_each_librarys_shards_and_version(tmp_path: Path) -> None:
    base = classification_tensors()
    hf = stream_manifest(stream_data.hf_stream(base, 8, 0, buffer_shuffle=False))
    assert hf is not None and hf["library"] == "datasets" and hf["version"]
    assert len(hf["shards"]) == 4 and all(len(entry["fingerprint"]) == 16 for entry in hf["shards"].values())
    web = stream_manifest(stream_data.webdataset_stream(base, tmp_path, 8, 0))
    assert web is not None and web["library"] == "webdataset" and web["root"] == str(tmp_path / "webdataset")
    assert sorted(web["shards"]) == [f"shard-{i:04d}.tar" for i in range(4)]
    lit = stream_manifest(stream_data.litdata_stream(base, tmp_path, 8, 0))
    assert lit is not None and lit["library"] == "litdata" and lit["root"] == str(tmp_path / "litdata")
    assert "index.json" in lit["shards"] and sum(name.endswith(".bin") for name in lit["shards"]) == 4
    assert all(entry["blake3"].startswith("blake3:") for entry in {**web["shards"], **lit["shards"]}.values())


@pytest.mark.slow
def test_the_input_pipeline_share_of_a_slow_stream_is_reported_and_warned_beside_a_fast_one(tmp_path: Path) -> None:
    shares: dict[str, float] = {}
    warnings: dict[str, list[str]] = {}
    data_per_step: dict[str, float] = {}
    for label, seconds in (("fast", 0.0), ("slow", 0.05)):
        monitor = StragglerMonitor(warmup_steps=1, report_interval_s=0.01)
        shards = write_shards(tmp_path / label, 2)
        run = pl.Trainer(default_root_dir=tmp_path / label, max_steps=16, callbacks=[monitor], logger=False,
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         limit_val_batches=0)  # fmt: skip
        run.fit(BoringModel(), DataLoader(ShardFiles(shards, seconds), batch_size=4))
        assert monitor.reports
        # Over every report: on a stream, the batch fetched ahead is waited for in the step before
        # its own, so a one-step report at an epoch's end (its fetch only finds the end) shows none.
        shares[label] = sum(r.ranks[0]["data_s"] for r in monitor.reports) / sum(
            r.ranks[0]["step_s"] for r in monitor.reports
        )
        warnings[label] = [w for r in monitor.reports for w in r.input_pipeline]
        data_per_step[label] = max(r.ranks[0]["data_s"] for r in monitor.reports)  # a report's median step
    # 4 rows x 50 ms per batch: the sleep bounds the slow stream's wait from below whatever the load
    # (the fullest report's median step sees it; a one-step report at an epoch's end does not); the
    # fast stream's share, which load raises, is only compared.
    assert data_per_step["slow"] >= 0.75 * 0.2, data_per_step
    assert shares["slow"] > 0.5 and shares["slow"] > shares["fast"], shares
    assert any("waits on data" in w and "num_workers=0" in w for w in warnings["slow"]), warnings


def test_a_rank_files_malformed_fetched_ahead_entry_is_refused_by_name_not_crashed_on(tmp_path: Path) -> None:
    from lightning_field.state.rank_tracking import RankStateTracker
    from lightning_field.state.rng import capture_rng_state

    for hostile in ("not a mapping", {"rng": None}, {"rng": {"torch": "bytes, not a tensor"}}):
        with pytest.raises(ResumeMismatchError, match="ck/epoch=0-step=4: its rank file's fetched_ahead entry"):
            RankStateTracker().load({"rng": capture_rng_state(), "fetched_ahead": hostile}, {}, "ck/epoch=0-step=4")


@pytest.mark.slow
def test_field_ckpt_inspect_refuses_a_manifests_malformed_data_positions_naming_the_field_instead_of_crashing(
    tmp_path: Path,
) -> None:
    import json
    import subprocess

    dirpath = tmp_path / "ckpt"
    loader = StatefulDataLoader(ShardFiles(write_shards(tmp_path / "data", 1)), batch_size=4)
    callback = ManifestCheckpoint(dirpath=dirpath, every_n_train_steps=2)
    trainer(tmp_path, callback, max_steps=2).fit(BoringModel(), loader)
    checkpoint = latest_recoverable(dirpath)
    assert checkpoint is not None
    manifest_file = Path(checkpoint) / "manifest.json"
    document = json.loads(manifest_file.read_text())
    document["stream_positions"] = ["not", "a", "mapping"]
    document["data_restore"] = {"0": "a string, not a list"}
    manifest_file.write_text(json.dumps(document))
    shown = subprocess.run([python_program(), "-m", "lightning_field.cli.main", "ckpt", "inspect", str(checkpoint)],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    # A manifest is untrusted input: one whose fields are not of the shape the commit writes is refused
    # at read (by the resume as by inspect), naming the file and the field.
    assert shown.returncode == 1, shown.stdout
    assert f"{manifest_file}: field 'stream_positions' is list, not dict" in shown.stderr
    assert "Traceback" not in shown.stderr
    document["stream_positions"] = {}
    manifest_file.write_text(json.dumps(document))
    shown = subprocess.run([python_program(), "-m", "lightning_field.cli.main", "ckpt", "inspect", str(checkpoint)],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert shown.returncode == 0 and "rank 0  loader 0: a string, not a list" in shown.stdout, shown.stderr


def test_loaded_stream_positions_are_found_and_a_hostile_nesting_is_walked_without_recursion() -> None:
    import torch

    from lightning_field.compat.hf_datasets import PositionForOneEpoch
    from lightning_field.state.streams import positions_for_the_resumed_epoch

    position = {"epoch": 0, "examples_iterable": {"shard_idx": 1}}
    state = {"_snapshot": {"_worker_snapshots": {"worker_0": {"dataset_state": dict(position)}}}}
    active = torch.tensor(1)
    assert positions_for_the_resumed_epoch(state, active) == 1
    held = state["_snapshot"]["_worker_snapshots"]["worker_0"]["dataset_state"]
    assert isinstance(held, PositionForOneEpoch) and len(held) == 2
    active.zero_()
    assert not held  # the resumed epoch over: datasets' `if self._starting_state_dict` reads it as none
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert positions_for_the_resumed_epoch(deep, active) == 0
