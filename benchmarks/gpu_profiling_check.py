"""GPU paths of the profiling set, on one CUDA device: CUDA-event section timers resolved late,
NCCL all-reduce timing through ProfiledDDPStrategy, CUDA peak memory, and MFU against the table.

    python benchmarks/gpu_profiling_check.py
"""

from __future__ import annotations

import sys
import tempfile

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, "benchmarks")
from profiling_overhead import Wide

from lightning_field.profiling import ProfiledDDPStrategy, StragglerMonitor


def main() -> int:
    torch.manual_seed(0)
    monitor = StragglerMonitor(report_interval_s=0.5, warmup_steps=3)
    data = TensorDataset(torch.randn(4096 * 8, 4096))  # cycled over epochs up to max_steps
    with tempfile.TemporaryDirectory() as root:
        trainer = pl.Trainer(
            default_root_dir=root, max_steps=60, accelerator="gpu", devices=1, strategy=ProfiledDDPStrategy(),
            precision="bf16-mixed", logger=False, enable_progress_bar=False, enable_checkpointing=False,
            callbacks=[monitor],
        )  # fmt: skip
        trainer.fit(Wide(4096, 8), DataLoader(data, batch_size=4096))
    report = monitor.report
    assert report is not None, "no report"
    rank = report.ranks[0]
    tp = report.throughput
    print(f"reports {len(monitor.reports)}; last at step {report.step}, interval {report.interval_steps} steps")
    print({k: round(v, 6) for k, v in rank.items() if isinstance(v, float)})
    print(f"throughput: {tp['per_rank'][0]}; peak {tp['peak_flops']} ({tp['peak_source']})")
    print(f"collectives: {report.collectives}")
    checks = {
        "cuda_event_sections": rank["forward_s"] > 0 and rank["backward_s"] > 0 and rank["optimizer_s"] > 0,
        "nccl_bucket_timing": bool(report.collectives and all(b["seconds"] > 0 for b in report.collectives["buckets"])),
        "cuda_peak_memory": tp["per_rank"][0]["peak_memory_bytes"] > 0,
        "mfu_from_table": tp["per_rank"][0]["mfu"] is not None and "H" in tp["peak_source"],
    }
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'} {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
