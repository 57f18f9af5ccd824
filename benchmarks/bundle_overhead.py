"""What the whole bundle costs per training step, against a bare Trainer (issue 39 item 6).

The main job's model (``CharGPT`` at its default size, on the standard library's bytes, batch of
``--batch-size`` windows: ~46 ms a step on 2 cores at 8) trained by a bare Trainer (no callbacks,
no checkpointing) and by the same Trainer with the bundle as ``field-train`` composes it:
``ManifestCheckpoint`` (a persistent interval longer than the run: saves are not per-step work),
``TimeToQuality``, ``CheckpointCadence`` and ``StragglerMonitor``, at their defaults, once with the
step snapshots off and once with the default ``"auto"`` snapshots (which may take up to their
1 % budget on top). Interleaved rounds; the figure is the median interval between batch ends after
warm-up, and the ratio to the bare run of the same round.

Then one bundle run with every callback hook timed (a wrapper around each hook of each callback),
and the train fetch timed, so the table says where a step's overhead goes.

    python benchmarks/bundle_overhead.py [--steps 80] [--rounds 3] [--batch-size 8]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from lightning_field import CheckpointCadence, ManifestCheckpoint, SnapshotConfig, StragglerMonitor, TimeToQuality
from lightning_field.workloads.char_gpt import CharGPT
from lightning_field.workloads.stdlib_text import StdlibTextDataModule

NEVER = 10**9
WARMUP = 10
HOOKS = ("on_train_batch_start", "on_train_batch_end", "on_before_optimizer_step", "on_before_backward",
         "on_after_backward", "on_before_zero_grad", "on_train_epoch_start", "on_train_epoch_end")  # fmt: skip


class StepClock(Callback):
    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_train_batch_end(self, *args: Any) -> None:
        self.ends.append(time.perf_counter())

    def median_step(self) -> float:
        return statistics.median(b - a for a, b in zip(self.ends[WARMUP:], self.ends[WARMUP + 1 :], strict=False))


def bundle(root: Path, snapshots: bool) -> list[Callback]:
    return [
        ManifestCheckpoint(dirpath=root / "ckpts", every_n_train_steps=NEVER,
                           snapshots=SnapshotConfig(every_n_train_steps="auto" if snapshots else None)),
        TimeToQuality(monitor="val_loss", target=1.5),
        CheckpointCadence(mtbf_hours=6),
        StragglerMonitor(),
    ]  # fmt: skip


def step_time(variant: str, steps: int, batch_size: int, root: Path, timed: dict[str, list[float]] | None = None
              ) -> float:  # fmt: skip
    pl.seed_everything(0, verbose=False)
    clock = StepClock()
    callbacks = [] if variant == "bare" else bundle(root, snapshots=variant == "bundle + auto snapshots")
    if timed is not None:
        for callback in callbacks:
            _time_hooks(callback, timed)
    trainer = pl.Trainer(
        default_root_dir=root, max_steps=steps, accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, callbacks=[clock, *callbacks],
        enable_checkpointing=variant != "bare",
    )  # fmt: skip
    data = StdlibTextDataModule(batch_size=batch_size)
    if timed is not None:
        _time_fetch(trainer, timed)
    trainer.fit(CharGPT(), datamodule=data)
    return clock.median_step()


def _time_hooks(callback: Callback, timed: dict[str, list[float]]) -> None:
    for hook in HOOKS:
        original = getattr(callback, hook)

        @functools.wraps(original)
        def wrapped(*args: Any, _original: Callable[..., Any] = original, _hook: str = hook, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                timed[f"{type(callback).__name__}.{_hook}"].append(time.perf_counter() - start)

        setattr(callback, hook, wrapped)


def _time_fetch(trainer: pl.Trainer, timed: dict[str, list[float]]) -> None:
    """The train fetch (``__next__`` of Lightning's fetcher), as timed through its profiler hooks."""
    loop = trainer.fit_loop.epoch_loop
    started: list[float] = []
    before, after = loop._on_before_fetch, loop._on_after_fetch

    def on_before() -> None:
        started.append(time.perf_counter())
        before()

    def on_after() -> None:
        after()
        timed["train fetch (Lightning's fetcher)"].append(time.perf_counter() - started.pop())

    loop._on_before_fetch, loop._on_after_fetch = on_before, on_after  # type: ignore[method-assign]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    variants = ["bare", "bundle, snapshots off", "bundle + auto snapshots"]
    ratios: dict[str, list[float]] = defaultdict(list)
    steps: dict[str, list[float]] = defaultdict(list)
    for round_index in range(args.rounds):
        order = variants if round_index % 2 == 0 else variants[::-1]
        took = {}
        for variant in order:
            with tempfile.TemporaryDirectory() as root:
                took[variant] = step_time(variant, args.steps, args.batch_size, Path(root))
            print(f"  round {round_index + 1} {variant:26s} {took[variant] * 1e3:8.2f} ms", flush=True)
        for variant in variants:
            steps[variant].append(took[variant])
            ratios[variant].append(took[variant] / took["bare"])
    print(f"\n| variant | median step | ÷ bare (per round: {', '.join(str(r + 1) for r in range(args.rounds))}) |")
    print("|---|---|---|")
    for variant in variants:
        each = ", ".join(f"{r:.4f}" for r in ratios[variant])
        median = statistics.median(steps[variant]) * 1e3
        print(f"| {variant} | {median:.2f} ms | {statistics.median(ratios[variant]):.4f} ({each}) |")
    timed: dict[str, list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as root:
        step = step_time("bundle, snapshots off", args.steps, args.batch_size, Path(root), timed)
    bare: dict[str, list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as root:
        step_time("bare", args.steps, args.batch_size, Path(root), bare)
    for name, times in bare.items():
        timed[f"{name}, bare Trainer"] = times
    print(f"\nWhere a step's overhead goes (bundle, snapshots off, one run, {step * 1e3:.2f} ms a step): per step,")
    print("the mean over the steps after warm-up of each hook's own time\n")
    print("| hook | µs per step |")
    print("|---|---|")
    per_step = {name: statistics.mean(times[WARMUP:]) * 1e6 for name, times in timed.items() if len(times) > WARMUP}
    for name, micros in sorted(per_step.items(), key=lambda item: -item[1]):
        print(f"| {name} | {micros:.1f} |")


if __name__ == "__main__":
    main()
