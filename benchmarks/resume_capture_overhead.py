"""What exact resume costs per training step: ManifestCheckpoint against the bare Trainer.

Issue 14's target: whatever is captured per step (RNG kept across validation, samples counted,
the epoch-metric merge after a resume) costs at most 1 % of a 50 ms step. Saves are not per-step
work and are switched off here (an interval longer than the run); their cost is the save
benchmarks' figure.

The workload is ordinary user code: a plain ``DataLoader`` (which ManifestCheckpoint re-creates as
a StatefulDataLoader), ``self.log(..., on_epoch=True)`` and a torchmetrics ``Accuracy``; the step
itself sleeps to a fixed 50 ms so the figure is the overhead, not CPU noise. Step time is the
median interval between consecutive ``on_train_batch_end`` calls (start-up excluded), for the bare
Trainer, Lightning's ModelCheckpoint and ManifestCheckpoint, in interleaved rounds.

    python benchmarks/resume_capture_overhead.py [--steps 120] [--rounds 5] [--step-ms 50]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from typing import Any

import lightning.pytorch as pl
import torch
import torchmetrics
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_field import ManifestCheckpoint


class SleepyClassifier(pl.LightningModule):
    def __init__(self, step_s: float) -> None:
        super().__init__()
        self.step_s = step_s
        self.body = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
        self.accuracy = torchmetrics.Accuracy(task="multiclass", num_classes=3)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        start = time.perf_counter()
        x, y = batch
        logits = self.body(x)
        loss = nn.functional.cross_entropy(logits, y)
        self.accuracy(logits, y)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        self.log("train_acc", self.accuracy, on_epoch=True)
        time.sleep(max(0.0, self.step_s - (time.perf_counter() - start)))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


class StepClock(Callback):
    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_train_batch_end(self, *args: Any) -> None:
        self.ends.append(time.perf_counter())


def step_time(kind: str, steps: int, step_s: float, root: str) -> float:
    pl.seed_everything(0, verbose=False)
    gen = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(512, 6, generator=gen), torch.randint(0, 3, (512,), generator=gen))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    clock = StepClock()
    callbacks: list[Callback] = [clock]
    never = 10**9
    if kind == "ModelCheckpoint":
        callbacks.append(ModelCheckpoint(dirpath=f"{root}/{kind}", every_n_train_steps=never))
    elif kind == "ManifestCheckpoint":
        callbacks.append(ManifestCheckpoint(dirpath=f"{root}/{kind}", every_n_train_steps=never))
    trainer = pl.Trainer(
        default_root_dir=f"{root}/{kind}", max_steps=steps, accelerator="cpu", logger=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
        enable_checkpointing=kind != "bare", callbacks=callbacks,
    )
    trainer.fit(SleepyClassifier(step_s), train_dataloaders=loader)
    intervals = [b - a for a, b in zip(clock.ends[10:], clock.ends[11:], strict=False)]
    return statistics.median(intervals)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--step-ms", type=float, default=50.0)
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    import tempfile

    kinds = ("bare", "ModelCheckpoint", "ManifestCheckpoint")
    times: dict[str, list[float]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as root:
        for r in range(args.rounds):
            for kind in kinds:
                times[kind].append(step_time(kind, args.steps, args.step_ms / 1000, f"{root}/{r}"))
    bare = statistics.median(times["bare"])
    print(f"median step time over {args.rounds} interleaved rounds of {args.steps} steps ({args.step_ms:g} ms steps):")
    for kind in kinds:
        median = statistics.median(times[kind])
        print(f"  {kind:20s} {median * 1000:8.3f} ms   ÷ bare {median / bare:.4f}   (+{(median - bare) * 1000:.3f} ms)")


if __name__ == "__main__":
    main()
