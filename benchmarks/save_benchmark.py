"""Checkpoint save speed: ManifestCheckpoint vs Lightning's ModelCheckpoint vs the disk itself.

What is timed, and why it is a fair comparison
----------------------------------------------
For each target size a LightningModule of four bias-free ``nn.Linear(w, w)`` layers is trained for two
real steps on CPU with AdamW, so the training state (fp32 weights + AdamW's ``exp_avg`` and
``exp_avg_sq``) is about the target size: ``3 * 4 bytes * 4 * w**2``. Both callbacks are attached to the
*same* Trainer with their own scheduling disabled; at step 2 a timing callback calls
``callback._save_checkpoint(trainer, path)`` on each of them. That is the method Lightning's own hooks
call when a checkpoint is due, so the timed work is exactly what a training loop blocks on:

* ``ModelCheckpoint``: ``trainer.save_checkpoint`` -> ``dump_checkpoint`` -> ``TorchCheckpointIO``
  (``torch.save`` into a ``BytesIO``, then one write through fsspec). It does **not** fsync: when it
  returns, the bytes may still be only in the page cache. (ManifestCheckpoint wraps the strategy's
  CheckpointIO, but passes plain ``.ckpt`` saves straight through to ``TorchCheckpointIO``.)
* ``ManifestCheckpoint``: ``dump_checkpoint`` -> ``torch.save`` streamed into the hashing writer
  (sha256 while writing), fsync, the per-rank file, ``manifest.json``, the directory rename, the
  directory fsyncs and the ``LAST`` pointer. When it returns, the checkpoint is durable.

Because the plain save leaves its data unflushed, a third figure, "ModelCheckpoint + fsync", adds the
fsync of the file it wrote, measured immediately after it: that is the cost of making it as durable.

The disk's own speed is measured on the same filesystem and the same size: ``dd if=/dev/zero
bs=4M conv=fsync`` (its own timing, parsed) and a pure-Python unbuffered write of 4 MiB chunks + fsync.

Every operation is preceded by an untimed ``os.sync()``, so none inherits another's dirty pages, and
its output is deleted after it. The order of the four operations rotates each round, one untimed
warm-up round precedes the timed ones, and the median of ``--repeats`` rounds is reported. MB means
10**6 bytes; throughput is the bytes each one wrote divided by its time.

Usage::

    python benchmarks/save_benchmark.py --sizes-mb 100 1000 --repeats 3 [--dir PATH]
"""

from __future__ import annotations

import argparse
import gc
import logging
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import nn
from torch.utils.data import TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

import lightning_field
from lightning_field import ManifestCheckpoint

LAYERS = 4
BATCH = 8
WARM_STEPS = 2
DD_BLOCK = 4 << 20
OPS = ("ManifestCheckpoint", "ModelCheckpoint", "dd", "python")


class BigLinear(pl.LightningModule):
    def __init__(self, width: int, layers: int = LAYERS) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(layers)])

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


class BigLinearData(pl.LightningDataModule):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.width = width

    def train_dataloader(self) -> StatefulDataLoader:
        gen = torch.Generator().manual_seed(0)
        data = TensorDataset(
            torch.randn(8 * BATCH, self.width, generator=gen), torch.randn(8 * BATCH, self.width, generator=gen)
        )
        return StatefulDataLoader(data, batch_size=BATCH, shuffle=True)


@dataclass
class Samples:
    seconds: list[float] = field(default_factory=list)
    nbytes: list[int] = field(default_factory=list)

    def add(self, seconds: float, nbytes: int) -> None:
        self.seconds.append(seconds)
        self.nbytes.append(nbytes)

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def mb_per_s(self) -> float:
        return statistics.median(self.nbytes) / 1e6 / self.median_s


def width_for(target_mb: float) -> int:
    """Square layer width so that weights + AdamW's two moments (fp32) come to about ``target_mb``."""
    return max(8, round(math.sqrt(target_mb * 1e6 / (3 * 4 * LAYERS))))


def tree_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def run_dd(path: Path, count: int) -> tuple[float, int]:
    """``dd ... conv=fsync``; returns dd's own (seconds, bytes)."""
    cmd = ["dd", "if=/dev/zero", f"of={path}", f"bs={DD_BLOCK // (1 << 20)}M", f"count={count}", "conv=fsync"]
    result = subprocess.run(
        cmd, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"}, timeout=600, check=True
    )
    match = re.search(r"^(\d+) bytes .* copied, ([0-9.eE+-]+) s", result.stderr, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"could not parse dd output: {result.stderr!r}")
    return float(match.group(2)), int(match.group(1))


def python_write_fsync(path: Path, count: int) -> tuple[float, int]:
    """Unbuffered writes of one 4 MiB buffer ``count`` times, then fsync: Python's floor for this disk."""
    chunk = bytes(DD_BLOCK)
    start = time.perf_counter()
    with open(path, "xb", buffering=0) as f:
        for _ in range(count):
            view = memoryview(chunk)
            while view:
                view = view[f.write(view) :]
        os.fsync(f.fileno())
    return time.perf_counter() - start, count * DD_BLOCK


class SaveTimer(Callback):
    """At ``WARM_STEPS``, time every operation ``rounds`` times (the first round is a warm-up)."""

    def __init__(self, manifest_cb: ManifestCheckpoint, plain_cb: ModelCheckpoint, workdir: Path, repeats: int) -> None:
        self.manifest_cb = manifest_cb
        self.plain_cb = plain_cb
        self.workdir = workdir
        self.repeats = repeats
        self.results: dict[str, Samples] = {name: Samples() for name in (*OPS, "ModelCheckpoint + fsync")}
        self.state_bytes = 0

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step != WARM_STEPS:
            return
        optimizer = trainer.optimizers[0]
        tensors = [p for p in pl_module.parameters()] + [
            t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)
        ]
        self.state_bytes = sum(t.numel() * t.element_size() for t in tensors)
        dd_count = max(1, round(self.state_bytes / DD_BLOCK))
        for rnd in range(self.repeats + 1):
            timed = rnd > 0
            shift = rnd % len(OPS)
            for op in OPS[shift:] + OPS[:shift]:
                os.sync()
                self._run(op, trainer, rnd, dd_count, timed)

    def _run(self, op: str, trainer: pl.Trainer, rnd: int, dd_count: int, timed: bool) -> None:
        record: Callable[[str, float, int], None] = (
            (lambda name, s, n: self.results[name].add(s, n)) if timed else (lambda name, s, n: None)
        )
        if op == "ManifestCheckpoint":
            path = self.workdir / "manifest" / f"bench-r{rnd}"
            start = time.perf_counter()
            self.manifest_cb._save_checkpoint(trainer, str(path))
            seconds = time.perf_counter() - start
            record(op, seconds, tree_bytes(path))
        elif op == "ModelCheckpoint":
            path = self.workdir / "plain" / f"bench-r{rnd}.ckpt"
            start = time.perf_counter()
            self.plain_cb._save_checkpoint(trainer, str(path))
            seconds = time.perf_counter() - start
            fsync_path(path)
            with_fsync = time.perf_counter() - start
            record(op, seconds, path.stat().st_size)
            record("ModelCheckpoint + fsync", with_fsync, path.stat().st_size)
        elif op == "dd":
            path = self.workdir / f"dd-r{rnd}.bin"
            record(op, *run_dd(path, dd_count))
        else:
            path = self.workdir / f"py-r{rnd}.bin"
            record(op, *python_write_fsync(path, dd_count))
        remove(path)


def bench_size(target_mb: float, repeats: int, workdir: Path) -> tuple[int, dict[str, Samples]]:
    width = width_for(target_mb)
    pl.seed_everything(0, verbose=False)
    manifest_cb = ManifestCheckpoint(dirpath=workdir / "manifest", every_n_epochs=0, save_last=False)
    plain_cb = ModelCheckpoint(dirpath=workdir / "plain", every_n_epochs=0, save_last=False)
    timer = SaveTimer(manifest_cb, plain_cb, workdir, repeats)
    trainer = pl.Trainer(
        default_root_dir=workdir / "root",
        accelerator="cpu",
        devices=1,
        max_steps=WARM_STEPS + 1,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[manifest_cb, plain_cb, timer],
    )
    trainer.fit(BigLinear(width), datamodule=BigLinearData(width))
    return timer.state_bytes, timer.results


def filesystem_of(path: Path) -> str:
    best, fstype = "", "?"
    target = str(path.resolve())
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            mount = parts[1]
            if (target == mount or target.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
                best, fstype = mount, f"{parts[2]} ({parts[0]} on {mount})"
    return fstype


def default_parent() -> Path:
    """The system temp dir if it shares the current directory's filesystem (so a repository checkout is
    not littered), else the current directory itself."""
    tmp = Path(tempfile.gettempdir())
    return tmp if tmp.stat().st_dev == Path.cwd().stat().st_dev else Path.cwd()


def fmt_row(name: str, s: Samples, note: str = "") -> str:
    runs = " ".join(f"{x:.3f}" for x in s.seconds)
    return f"  {name:<26} {s.median_s:>9.3f} {s.mb_per_s:>9.0f}   [{runs}] {note}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes-mb", type=float, nargs="+", default=[100, 1000], help="training-state sizes to test")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds per size (after one warm-up round)")
    p.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir on this filesystem)")
    args = p.parse_args()
    if args.repeats < 1:
        p.error("--repeats must be >= 1")

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("lightning.fabric").setLevel(logging.ERROR)

    parent = args.dir if args.dir is not None else default_parent()
    parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="save-bench-", dir=parent))
    try:
        print(
            f"save benchmark  {time.strftime('%Y-%m-%d %H:%M')}  python {platform.python_version()}"
            f"  torch {torch.__version__}  lightning {pl.__version__}"
            f"  cpus {os.cpu_count()}  torch threads {torch.get_num_threads()}  load average {os.getloadavg()[0]:.2f}"
        )
        print(f"writing under {workdir}  filesystem {filesystem_of(workdir)}")
        print(f"lightning_field from {Path(lightning_field.__file__).parent}")
        print(
            "NOTE: plain ModelCheckpoint does NOT fsync; its time ends with the data possibly still in the page cache."
            " 'ModelCheckpoint + fsync' adds that flush."
        )
        summary = []
        for target in args.sizes_mb:
            started = time.perf_counter()
            state_bytes, res = bench_size(target, args.repeats, workdir)
            gc.collect()
            m, pcb, d = res["ManifestCheckpoint"], res["ModelCheckpoint"], res["dd"]
            time_ratio = m.median_s / pcb.median_s
            speed_ratio = m.mb_per_s / d.mb_per_s
            # The disk is noisy: also compare with dd's fastest round, the harder bar.
            dd_best = statistics.median(d.nbytes) / 1e6 / min(d.seconds)
            strict_ratio = m.mb_per_s / dd_best
            print(
                f"\n== target {target:g} MB: training state {state_bytes / 1e6:.0f} MB (weights + AdamW moments),"
                f" {args.repeats} timed rounds  ({time.perf_counter() - started:.0f}s incl. training)"
            )
            print(f"  {'':<26} {'median s':>9} {'MB/s':>9}   [each round, s]")
            print(fmt_row("ManifestCheckpoint", m, "(hash + fsync + manifest)"))
            print(fmt_row("ModelCheckpoint", pcb, "(no fsync)"))
            print(fmt_row("ModelCheckpoint + fsync", res["ModelCheckpoint + fsync"]))
            print(fmt_row("dd conv=fsync", d, f"(bs=4M count={round(statistics.median(d.nbytes) / DD_BLOCK)})"))
            print(fmt_row("python write+fsync", res["python"]))
            verdict_t = "meets" if time_ratio <= 1.0 else "MISSES"
            verdict_s = "meets" if speed_ratio >= 0.5 else "MISSES"
            print(f"  ratio ManifestCheckpoint/ModelCheckpoint time  = {time_ratio:.2f}  (target <= 1.00: {verdict_t})")
            print(
                f"  ratio ManifestCheckpoint/dd throughput         = {speed_ratio:.2f}  (target >= 0.50: {verdict_s})"
            )
            print(f"  same, against dd's fastest round ({dd_best:.0f} MB/s) = {strict_ratio:.2f}")
            print(f"  load average now {os.getloadavg()[0]:.2f} (other processes compete for the CPUs and the disk)")
            summary.append(
                (target, state_bytes, m, pcb, res["ModelCheckpoint + fsync"], d, time_ratio, speed_ratio, strict_ratio)
            )
        print("\nsummary (medians)")
        print(
            f"  {'state MB':>8} {'Manifest s':>10} {'MB/s':>6} {'Model s':>8} {'MB/s':>6} {'Model+fsync s':>13}"
            f" {'dd MB/s':>8} {'M/Model time':>12} {'M/dd speed':>10} {'M/dd-best':>9}"
        )
        for _target, state_bytes, m, pcb, pf, d, tr, sr, xr in summary:
            print(
                f"  {state_bytes / 1e6:>8.0f} {m.median_s:>10.3f} {m.mb_per_s:>6.0f}"
                f" {pcb.median_s:>8.3f} {pcb.mb_per_s:>6.0f} {pf.median_s:>13.3f}"
                f" {d.mb_per_s:>8.0f} {tr:>12.2f} {sr:>10.2f} {xr:>9.2f}"
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
