"""Overhead of the profiling set (StragglerMonitor: section timers, comm timing, throughput) vs bare Lightning.

Alternates bare and profiled runs of the same model (so drift hits both), and reports each run's
median step time and the ratio of the medians. Target: <= 1.01x on a model whose step takes >= 50 ms.

    python benchmarks/profiling_overhead.py [--accelerator gpu] [--rounds 5] [--steps 40] [--width 1024]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_field.profiling import StragglerMonitor


class Wide(pl.LightningModule):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        self.net = nn.Sequential(*layers)

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        (seed,) = batch
        # Inputs made on the device: the benchmark measures the step, not a host-side input pipeline.
        x = torch.randn(seed.shape[0], self.net[0].in_features, device=self.device, dtype=self.dtype)
        return self.net(x).square().mean()

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


class StepClock(Callback):
    """Wall time between consecutive batch ends; on GPU synchronised here only, in both variants."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._last: float | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # type: ignore[no-untyped-def]
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        now = time.perf_counter()
        if self._last is not None:
            self.times.append(now - self._last)
        self._last = now


def run(profiled: bool, args: argparse.Namespace) -> float:
    torch.manual_seed(0)
    data = TensorDataset(torch.arange(args.batch * 4))  # cycled over epochs up to max_steps
    clock = StepClock()
    callbacks: list[Callback] = [clock]
    if profiled:
        callbacks.insert(0, StragglerMonitor(report_interval_s=1.0, flops_per_batch=args.flops_per_batch))
    with tempfile.TemporaryDirectory() as root:
        trainer = pl.Trainer(
            default_root_dir=root, max_steps=args.steps, accelerator=args.accelerator, devices=1,
            precision=args.precision, logger=False, enable_progress_bar=False, enable_model_summary=False,
            enable_checkpointing=False, callbacks=callbacks,
        )  # fmt: skip
        trainer.fit(Wide(args.width, args.depth), DataLoader(data, batch_size=args.batch))
    return statistics.median(clock.times[5:])  # past warm-up


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--precision", default="32-true")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--flops-per-batch", type=float, default=None, help="given: FlopCounterMode is not used")
    args = p.parse_args()
    bare, prof = [], []
    for i in range(args.rounds):
        for profiled in (False, True) if i % 2 == 0 else (True, False):
            (prof if profiled else bare).append(run(profiled, args))
        print(f"round {i + 1}: bare {bare[-1] * 1e3:.1f} ms, profiled {prof[-1] * 1e3:.1f} ms per step", flush=True)
    ratio = statistics.median(prof) / statistics.median(bare)
    print(f"median step: bare {statistics.median(bare) * 1e3:.2f} ms, profiled {statistics.median(prof) * 1e3:.2f} ms")
    print(f"RATIO profiled/bare = {ratio:.4f} (target <= 1.01 at >= 50 ms steps)")


if __name__ == "__main__":
    main()
