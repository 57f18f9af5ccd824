"""TimeToQuality on a real run killed with SIGKILL once after its first checkpoint, then resumed."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import lightning.pytorch as pl
import pytest
from conftest import TESTS_DIR, run_child

from lightning_field import ManifestCheckpoint, TimeToQuality, goodput_ledger, read_events
from lightning_field.workloads.demo import DemoDataModule, DemoRegressor

QUALITY_JOB = TESTS_DIR / "jobs" / "quality_job.py"


@pytest.mark.slow
def test_a_killed_and_resumed_run_counts_both_attempts_and_accounts_for_every_second(tmp_path: Path) -> None:
    args = [QUALITY_JOB, "--root", tmp_path, "--max-steps", "120", "--target", "0.3", "--price", "2.5"]
    killed = run_child([*args, "--kill-after-step", "35"])
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-3000:]
    resumed = run_child(args)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "Time to quality (val_loss <= 0.3)" in resumed.stdout and "Goodput" in resumed.stdout

    summary = json.loads((tmp_path / "field" / "time_to_quality.json").read_text())
    goodput = summary["goodput"]
    assert goodput["interruptions"] == 1
    # Checkpoints every 10 steps and step snapshots at an interval "auto" chooses from their measured
    # cost: the kill after step 35 loses the steps past the newest resume point, at most 31..35.
    events = read_events(tmp_path)
    resumed_from = next(e["step"] for e in events if e["event"] == "ckpt_load" and e["attempt"] == 2)
    assert 30 <= resumed_from <= 35
    assert abs(goodput["lost_steps"] - (35 - resumed_from)) <= 1
    assert sum(goodput["buckets_s"].values()) == pytest.approx(goodput["elapsed_s"], rel=0.01)
    assert goodput["buckets_s"]["lost_progress"] > 0 and goodput["buckets_s"]["restart_overhead"] > 0
    reached = summary["reached"]
    assert reached is not None and reached["attempt"] == 2
    first_attempt_end = max(e["wall_time"] for e in events if e["attempt"] == 1)
    run_start = next(e["wall_time"] for e in events if e["event"] == "run_start")
    assert reached["wall_s"] > first_attempt_end - run_start  # the clock kept running through the kill
    assert reached["cost"] == pytest.approx(reached["device_hours"] * 2.5)
    # the log alone reproduces the figures (a pure function of it)
    assert goodput_ledger(events).interruptions == 1


def test_a_target_on_a_metric_validation_never_logs_stops_the_run_with_the_logged_names(tmp_path: Path) -> None:
    trainer = pl.Trainer(
        default_root_dir=tmp_path, max_steps=4, accelerator="cpu", logger=False, enable_progress_bar=False,
        val_check_interval=2, check_val_every_n_epoch=None, limit_val_batches=1, num_sanity_val_steps=0,
        callbacks=[TimeToQuality(monitor="val_acc", target=0.9, mode="max"),
                   ManifestCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=2)],
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"monitor='val_acc'.*never logged.*val_loss"):
        trainer.fit(DemoRegressor(), datamodule=DemoDataModule())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"price_per_device_hour": -1.0}, "price_per_device_hour must be >= 0"),
        ({"mode": "lowest"}, "mode must be 'min' or 'max'"),
        ({"deadline_hours": 0}, "deadline_hours must be > 0"),
        ({"target": float("nan")}, "target must be a finite number"),
    ],
)
def test_bad_time_to_quality_settings_are_refused_with_the_setting_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TimeToQuality(**{"monitor": "val_loss", "target": 1.0, **kwargs})
