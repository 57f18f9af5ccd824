"""Async saves: the step blocks only for the host snapshot; nothing is visible, resumable or pruned
before the background commit; a writer error is reported at once and the policy decides."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from conftest import make_trainer
from lightning.pytorch.loggers import CSVLogger

from lightning_field import CheckpointSaveError, ManifestCheckpoint, latest_recoverable, read_events, verify_checkpoint
from lightning_field.checkpoint import committed_checkpoints
from lightning_field.checkpoint.async_save import HostSnapshot
from lightning_field.checkpoint.commit import LocalStore, RankOutcome
from lightning_field.demo import DemoDataModule, DemoRegressor


class GatedStore(LocalStore):
    """The real local commit, except that writing the save of ``step`` waits for ``gate``."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.gate = threading.Event()
        self.writing = threading.Event()

    def write(self, final: Path, token: str, rank: int, files: dict[str, Any]) -> RankOutcome:
        if final.name.endswith(f"step={self.step}"):
            self.writing.set()
            assert self.gate.wait(30), "the test never opened the gate"
        return super().write(final, token, rank, files)


class FailingStore(LocalStore):
    """The real local commit, except that the save of ``step`` fails like a full disk would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def write(self, final: Path, token: str, rank: int, files: dict[str, Any]) -> RankOutcome:
        if final.name.endswith(f"step={self.step}"):
            return RankOutcome(rank, [], "the disk is full or over quota (No space left on device)")
        return super().write(final, token, rank, files)


class WhileWriting(pl.Callback):
    """At the start of the batch after the save of ``step`` (now in the writer), look around."""

    def __init__(self, store: GatedStore, ckpts: Path) -> None:
        self.store, self.ckpts = store, ckpts
        self.seen: dict[str, Any] = {}

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step != self.store.step:
            return
        assert self.store.writing.wait(30)
        callback = trainer.checkpoint_callback
        self.seen = {
            "latest": latest_recoverable(self.ckpts),
            "names": sorted(p.name for p in self.ckpts.iterdir() if not p.name.startswith(".")),
            "last_committed": callback.last_committed,
        }
        self.store.gate.set()


def _async_trainer(root: Path, max_steps: int, store: LocalStore, **options: Any) -> pl.Trainer:
    trainer = make_trainer(root, max_steps, async_save=True, **options)
    callback = trainer.checkpoint_callback
    assert isinstance(callback, ManifestCheckpoint)
    callback._local_store = store  # the real commit protocol, with a gate or a fault at one step
    return trainer


def test_an_async_save_is_not_resolvable_advertised_or_pruning_before_its_commit(
    tmp_path: Path, quiet_lightning: None
) -> None:
    store = GatedStore(step=4)
    ckpts = tmp_path / "ckpts"
    probe = WhileWriting(store, ckpts)
    trainer = _async_trainer(tmp_path, 6, store, save_top_k=1, monitor="step", mode="max")
    trainer.callbacks.append(probe)
    trainer.fit(DemoRegressor(), datamodule=DemoDataModule(size=64))

    # Step 4 was being written while step 5 trained: only step 2 existed for anyone else, and top-1
    # retention had not removed it yet.
    assert probe.seen["latest"] == ckpts / "epoch=0-step=2"
    assert probe.seen["names"] == ["LAST", "epoch=0-step=2"]
    assert probe.seen["last_committed"] == (str(ckpts / "epoch=0-step=2"), 2)
    # After training: the last save committed, and retention kept only it.
    assert [e.path.name for e in committed_checkpoints(ckpts)] == ["epoch=0-step=6"]
    assert verify_checkpoint(ckpts / "epoch=0-step=6").recoverable
    committed = [e for e in read_events(tmp_path) if e["event"] == "ckpt_committed"]
    assert [e["step"] for e in committed] == [2, 4, 6]
    assert all(e["payload"]["async"] and e["payload"]["blocking_s"] >= 0 for e in committed)


def test_a_failed_async_save_is_reported_at_once_and_warn_keeps_training_and_the_older_checkpoints(
    tmp_path: Path, quiet_lightning: None
) -> None:
    trainer = _async_trainer(tmp_path, 8, FailingStore(step=4), save_top_k=1, monitor="step", mode="max")
    callback = trainer.checkpoint_callback
    callback.on_save_error = "warn"
    trainer.loggers = [CSVLogger(tmp_path, name="csv", version=0)]
    with pytest.warns(UserWarning, match=r"save failed: .*step=4 was not saved: rank 0: the disk is full"):
        trainer.fit(DemoRegressor(), datamodule=DemoDataModule(size=64))
    metrics = (tmp_path / "csv" / "version_0" / "metrics.csv").read_text().splitlines()
    assert metrics[0].split(",") == ["checkpoint/save_failures", "step"], metrics
    assert metrics[1] in ("1.0,4", "1.0,5", "1.0,6"), "reported by the next step end, or the next save at the latest"
    assert trainer.global_step == 8 and callback.save_failures == 1
    events = read_events(tmp_path)
    failed = [e for e in events if e["event"] == "ckpt_save_failed"]
    assert [(e["step"], e["payload"]["path"].rsplit("/", 1)[-1]) for e in failed] == [(4, "epoch=0-step=4")]
    assert [e["step"] for e in events if e["event"] == "ckpt_committed"] == [2, 6, 8]
    # Step 4 was to replace step 2 in the top 1; it failed, so step 2 is kept (outside top-k's books).
    assert [e.path.name for e in committed_checkpoints(tmp_path / "ckpts")] == ["epoch=0-step=8", "epoch=0-step=2"]


def test_a_failed_async_save_under_the_stop_policy_stops_training_with_the_cause(
    tmp_path: Path, quiet_lightning: None
) -> None:
    trainer = _async_trainer(tmp_path, 20, FailingStore(step=4))
    with pytest.raises(CheckpointSaveError, match=r"step=4 was not saved: rank 0: the disk is full.*epoch=0-step=2"):
        trainer.fit(DemoRegressor(), datamodule=DemoDataModule(size=64))
    # Stopped at the first batch end that saw the failure, at the latest when the next save began.
    assert trainer.global_step <= 6
    assert latest_recoverable(tmp_path / "ckpts") == tmp_path / "ckpts" / "epoch=0-step=2"


def test_host_snapshot_is_independent_of_the_live_state_and_reuses_its_buffers() -> None:
    snapshot = HostSnapshot()
    weight = torch.ones(1000)
    state = {"model": {"w": weight, "tied": weight}, "loops": [{"step": 3}], "name": "x"}
    first = snapshot.take(state)
    weight.add_(1)
    state["loops"][0]["step"] = 4
    assert torch.equal(first["model"]["w"], torch.ones(1000)) and first["loops"][0]["step"] == 3
    assert first["model"]["w"] is first["model"]["tied"], "a tensor saved twice stays one tensor"
    buffer = first["model"]["w"]
    second = snapshot.take(state)
    assert second["model"]["w"] is buffer and torch.equal(buffer, torch.full((1000,), 2.0))
    assert snapshot.nbytes == 4000
    assert snapshot.pin_memory == torch.cuda.is_available()


def test_async_save_refuses_an_unknown_error_policy(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"on_save_error must be one of \('stop', 'warn'\), got 'ignore'"):
        ManifestCheckpoint(dirpath=tmp_path, async_save=True, on_save_error="ignore")
