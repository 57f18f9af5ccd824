"""The main job on embedded defaults: train, get killed, resume, and prove the resume exact.

    python examples/resume_demo.py [--workdir runs/resume_demo] [--devices 2] [--workers 2]

It runs the demo workload (dropout, shuffled StatefulDataLoader, random augmentations) three times
as real child processes: once uninterrupted; once killed with SIGKILL right after a checkpoint; and
once resumed from that run's directory with ``ckpt_path="last"``. It then compares the final weights
and optimizer state bit for bit, and lists the checkpoints. Exit status 0 means an exact resume.
Nothing is downloaded; no account or server is needed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from lightning_field import ManifestCheckpoint
from lightning_field.workloads.demo import DemoDataModule, DemoRegressor


class _KillAfterStep(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: object, idx: int) -> None:
        if trainer.global_step == self.step:
            print(f"[demo] SIGKILL to rank {trainer.global_rank} after step {self.step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


def train(args: argparse.Namespace) -> None:
    """One training process (the child). This is all a user adds to an existing Trainer."""
    pl.seed_everything(7, workers=False)
    callbacks: list[Callback] = [
        ManifestCheckpoint(dirpath=Path(args.run) / "checkpoints", every_n_train_steps=5, save_top_k=-1, save_last=True)
    ]
    if args.kill_after_step is not None:
        callbacks.append(_KillAfterStep(args.kill_after_step))
    trainer = pl.Trainer(
        default_root_dir=args.run,
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        max_steps=args.max_steps,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    model = DemoRegressor()
    trainer.fit(model, datamodule=DemoDataModule(size=96, num_workers=args.workers), ckpt_path="last")
    if trainer.is_global_zero:
        torch.save({"weights": model.state_dict(), "optimizer": trainer.optimizers[0].state_dict()}, args.out)


def _child(args: argparse.Namespace, run: Path, out: Path, kill_after: int | None = None) -> int:
    cmd = [
        sys.executable,
        __file__,
        "train",
        "--run",
        str(run),
        "--out",
        str(out),
        "--devices",
        str(args.devices),
        "--workers",
        str(args.workers),
        "--max-steps",
        str(args.max_steps),
    ]
    if kill_after is not None:
        cmd += ["--kill-after-step", str(kill_after)]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run(cmd, env=env, start_new_session=True)
    return proc.returncode


def _identical(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_identical(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        same_length = isinstance(b, (list, tuple)) and len(a) == len(b)
        return same_length and all(_identical(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def demo(args: argparse.Namespace) -> int:
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    print(f"[demo] 1/3 uninterrupted run -> {work / 'uninterrupted'}", flush=True)
    if _child(args, work / "uninterrupted", work / "uninterrupted.pt") != 0:
        return 2
    print(f"[demo] 2/3 run killed with SIGKILL after step {args.kill_after_step} -> {work / 'interrupted'}", flush=True)
    rc = _child(args, work / "interrupted", work / "resumed.pt", kill_after=args.kill_after_step)
    print(f"[demo]     child exit status {rc} (-9 = killed by SIGKILL)", flush=True)
    print("[demo] 3/3 same command again: resumes from the newest recoverable checkpoint", flush=True)
    if _child(args, work / "interrupted", work / "resumed.pt") != 0:
        return 2
    subprocess.run(
        [
            sys.executable,
            "-m",
            "lightning_field.cli.main",
            "ckpt",
            "list",
            "--verify",
            str(work / "interrupted" / "checkpoints"),
        ]
    )
    expected, resumed = torch.load(work / "uninterrupted.pt"), torch.load(work / "resumed.pt")
    if _identical(expected, resumed):
        print("[demo] EXACT: final weights and optimizer state are bitwise identical to the uninterrupted run")
        return 0
    worst = max((expected["weights"][k] - resumed["weights"][k]).abs().max().item() for k in expected["weights"])
    print(f"[demo] MISMATCH: max |Δw| = {worst:.3g}")
    return 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    for p in (parser, sub.add_parser("train", help="one training process (used internally)")):
        p.add_argument("--devices", type=int, default=1, help="CPU processes; >1 uses DDP over gloo")
        p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
        p.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--workdir", default="runs/resume_demo")
    parser.add_argument("--kill-after-step", type=int, default=13)
    train_parser = sub.choices["train"]
    train_parser.add_argument("--run", required=True)
    train_parser.add_argument("--out", required=True)
    train_parser.add_argument("--kill-after-step", type=int, default=None)
    args = parser.parse_args()
    if args.command == "train":
        train(args)
        return 0
    return demo(args)


if __name__ == "__main__":
    sys.exit(main())
