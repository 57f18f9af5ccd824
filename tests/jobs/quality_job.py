"""A training job for the time-to-quality and goodput tests: demo model, validation, checkpoints,
TimeToQuality, optionally SIGKILLed right after a chosen step (before that step's save)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from lightning_field import CheckpointCadence, ManifestCheckpoint, StragglerMonitor, TimeToQuality
from lightning_field.core.distributed import end_process_groups, exit_finished_process
from lightning_field.workloads.demo import DemoDataModule, DemoRegressor


class KillAfterStep(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class SlowSteps(Callback):
    """Makes each step take a measurable time, so wall-clock buckets are well above timer noise."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        time.sleep(self.seconds)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--max-steps", type=int, default=60)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--val-every", type=int, default=10)
    p.add_argument("--target", type=float, default=1.0)
    p.add_argument("--monitor", default="val_loss")
    p.add_argument("--price", type=float, default=2.5)
    p.add_argument("--kill-after-step", type=int, default=None)
    p.add_argument("--step-seconds", type=float, default=0.02)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--cadence-mtbf-hours", type=float, default=None)
    p.add_argument("--profile-flops-per-batch", type=float, default=None, help="add a StragglerMonitor")
    args = p.parse_args()

    pl.seed_everything(0)
    callbacks: list[Callback] = [
        TimeToQuality(monitor=args.monitor, target=args.target, mode="min", price_per_device_hour=args.price),
        SlowSteps(args.step_seconds),
        ManifestCheckpoint(dirpath=os.path.join(args.root, "checkpoints"), every_n_train_steps=args.every,
                           save_top_k=-1),
    ]  # fmt: skip
    if args.kill_after_step is not None:
        callbacks.append(KillAfterStep(args.kill_after_step))
    cadence = None
    if args.cadence_mtbf_hours is not None:
        # may_lengthen: the formula's interval exceeds --every, and the ranks must agree on real changes.
        cadence = CheckpointCadence(mtbf_hours=args.cadence_mtbf_hours, hysteresis=0.0, may_lengthen=True)
        callbacks.append(cadence)
    if args.profile_flops_per_batch is not None:
        callbacks.append(
            StragglerMonitor(report_interval_s=0.05, warmup_steps=1, flops_per_batch=args.profile_flops_per_batch)
        )
    trainer = pl.Trainer(
        default_root_dir=args.root, max_steps=args.max_steps, accelerator="cpu", logger=False,
        devices=args.devices, strategy="ddp" if args.devices > 1 else "auto",
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        val_check_interval=args.val_every, check_val_every_n_epoch=None, limit_val_batches=2, callbacks=callbacks,
    )  # fmt: skip
    trainer.fit(DemoRegressor(), datamodule=DemoDataModule(size=512), ckpt_path="last")
    if cadence is not None:
        intervals = [d.steps for d in cadence.decisions]
        # One file per rank: ranks share the launcher's stdout, where their lines can interleave mid-line.
        with open(os.path.join(args.root, f"cadence-rank{trainer.global_rank}.json"), "w") as f:
            json.dump({"decisions": intervals, "every": callbacks[2].every_n_train_steps}, f)
    end_process_groups()  # after every rank's collectives: gloo torn down at exit can abort


if __name__ == "__main__":
    main()
    exit_finished_process(0)
