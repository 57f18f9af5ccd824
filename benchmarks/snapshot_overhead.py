"""Step snapshots (issue 28): what a snapshot every N steps costs per step, and what a SIGKILL redoes.

1. **Overhead.** The main job's model (``CharGPT`` at its default size on the standard library's
   bytes) and a 1 GB state (a 256M-float parameter under SGD), each with ``SnapshotConfig(every_n_train_steps=...)``
   off and at N = 1, 2, 5, 10, in interleaved rounds; persistent checkpoints are off (an interval
   longer than the run). Figure: the mean interval between batch ends (warm-up excluded) ÷ the
   same run without snapshots, measured in the same process.
2. **Steps redone.** ``--kills`` runs of the demo workload (persistent checkpoint every 10 steps,
   a snapshot every step), each SIGKILLed at a random step and rerun with ``ckpt_path="last"``:
   steps redone = the step killed at − the step resumed from.
3. **The seed's scenario.** A 60 s save and a 6 h mean time between failures: the expected work lost
   per failure at the Young interval with persistent checkpoints alone, and with a snapshot every N
   steps at the measured step time.

    python benchmarks/snapshot_overhead.py [--steps 40] [--rounds 3] [--kills 20] [--skip-1gb] [--profile-only]

4. **Where the time goes.** One more run at N = 1 under cProfile: per snapshot, the capture, the
   commit, the raw tensor files, their hashing and writing, the manifest.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_field import ManifestCheckpoint, SnapshotConfig
from lightning_field.checkpoint.snapshots import snapshot_dir_for
from lightning_field.planning.intervals import young_interval
from lightning_field.workloads.char_gpt import CharGPT
from lightning_field.workloads.demo import DemoDataModule, DemoRegressor
from lightning_field.workloads.stdlib_text import StdlibTextDataModule

NEVER = 10**9
WARMUP = 5


class StepClock(Callback):
    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_train_batch_end(self, *args: Any) -> None:
        self.ends.append(time.perf_counter())

    def mean_step(self) -> float:
        # The mean, not the median: with a snapshot every N > 1 steps, the median is a step without one.
        intervals = [b - a for a, b in zip(self.ends[WARMUP:], self.ends[WARMUP + 1 :], strict=False)]
        return statistics.mean(intervals)


class OneGigabyte(pl.LightningModule):
    """A 1 GB parameter (256M float32) trained by plain SGD: the state a snapshot copies each time."""

    def __init__(self) -> None:
        super().__init__()
        self.big = nn.Parameter(torch.zeros(256 * 1024 * 1024))
        self.head = nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        # Touches every element, as a real step does, at the cost of one pass over 1 GB.
        return nn.functional.mse_loss(self.head(x), y) + self.big.sum() * 0.0

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def one_gigabyte_data() -> DataLoader:
    gen = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(4096, 4, generator=gen), torch.randn(4096, 1, generator=gen)),
                      batch_size=16, shuffle=True)  # fmt: skip


Variant = tuple[int | None, bool | None]
"""(snapshot every N steps or None: off, SnapshotConfig.in_line: None is the default, in line on CPU)."""


def label(variant: Variant) -> str:
    every, in_line = variant
    if every is None:
        return "off"
    where = "" if in_line is None else (", in line" if in_line else ", beside training")
    return f"{every} step{'s' if every > 1 else ''}{where}"


def step_time(workload: str, variant: Variant, steps: int, root: Path) -> float:
    pl.seed_everything(0, verbose=False)
    clock = StepClock()
    snapshots: dict[str, Any] = {}
    every, in_line = variant
    if every is not None:
        # The default directory: /dev/shm.
        snapshots = {"snapshots": SnapshotConfig(every_n_train_steps=every, in_line=in_line)}
    checkpoint = ManifestCheckpoint(dirpath=root / "ckpts", every_n_train_steps=NEVER, **snapshots)
    trainer = pl.Trainer(
        default_root_dir=root, max_steps=steps, accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, callbacks=[clock, checkpoint],
    )  # fmt: skip
    try:
        if workload == "main job":
            trainer.fit(CharGPT(), datamodule=StdlibTextDataModule())
        else:
            trainer.fit(OneGigabyte(), train_dataloaders=one_gigabyte_data())
    finally:
        shutil.rmtree(snapshot_dir_for(root / "ckpts"), ignore_errors=True)
    return clock.mean_step()


def overhead(workloads: list[str], steps: int, rounds: int, variants: list[Variant]) -> dict[str, float]:
    times: dict[tuple[str, str], list[float]] = {}
    for round_index in range(rounds):
        for workload in workloads:
            order = variants if round_index % 2 == 0 else list(reversed(variants))
            for variant in order:
                with tempfile.TemporaryDirectory() as root:
                    took = step_time(workload, variant, steps, Path(root))
                times.setdefault((workload, label(variant)), []).append(took)
                print(f"  round {round_index + 1} {workload:9s} {label(variant):24s} {took * 1e3:8.2f} ms", flush=True)
    medians = {f"{w}|{v}": statistics.median(t) for (w, v), t in times.items()}
    print("\n| workload | snapshot every | mean step | ÷ no snapshots |")
    print("|---|---|---|---|")
    for workload in workloads:
        base = medians[f"{workload}|off"]
        for variant in variants:
            value = medians[f"{workload}|{label(variant)}"]
            print(f"| {workload} | {label(variant)} | {value * 1e3:.2f} ms | {value / base:.4f} |")
    return medians


# ------------------------------------------------------------------------------------ steps redone
class KillAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class StartStep(Callback):
    def __init__(self, out: Path) -> None:
        self.out = out

    def on_train_start(self, trainer: pl.Trainer, *args: Any) -> None:
        self.out.write_text(str(trainer.global_step))


def child(root: Path, kill_at: int | None, max_steps: int) -> None:
    warnings.filterwarnings("ignore")
    pl.seed_everything(0, verbose=False)
    snapshots = SnapshotConfig(every_n_train_steps=1, directory=root / "shm")
    checkpoint = ManifestCheckpoint(dirpath=root / "ckpts", every_n_train_steps=10, snapshots=snapshots)
    callbacks: list[Callback] = [checkpoint, StartStep(root / "start_step")]
    if kill_at is not None:
        callbacks.append(KillAt(kill_at))
    trainer = pl.Trainer(
        default_root_dir=root, max_steps=max_steps, accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, callbacks=callbacks,
    )  # fmt: skip
    trainer.fit(DemoRegressor(), datamodule=DemoDataModule(size=512), ckpt_path="last")


def steps_redone(kills: int, max_steps: int, seed: int) -> list[int]:
    chooser = random.Random(seed)
    redone = []
    for index in range(kills):
        kill_at = chooser.randint(3, max_steps - 1)
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            command = [sys.executable, __file__, "--child", str(root), "--max-steps", str(max_steps)]
            killed = subprocess.run([*command, "--kill-at", str(kill_at)], capture_output=True, text=True)
            if killed.returncode != -signal.SIGKILL:
                why = f"exit {killed.returncode}:\n{killed.stderr[-2000:]}"
                raise RuntimeError(f"the kill at step {kill_at} did not land ({why})")
            resumed = subprocess.run(command, capture_output=True, text=True)
            if resumed.returncode != 0:
                raise RuntimeError(f"the rerun after the kill at {kill_at} failed:\n{resumed.stderr[-2000:]}")
            start = int((root / "start_step").read_text())
        redone.append(kill_at - start)
        print(f"  kill {index + 1:2d}: killed at step {kill_at:2d}, resumed from {start:2d}: {kill_at - start} redone",
              flush=True)  # fmt: skip
    return redone


def scenario(step_s: float, intervals: list[int]) -> None:
    save_s, mtbf_s = 60.0, 6 * 3600.0
    interval_s = young_interval(save_s, mtbf_s)
    print(f"\nThe seed's scenario: a {save_s:.0f} s save, MTBF {mtbf_s / 3600:.0f} h: the Young interval is"
          f" {interval_s / 60:.1f} min, so a crash loses {interval_s / 2 / 60:.1f} min of work on average with"
          " persistent checkpoints alone.")  # fmt: skip
    for every in intervals:
        # A snapshot every N steps: at most N steps redone (the newest may still be committing),
        # about half an interval on average, plus the one in flight.
        lost = (every / 2 + 1) * step_s
        print(
            f"  a snapshot every {every:2d} step(s) at {step_s * 1e3:.0f} ms a step: at most {every} steps,"
            f" {lost:.2f} s lost on average ({interval_s / 2 / lost:,.0f}× less)"
        )


# Where a snapshot's time goes: (label, module path ending, function name, caller's name or None), the
# cumulative time of each per snapshot (with a caller: only its calls from there). Indented rows are
# parts of the row above them, not additions.
SNAPSHOTS_PY, TENSOR_FILE_PY = "checkpoint/snapshots.py", "checkpoint/tensor_file.py"
PARTS = [
    ("the whole snapshot, on the training thread", SNAPSHOTS_PY, "after_step", None),
    ("  the state's capture (Lightning's dump, RNG, data position)", "manifest_checkpoint.py", "capture_save", None),
    ("  un-publishing the oldest (files kept for reuse)", SNAPSHOTS_PY, "_retire_oldest", None),
    ("  the commit", "checkpoint/commit.py", "commit_save", None),
    ("    raw tensor files (header, copies, hash, write)", TENSOR_FILE_PY, "write_tensor_file", None),
    ("      the tree walked into the JSON header", TENSOR_FILE_PY, "node", "write_tensor_file"),
    ("      tensor views and host copies", TENSOR_FILE_PY, "_host_bytes", "write_tensor_file"),
    ("      small pieces gathered into one buffer", TENSOR_FILE_PY, "_segments", "write_tensor_file"),
    ("      open(2) of the file", "~", "<built-in method posix.open>", "write_tensor_file"),
    ("      the hash thread started", "threading.py", "start", "write_tensor_file"),
    ("      BLAKE3, in line (files under 1 MiB)", TENSOR_FILE_PY, "_hash_all", "write_tensor_file"),
    ("      BLAKE3 beside the write: the wait for its thread", "threading.py", "join", "write_tensor_file"),
    ("      writev(2) of the bytes", TENSOR_FILE_PY, "_write_all", "write_tensor_file"),
    ("    the manifest built", "checkpoint/commit.py", "build_manifest", None),
    ("    the manifest published", "checkpoint/stores/snapshot.py", "publish", None),
]


def where_the_time_goes(steps: int) -> None:
    """One main-job run with a snapshot every step under cProfile: per snapshot, what each part takes.
    The profiler's own cost inflates Python-heavy parts; the ratios in the table above are unprofiled."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    with tempfile.TemporaryDirectory() as root:
        profiler.enable()
        step_time("main job", (1, None), steps, Path(root))
        profiler.disable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]

    def measured(module: str, function: str, caller: str | None) -> tuple[int, float]:
        calls, seconds = 0, 0.0
        for (path, _, name), (_, count, _, cumulative, callers) in stats.items():
            if not (path.endswith(module) and name == function):
                continue
            if caller is None:
                calls, seconds = calls + count, seconds + cumulative
                continue
            for (_, _, caller_name), (_, caller_count, _, caller_cumulative) in callers.items():
                if caller_name == caller:
                    calls, seconds = calls + caller_count, seconds + caller_cumulative
        return calls, seconds

    snapshots = max(measured(*PARTS[0][1:])[0], 1)
    print(f"\nWhere a snapshot's time goes (main job, a snapshot every step, {steps} steps, cProfile):")
    print("| part | calls | ms per snapshot |")
    print("|---|---|---|")
    for text, module, function, caller in PARTS:
        calls, seconds = measured(module, function, caller)
        print(f"| {text} | {calls} | {seconds / snapshots * 1e3:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--skip-1gb", action="store_true")
    parser.add_argument("--child", type=Path)
    parser.add_argument("--kill-at", type=int)
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--profile-only", action="store_true", help="only the table of where the time goes")
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.kill_at, args.max_steps)
        return
    warnings.filterwarnings("ignore")
    variants: list[Variant] = [(None, None), (1, None), (1, False), (2, None), (5, None), (10, None)]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cores")
    if args.profile_only:
        where_the_time_goes(args.steps)
        return
    medians = overhead(["main job"], args.steps, args.rounds, variants)
    if not args.skip_1gb:
        overhead(["1 GB"], max(args.steps // 2, WARMUP + 8), 1, [(None, None), (1, None), (1, False)])
    if args.kills:
        redone = steps_redone(args.kills, args.max_steps, seed=0)
        print(
            f"\nsteps redone over {len(redone)} SIGKILLs at random steps: max {max(redone)},"
            f" mean {statistics.mean(redone):.2f}, counts {sorted(set(redone))}"
        )
    scenario(medians["main job|off"], [1, 2, 5, 10])
    where_the_time_goes(args.steps)


if __name__ == "__main__":
    main()
