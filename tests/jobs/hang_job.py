"""A user's DDP job for the hang watchdog's tests: Lightning's BoringModel over plain DataLoaders, started
as users start it (``python hang_job.py``: Lightning's DDP launcher starts the other ranks).

``--hang-step N``: rank ``--hang-rank`` sleeps inside ``training_step`` at global step N (once per run
directory, so a restarted job goes on; every attempt with ``--hang-every-attempt``). Without ``--floor``
the job is plain Lightning with ``StragglerMonitor(policy="checkpoint_and_stop")`` as it is today.
``--healthy`` makes the run slow and uneven, with a slow first batch, a long save and a long
validation, to show the watchdog stays quiet.

Each rank that finishes writes ``result-rank<N>.json``: the step reached and what its watchdog saw.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from torch.utils.data import DataLoader

from lightning_field import ManifestCheckpoint, SnapshotConfig, StragglerMonitor
from lightning_field.core.distributed import end_process_groups, exit_finished_process


class SleepyModel(BoringModel):
    """BoringModel whose steps take known, uneven times; one rank can hang inside a step."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.marker = Path(args.root) / f"hang-started-rank{args.hang_rank}"

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        args = self.args
        hangs_here = args.hang_every_attempt or not self.marker.exists()
        if self.global_step == args.hang_step and self.global_rank == args.hang_rank and hangs_here:
            self.marker.write_text(str(time.time()))
            time.sleep(600)  # the hang: inside the step, before the gradient all-reduce
        time.sleep(step_seconds(args, self.global_step))
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        if self.args.healthy:
            time.sleep(self.args.slow_s if batch_idx == 0 else 0.1)  # the first batch waits for the loader's start
        return super().validation_step(batch, batch_idx)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 4096), batch_size=4)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 4096), batch_size=4)


def step_seconds(args: argparse.Namespace, step: int) -> float:
    if not args.healthy:
        return args.step_s
    if step == 0:
        return args.slow_s  # a slow first step (compilation, caches)
    if step == 7:
        return 0.2  # one step far above the ones before it, under the floor
    return (0.02, 0.09, 0.05, 0.12)[step % 4] if step < 16 else (0.1, 0.15, 0.12)[step % 3]  # then slower


class SlowSave(Callback):
    """A save whose state takes ``seconds`` to capture (a large callback state, a slow gather): the first
    save after step ``after``, when batches have been timed (a snapshot may save at every early step)."""

    def __init__(self, seconds: float, after: int = 8) -> None:
        self.seconds, self.after = seconds, after

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        if trainer.global_step >= self.after and self.seconds:
            time.sleep(self.seconds)
            self.seconds = 0.0  # once: the test's time is better spent elsewhere


class ValidationClock(Callback):
    """How long each validation took, start to end (to compare with the in-step timeout)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._start = 0.0

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start = time.monotonic()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.seconds.append(time.monotonic() - self._start)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--step-s", type=float, default=0.05)
    p.add_argument("--hang-rank", type=int, default=1)
    p.add_argument("--hang-step", type=int, default=-1)
    p.add_argument("--hang-every-attempt", action="store_true", help="hang again after each restart")
    p.add_argument("--no-snapshots", action="store_true", help="commits every 10 steps only: known resume points")
    p.add_argument("--floor", type=float, default=None, help="the watchdog's floor; none: no watchdog")
    p.add_argument("--factor", type=float, default=10.0)
    p.add_argument("--long-phase", type=float, default=20.0)
    p.add_argument("--grace", type=float, default=2.0)
    p.add_argument("--healthy", action="store_true")
    p.add_argument("--slow-s", type=float, default=3.5)
    args = p.parse_args()

    torch.set_num_threads(1)
    pl.seed_everything(0)
    monitor = StragglerMonitor(
        report_interval_s=0.5, policy="checkpoint_and_stop", hang_floor_s=args.floor, hang_factor=args.factor,
        hang_long_phase_s=args.long_phase, hang_grace_s=args.grace,
    )  # fmt: skip
    # code_dir outside any git repository: edits to this repository's working tree while the tests run
    # would otherwise change the code identity between the hung attempt and its restart, and refuse the resume.
    checkpoint = ManifestCheckpoint(
        dirpath=os.path.join(args.root, "checkpoints"), every_n_train_steps=10, code_dir=tempfile.gettempdir(),
        **({"snapshots": SnapshotConfig(every_n_train_steps=None)} if args.no_snapshots else {}),
    )
    clock = ValidationClock()
    callbacks: list[Callback] = [monitor, checkpoint, clock]
    if args.healthy:
        callbacks.append(SlowSave(args.slow_s))
    trainer = pl.Trainer(
        default_root_dir=args.root, max_steps=args.steps, accelerator="cpu", devices=args.devices, strategy="ddp",
        logger=False, enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
        val_check_interval=20 if args.healthy else 1000, limit_val_batches=6 if args.healthy else 0,
        num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(SleepyModel(args), ckpt_path="last")
    watchdog = monitor.hang_watchdog
    result = {
        "rank": trainer.global_rank, "step": trainer.global_step, "validation_s": clock.seconds,
        "hangs": watchdog.monitor.reports if watchdog and watchdog.monitor else None,
        "closest": watchdog.monitor.closest if watchdog and watchdog.monitor else None,
        "longest_batch_s": watchdog.history.longest[0] if watchdog else None,
        "step_timeout_s": watchdog.rule.step_timeout(watchdog.history) if watchdog else None,
    }  # fmt: skip
    with open(os.path.join(args.root, f"result-rank{trainer.global_rank}.json"), "w") as f:
        json.dump(result, f)
    end_process_groups()


if __name__ == "__main__":
    main()
    exit_finished_process(0)
