"""GPU paths of the checkpoints-at-scale set, on one CUDA device, in one short prepared run:

* async saves snapshot into pinned host buffers, and a SIGKILL mid-run resumes bitwise exactly
  (the demo model's dropout draws from the CUDA generator, so its capture and restore are checked);
* sharded (FSDP2 under ModelParallelStrategy, NCCL at world size 1) sync and async saves resume
  bitwise exactly after a SIGKILL;
* the async save's blocking time against a synchronous save of the same ~1 GB state.

    python benchmarks/gpu_checkpoint_check.py OUT_DIR                      # on a CUDA machine
    python benchmarks/gpu_checkpoint_check.py OUT_DIR --accelerator cpu    # a smoke run of this script

Every training run is its own process, killed with SIGKILL where a scenario says so. Prints one
line per check and exits non-zero if any fails.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SCENARIOS = {  # name: (sharded, async)
    "single-async": (False, True),
    "sharded-sync": (True, False),
    "sharded-async": (True, True),
}
KILL_AFTER_STEP = 13
STEPS = 20


def train(args: argparse.Namespace) -> int:
    """One training process: ``args.steps`` steps, saves every 5, optionally killed or resumed."""
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import Callback

    from lightning_field import ManifestCheckpoint, StorageConfig, latest_recoverable
    from lightning_field.core.distributed import exit_finished_process
    from lightning_field.workloads.demo import DemoDataModule, DemoRegressor, DemoShardedRegressor

    class KillAfterStep(Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *_: Any) -> None:
            if trainer.global_step == args.kill_after_step:
                os.kill(os.getpid(), signal.SIGKILL)

    pl.seed_everything(1234, workers=False)
    root = Path(args.root)
    checkpoint = ManifestCheckpoint(
        dirpath=root / "checkpoints", every_n_train_steps=5, save_top_k=-1,
        storage=StorageConfig(async_save=args.async_save),
    )
    callbacks: list[Callback] = [checkpoint]
    if args.kill_after_step is not None:
        callbacks.append(KillAfterStep())
    strategy: Any = "auto"
    if args.sharded:
        from lightning.pytorch.strategies import ModelParallelStrategy

        strategy = ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=1)
    trainer = pl.Trainer(
        default_root_dir=root, accelerator=args.accelerator, devices=1, strategy=strategy, max_steps=args.steps,
        callbacks=callbacks, logger=False, enable_progress_bar=False, enable_model_summary=False,
        limit_val_batches=0, deterministic=True,
    )  # fmt: skip
    model = (DemoShardedRegressor if args.sharded else DemoRegressor)(hidden=args.hidden)
    ckpt_path = latest_recoverable(root / "checkpoints") if args.resume else None
    print(f"RESUME-FROM {ckpt_path}", flush=True)
    trainer.fit(model, datamodule=DemoDataModule(size=96), ckpt_path=ckpt_path)
    if args.sharded:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights, optim = get_state_dict(model, trainer.optimizers[0], options=options)
    else:
        weights = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        optim = trainer.optimizers[0].state_dict()
    snapshot = checkpoint.async_saves.snapshot
    pinned = None if snapshot is None else snapshot.pin_memory
    torch.save({"weights": weights, "optimizer": optim, "step": trainer.global_step, "pinned": pinned},
               root / "final.pt")  # fmt: skip
    exit_finished_process(0)


def blocking(args: argparse.Namespace) -> int:
    """One process: two saves of a wide model's state, sync or async; prints the last one's blocking."""
    import lightning.pytorch as pl
    import torch
    from torch import nn

    from lightning_field import ManifestCheckpoint, StorageConfig
    from lightning_field.core.distributed import exit_finished_process
    from lightning_field.workloads.demo import DemoDataModule

    class Wide(pl.LightningModule):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.inp = nn.Linear(16, width)  # DemoDataModule's 16 features
            self.body = nn.Linear(width, width)
            self.out = nn.Linear(width, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.out(torch.relu(self.body(torch.relu(self.inp(x))))), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-4)

    checkpoint = ManifestCheckpoint(dirpath=Path(args.root) / "checkpoints", every_n_train_steps=2, save_top_k=1,
                                    storage=StorageConfig(async_save=args.async_save))  # fmt: skip
    trainer = pl.Trainer(
        default_root_dir=args.root, accelerator=args.accelerator, devices=1, max_steps=4, callbacks=[checkpoint],
        logger=False, enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
    )  # fmt: skip
    model = Wide(args.width)
    state_bytes = 3 * sum(p.numel() * p.element_size() for p in model.parameters())  # weights + Adam's two
    trainer.fit(model, datamodule=DemoDataModule(size=96))
    print(f"BLOCKING {checkpoint.last_blocking_seconds:.4f} STATE_BYTES {state_bytes}", flush=True)
    exit_finished_process(0)


def _child(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    command = [sys.executable, __file__, "--phase", *argv]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)


def _equal(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(_equal, a, b))
    return bool(a == b)


def run_scenario(out: Path, name: str, sharded: bool, async_save: bool, common: list[str]) -> dict[str, bool]:
    import torch

    flags = [*common, *(["--sharded"] if sharded else []), *(["--async-save"] if async_save else [])]
    reference, interrupted = out / name / "uninterrupted", out / name / "interrupted"
    runs = [
        (_child("train", "--root", str(reference), *flags), 0),
        (_child("train", "--root", str(interrupted), *flags, "--kill-after-step", str(KILL_AFTER_STEP)), -9),
        (_child("train", "--root", str(interrupted), *flags, "--resume"), 0),
    ]
    for result, expected in runs:
        if result.returncode != expected:
            print(f"  {name}: a run exited {result.returncode}, expected {expected}:\n{result.stdout[-3000:]}"
                  f"{result.stderr[-3000:]}")  # fmt: skip
            return {f"{name}_resume_exact": False}
    resumed_from = next(line for line in runs[2][0].stdout.splitlines() if line.startswith("RESUME-FROM"))
    expected, resumed = torch.load(reference / "final.pt"), torch.load(interrupted / "final.pt")
    print(f"  {name}: {resumed_from}; final step {resumed['step']}; host buffers pinned: {resumed['pinned']}")
    checks = {
        f"{name}_resume_exact": resumed["step"] == expected["step"] == STEPS
        and _equal(expected["weights"], resumed["weights"])
        and _equal(expected["optimizer"], resumed["optimizer"])
        and "None" not in resumed_from,
    }
    if async_save:
        checks[f"{name}_snapshot_pinned"] = resumed["pinned"] is torch.cuda.is_available()
    return checks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", default=None, help="where the runs go")
    parser.add_argument("--phase", choices=["train", "blocking"], help="internal: one child process's part")
    parser.add_argument("--accelerator", default="gpu")
    parser.add_argument("--root")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--width", type=int, default=8192, help="blocking: the wide layer (8192: ~0.8 GB state)")
    parser.add_argument("--sharded", action="store_true")
    parser.add_argument("--async-save", action="store_true")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--kill-after-step", type=int, default=None)
    args = parser.parse_args()
    if args.phase == "train":
        return train(args)
    if args.phase == "blocking":
        return blocking(args)
    if args.out is None:
        parser.error("OUT_DIR is required")
    import torch

    out = Path(args.out)
    print(f"torch {torch.__version__}; {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA'}")
    common = ["--accelerator", args.accelerator, "--hidden", str(args.hidden)]
    checks: dict[str, bool] = {}
    for name, (sharded, async_save) in SCENARIOS.items():
        start = time.perf_counter()
        checks.update(run_scenario(out, name, sharded, async_save, common))
        print(f"  {name}: {time.perf_counter() - start:.0f} s")
    seconds = {}
    for mode in ("sync", "async"):
        flags = ["--root", str(out / f"blocking-{mode}"), "--accelerator", args.accelerator, "--width", str(args.width)]
        result = _child("blocking", *flags, *(["--async-save"] if mode == "async" else []))
        line = next((ln for ln in result.stdout.splitlines() if ln.startswith("BLOCKING")), None)
        if result.returncode != 0 or line is None:
            print(f"  blocking {mode} failed ({result.returncode}):\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
            checks["async_blocking_ratio"] = False
            break
        fields = line.split()
        seconds[mode] = float(fields[1])
        print(f"  blocking {mode}: {seconds[mode]:.3f} s for a {int(fields[3]) / 1e9:.2f} GB state")
    if len(seconds) == 2:
        ratio = seconds["async"] / seconds["sync"]
        print(f"  async blocking / sync save: {ratio:.3f} (target <= 0.1)")
        checks["async_blocking_ratio"] = ratio <= 0.1
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'} {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
