"""A user's training script as it runs under ``sbatch`` (tests_slurm/, docs/slurm.md): Lightning's
BoringModel over a plain, shuffled ``DataLoader``, with ``ManifestCheckpoint`` (``--mode manifest``,
``fit(ckpt_path="last")``) or plain Lightning's ``ModelCheckpoint`` (``--mode plain``, ``fit()``: on
SLURM, Lightning resumes from its own ``hpc_ckpt`` by itself).

From step ``--slow-from`` on, each step sleeps ``--step-seconds``, so a signal sent after the job
writes ``reached-<restart>`` lands mid-run. Each attempt (``SLURM_RESTART_COUNT``) appends a line to
``attempts.jsonl`` (the step it started at, its pid); a run that finishes saves its weights to
``final.pt`` and prints ``FINISHED``. Exit statuses are the product's and Lightning's own.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from torch.utils.data import DataLoader

from lightning_field import ManifestCheckpoint


class ShuffledBoringModel(BoringModel):
    """BoringModel with the user's own shuffled loader (the data position matters on resume)."""

    def __init__(self, slow_from: int, step_seconds: float) -> None:
        super().__init__()
        self.slow_from = slow_from
        self.step_seconds = step_seconds

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self.global_step >= self.slow_from:
            time.sleep(self.step_seconds)
        return super().training_step(batch, batch_idx)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 96), batch_size=4, shuffle=True)


class AttemptLog(Callback):
    """Writes what the test reads: where each attempt started, and when it reached ``slow_from``."""

    def __init__(self, root: Path, slow_from: int) -> None:
        self.root = root
        self.slow_from = slow_from
        self.restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        line = {"restart": self.restart, "start_step": trainer.global_step, "pid": os.getpid()}
        with open(self.root / "attempts.jsonl", "a") as log:
            log.write(json.dumps(line) + "\n")

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, idx: int) -> None:
        marker = self.root / f"reached-{self.restart}"
        if trainer.global_step >= self.slow_from and not marker.exists():
            marker.write_text(str(trainer.global_step))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--mode", choices=["manifest", "plain"], default="manifest")
    parser.add_argument("--max-steps", type=int, default=80)
    parser.add_argument("--slow-from", type=int, default=30)
    parser.add_argument("--step-seconds", type=float, default=0.1)
    args = parser.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    pl.seed_everything(7)  # BoringModel's data and weights: the same in every attempt
    model = ShuffledBoringModel(args.slow_from, args.step_seconds)
    ckpts = str(args.root / "ckpts")
    if args.mode == "manifest":
        checkpoint: Callback = ManifestCheckpoint(dirpath=ckpts, every_n_train_steps=10, save_last=True)
    else:
        checkpoint = ModelCheckpoint(dirpath=ckpts, every_n_train_steps=10, save_last=True)
    trainer = pl.Trainer(
        default_root_dir=str(args.root),
        max_steps=args.max_steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[checkpoint, AttemptLog(args.root, args.slow_from)],
    )
    trainer.fit(model, ckpt_path="last" if args.mode == "manifest" else None)
    torch.save(model.state_dict(), args.root / "final.pt")
    print(f"FINISHED at step {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
