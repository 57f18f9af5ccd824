"""Effective throughput in one process: samples/s, FLOPs measured once, MFU only against a known peak."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest

from lightning_field.profiling import StragglerMonitor
from lightning_field.workloads.demo import DemoDataModule, DemoRegressor


def fit(tmp_path: Path, **monitor: object) -> StragglerMonitor:
    pl.seed_everything(0)
    callback = StragglerMonitor(report_interval_s=0.01, warmup_steps=1, **monitor)
    trainer = pl.Trainer(
        default_root_dir=tmp_path, max_steps=40, accelerator="cpu", logger=False, enable_progress_bar=False,
        limit_val_batches=0, callbacks=[callback],
    )  # fmt: skip
    trainer.fit(DemoRegressor(), datamodule=DemoDataModule())
    return callback


def test_flops_are_measured_once_and_mfu_is_absent_without_a_known_peak(tmp_path: Path) -> None:
    monitor = fit(tmp_path)
    report = monitor.report
    assert report is not None and len(monitor.reports) >= 2
    (rank,) = report.throughput["per_rank"]
    assert rank["samples_per_s"] > 0 and rank["flops_per_s"] > 0 and rank["peak_memory_bytes"] > 0
    assert rank["mfu"] is None and "no peak for cpu" in report.throughput["peak_source"]
    assert (tmp_path / "field" / "profile" / "rank-00000.jsonl").read_text().count("\n") == len(monitor.reports)


@pytest.mark.slow
def test_a_user_peak_gives_an_mfu_with_its_denominator(tmp_path: Path) -> None:
    report = fit(tmp_path, peak_flops=1e12, flops_per_batch=1e9).report
    assert report is not None
    (rank,) = report.throughput["per_rank"]
    assert report.throughput["peak_flops"] == 1e12 and report.throughput["peak_source"].startswith("user override")
    assert rank["mfu"] == rank["flops_per_s"] / 1e12
