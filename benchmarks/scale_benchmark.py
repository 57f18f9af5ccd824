"""Checkpoints at scale: async blocking time, verify and load speed, resume position cost, S3 transfer.

Each subcommand prints its measurements and the ratio its target is stated in (issue 7):

* ``async``  – blocking time of an async save (the save call plus the training thread's wait for
  the deferred copy before the next update) ÷ a synchronous save of the same Trainer state
  (``ManifestCheckpoint._save_checkpoint``, what Lightning's hooks call), for each ``--sizes-mb``,
  in rounds that interleave the two (``AsyncTimer``); the next step's remaining extra time is
  printed beside a clean step's. Round 0 is an untimed warm-up: it allocates the snapshot buffers.
  Target ≤ 0.05 at 4 GB (issue 16).
* ``verify`` – SHA-256 verification throughput on one core (``hash_file`` over a page-cached file).
  Target ≥ 1 GB/s.
* ``load``   – loading a committed checkpoint through ``ManifestCheckpointIO`` (hash verification,
  then ``torch.load``) ÷ a plain ``torch.load`` of the same ``state.pt``. Target ≤ 1.2.
* ``resume`` – ``trainer.fit(ckpt_path=...)`` from its call to the first training batch, for a
  checkpoint at batch 10 and one at batch 1,000,000 of an epoch (8 samples per batch, a map-style
  dataset of 8,000,008 synthetic samples). The batch-1,000,000 checkpoint is the batch-10 one with
  its data position (the loader state in ``state.pt`` and in the rank file) set to 1,000,000, and
  re-committed with a fresh manifest: training a million steps first would take hours and measure
  nothing more. Both samplers are run: ``JumpRandomSampler`` and torchdata's ``RandomSampler``.
  Target ratio ≤ 1.5.
* ``s3``     – against moto's S3 server on loopback: a checkpoint save through ``ObjectStore`` (stage,
  hash, parallel multipart upload, manifest PUT) and a load (download, verify, ``torch.load``) ÷ a
  plain fsspec ``put_file``/``get_file`` of the same bytes.

MB means 10**6 bytes. Usage::

    python benchmarks/scale_benchmark.py async --sizes-mb 1000 4000
    python benchmarks/scale_benchmark.py verify --size-mb 1000
    python benchmarks/scale_benchmark.py load --size-mb 1000
    python benchmarks/scale_benchmark.py resume
    python benchmarks/scale_benchmark.py s3 --size-mb 256
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import shutil
import statistics
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
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import RandomSampler

sys.path.insert(0, str(Path(__file__).parent))
from save_benchmark import BigLinear, BigLinearData, default_parent, width_for

from lightning_field import JumpRandomSampler, ManifestCheckpoint
from lightning_field.checkpoint.io import ManifestCheckpointIO
from lightning_field.checkpoint.stores import ObjectStore
from lightning_field.core.hashing import hash_file
from lightning_field.core.manifest import SHARED_STATE_FILE, rank_state_file, read_manifest


def _quiet() -> None:
    warnings.filterwarnings("ignore")
    for name in ("lightning.pytorch", "lightning.fabric", "lightning_field", "werkzeug"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _trainer(root: Path, callbacks: list[Callback], max_steps: int) -> pl.Trainer:
    return pl.Trainer(
        default_root_dir=root,
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )


# ---------------------------------------------------------------------------------------------- async
class AsyncTimer(Callback):
    """Rounds of three steps: a timed sync save and then an async save at the first step's end, the
    second step running while the async copy and commit proceed, and a third step with no save.

    An async save's *blocking* time is what the training thread spends on it: the
    ``_save_checkpoint`` call plus any wait for the deferred copy of parameters and optimizer state,
    which comes before the second step's optimizer update (``DeferredCopies.waited_seconds``). The
    second step's extra wall time beyond that (the copy and the write sharing the cores and memory
    bandwidth with training) is reported apart, against the third step, the clean baseline.
    """

    def __init__(self, callback: ManifestCheckpoint, workdir: Path, repeats: int) -> None:
        self.callback, self.workdir, self.repeats = callback, workdir, repeats
        self.sync_s: list[float] = []
        self.blocking_s: list[float] = []
        self.call_s: list[float] = []
        self.commit_s: list[float] = []
        self.next_step_s: list[float] = []
        self.clean_step_s: list[float] = []
        self._step_start = 0.0
        self._async_start = 0.0
        self._async_call = 0.0

    @property
    def steps(self) -> int:
        return 3 * (self.repeats + 1) + 1

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, idx: int) -> None:
        self._step_start = time.perf_counter()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, idx: int) -> None:
        step_s = time.perf_counter() - self._step_start
        rnd, phase = divmod(trainer.global_step - 1, 3)
        timed = rnd >= 1  # round 0 is the warm-up: it allocates the snapshot buffers
        if rnd > self.repeats:
            return
        if phase == 0:
            os.sync()
            path = self.workdir / "sync" / f"r{rnd}"
            self.callback.async_save = False
            start = time.perf_counter()
            self.callback._save_checkpoint(trainer, str(path))
            if timed:
                self.sync_s.append(time.perf_counter() - start)
            shutil.rmtree(path)
            os.sync()
            self.callback.async_save = True
            self._async_start = time.perf_counter()
            self.callback._save_checkpoint(trainer, str(self.workdir / "async" / f"r{rnd}"))
            self._async_call = time.perf_counter() - self._async_start
        elif phase == 1:
            saves = self.callback.async_saves
            assert saves.in_flight
            waited = saves.copy_waited_seconds
            saves.settle(trainer)
            if timed:
                self.call_s.append(self._async_call)
                self.blocking_s.append(self._async_call + waited)
                self.commit_s.append(time.perf_counter() - self._async_start)
                self.next_step_s.append(step_s - waited)
            shutil.rmtree(self.workdir / "async" / f"r{rnd}")
        elif timed:
            self.clean_step_s.append(step_s)


def bench_async(args: argparse.Namespace, workdir: Path) -> None:
    print(
        f"{'state MB':>9} {'sync s':>8} {'async blocking s':>17} {'(call + copy wait)':>19}"
        f" {'until commit s':>15} {'ratio':>7} {'next step s':>12} {'clean step s':>13}"
    )
    for target in args.sizes_mb:
        pl.seed_everything(0, verbose=False)
        width = width_for(target)
        callback = ManifestCheckpoint(dirpath=workdir / "ckpts", every_n_epochs=0, save_last=False)
        timer = AsyncTimer(callback, workdir, args.repeats)
        trainer = _trainer(workdir / "root", [callback, timer], timer.steps)
        model = BigLinear(width)
        trainer.fit(model, datamodule=BigLinearData(width))
        state_mb = 3 * sum(p.numel() * 4 for p in model.parameters()) / 1e6
        sync, blocking = statistics.median(timer.sync_s), statistics.median(timer.blocking_s)
        waits = [b - c for b, c in zip(timer.blocking_s, timer.call_s, strict=True)]
        call, wait = statistics.median(timer.call_s), statistics.median(waits)
        print(
            f"{state_mb:>9.0f} {sync:>8.3f} {blocking:>17.3f} {f'({call:.3f} + {wait:.3f})':>19}"
            f" {statistics.median(timer.commit_s):>15.3f} {blocking / sync:>7.3f}"
            f" {statistics.median(timer.next_step_s):>12.3f} {statistics.median(timer.clean_step_s):>13.3f}\n"
            f"          rounds: sync {fmt(timer.sync_s)} blocking {fmt(timer.blocking_s)}"
            f" next step (less the wait) {fmt(timer.next_step_s)} clean step {fmt(timer.clean_step_s)}"
        )
        del trainer, model, timer, callback
        gc.collect()


# ---------------------------------------------------------------------------------------------- verify / load
def _write_random_file(path: Path, size_mb: float) -> int:
    chunk = torch.randint(0, 256, (64 << 20,), dtype=torch.uint8).numpy().tobytes()
    total = int(size_mb * 1e6)
    with open(path, "wb") as f:
        written = 0
        while written < total:
            piece = chunk[: min(len(chunk), total - written)]
            f.write(piece)
            written += len(piece)
    return total


def bench_verify(args: argparse.Namespace, workdir: Path) -> None:
    """``field ckpt verify`` on one committed checkpoint, as format 2 (BLAKE3) and as format 1 (SHA-256),
    rounds interleaved; plus the bare hash on one thread, so the CLI's own cost shows."""
    import contextlib
    import io
    import json

    from lightning_field.cli.main import main as field_main
    from lightning_field.core.hashing import hash_file
    from lightning_field.core.manifest import MANIFEST_NAME

    torch.set_num_threads(1)
    checkpoint = _committed_checkpoint(workdir, args.size_mb)
    format_1 = workdir / "format-1"
    shutil.copytree(checkpoint, format_1)
    manifest = json.loads((format_1 / MANIFEST_NAME).read_text())
    for name, entry in manifest["files"].items():  # format 1's layout: the same files, SHA-256 hashes
        entry["hash"] = hash_file(format_1 / name, algorithm="sha256")[1]
    manifest.update(format="lightning_field.checkpoint/1", hash_algorithm="sha256")
    (format_1 / MANIFEST_NAME).write_text(json.dumps(manifest))
    size = sum(e["size"] for e in manifest["files"].values())
    labels = ("format 2 (blake3), field ckpt verify", "format 1 (sha256), field ckpt verify",
              "blake3 hash alone, one thread")  # fmt: skip
    timed: dict[str, list[float]] = {label: [] for label in labels}

    def verify(path: Path) -> float:
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            assert field_main(["ckpt", "verify", str(path)]) == 0
        return time.perf_counter() - start

    verify(checkpoint), verify(format_1)  # page-cache both: the figure is the hash, not the disk
    for _ in range(args.repeats):
        timed["format 2 (blake3), field ckpt verify"].append(verify(checkpoint))
        timed["format 1 (sha256), field ckpt verify"].append(verify(format_1))
        start = time.perf_counter()
        for name in manifest["files"]:
            hash_file(checkpoint / name, algorithm="blake3", threads=False)
        timed["blake3 hash alone, one thread"].append(time.perf_counter() - start)
    print(f"verify a {size / 1e6:.0f} MB checkpoint ({os.cpu_count()} cores), {args.repeats} interleaved rounds:")
    for label, runs in timed.items():
        print(f"  {label}: median {size / 1e9 / statistics.median(runs):.2f} GB/s, rounds {fmt(runs)}")


def _committed_checkpoint(workdir: Path, target_mb: float) -> Path:
    pl.seed_everything(0, verbose=False)
    width = width_for(target_mb)
    callback = ManifestCheckpoint(dirpath=workdir / "ckpts", every_n_train_steps=2, save_last=False)
    _trainer(workdir / "root", [callback], 2).fit(BigLinear(width), datamodule=BigLinearData(width))
    assert callback.last_committed is not None
    return Path(callback.last_committed[0])


def bench_load(args: argparse.Namespace, workdir: Path) -> None:
    checkpoint = _committed_checkpoint(workdir, args.size_mb)
    io = ManifestCheckpointIO(inner=None)  # type: ignore[arg-type]  # only manifest directories are loaded
    plain, ours = [], []
    for _ in range(args.repeats + 1):
        gc.collect()
        start = time.perf_counter()
        state = torch.load(checkpoint / SHARED_STATE_FILE, map_location="cpu", weights_only=False)
        plain.append(time.perf_counter() - start)
        del state
        gc.collect()
        start = time.perf_counter()
        state = io.load_checkpoint(checkpoint)
        ours.append(time.perf_counter() - start)
        del state
    plain, ours = plain[1:], ours[1:]  # the first round warms the page cache
    size = sum(e.size for e in read_manifest(checkpoint).files.values())
    ratio = statistics.median(ours) / statistics.median(plain)
    print(
        f"checkpoint {size / 1e6:.0f} MB: torch.load {statistics.median(plain):.3f} s {fmt(plain)},"
        f" ManifestCheckpointIO (verify + load) {statistics.median(ours):.3f} s {fmt(ours)}, ratio {ratio:.2f}"
    )


# ---------------------------------------------------------------------------------------------- resume
class Synthetic(Dataset):
    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.full((16,), float(index % 997) / 997.0)
        return x, x[:1].clone()


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(16, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return nn.functional.mse_loss(self.net(batch[0]), batch[1])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class FirstBatch(Callback):
    def __init__(self) -> None:
        self.at: float | None = None

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.at is None:
            self.at = time.perf_counter()
            trainer.should_stop = True


def _loader(length: int, jump: bool) -> StatefulDataLoader:
    dataset = Synthetic(length)
    generator = torch.Generator().manual_seed(0)
    sampler = JumpRandomSampler(dataset, generator) if jump else RandomSampler(dataset, generator=generator)
    return StatefulDataLoader(dataset, sampler=sampler, batch_size=8)


def _move_position(checkpoint: Path, target: Path, batches: int) -> None:
    """Copy ``checkpoint`` to ``target`` with its loader position set to ``batches`` and commit it anew."""
    shutil.copytree(checkpoint, target)
    for name in (SHARED_STATE_FILE, rank_state_file(0)):
        state = torch.load(target / name, weights_only=False)
        loaders = (
            state["loops"]["fit_loop"]["state_dict"]["combined_loader"]
            if name == SHARED_STATE_FILE
            else state["data_position"]["loader_states"]
        )
        for loader_state in loaders:
            loader_state["_sampler_iter_yielded"] = loader_state["_num_yielded"] = batches
            iter_state = loader_state["_sampler_iter_state"]
            iter_state["samples_yielded"] = batches * 8
            iter_state["sampler_iter_state"]["yielded"] = batches * 8
        (target / name).unlink()
        torch.save(state, target / name)
    manifest = read_manifest(target)
    for name, entry in manifest.files.items():
        entry.size, entry.hash = hash_file(target / name)
    manifest.name = target.name
    manifest.write(target)


def _time_resume(root: Path, checkpoint: Path, length: int, jump: bool) -> float:
    first = FirstBatch()
    callback = ManifestCheckpoint(dirpath=root / "resumed", every_n_train_steps=10**9, save_last=False)
    trainer = _trainer(root / "r", [callback, first], 10**7)
    model = Tiny()
    start = time.perf_counter()
    trainer.fit(model, train_dataloaders=_loader(length, jump), ckpt_path=checkpoint)
    assert first.at is not None
    return first.at - start


def bench_resume(args: argparse.Namespace, workdir: Path) -> None:
    length = 1_000_001 * 8
    print(f"dataset {length:,} samples, 8 per batch; seconds from trainer.fit(ckpt_path) to the first batch")
    for jump in (True, False):
        name = "JumpRandomSampler" if jump else "torchdata RandomSampler"
        root = workdir / name.replace(" ", "_")
        callback = ManifestCheckpoint(dirpath=root / "ckpts", every_n_train_steps=10, save_last=False)
        pl.seed_everything(0, verbose=False)
        _trainer(root, [callback], 10).fit(Tiny(), train_dataloaders=_loader(length, jump))
        at10 = root / "ckpts" / "epoch=0-step=10"
        at1m = root / "ckpts" / "epoch=0-step=1000000"
        _move_position(at10, at1m, 1_000_000)
        times = {10: [], 1_000_000: []}
        for _ in range(args.repeats):
            for position, checkpoint in ((10, at10), (1_000_000, at1m)):
                times[position].append(_time_resume(root, checkpoint, length, jump))
        t10, t1m = statistics.median(times[10]), statistics.median(times[1_000_000])
        print(
            f"  {name:<24} batch 10: {t10:.3f} s {fmt(times[10])}   batch 1,000,000: {t1m:.3f} s"
            f" {fmt(times[1_000_000])}   ratio {t1m / t10:.2f}"
        )


# ---------------------------------------------------------------------------------------------- s3
def bench_s3(args: argparse.Namespace, workdir: Path) -> None:
    import boto3
    import fsspec
    from moto.server import ThreadedMotoServer

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(name, "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        options = {"endpoint_url": f"http://{host}:{port}"}
        boto3.client("s3", **options).create_bucket(Bucket="bench")
        fs = fsspec.filesystem("s3", use_listings_cache=False, **options)
        store = ObjectStore(options)
        numel = int(args.size_mb * 1e6) // 4
        state = {"state_dict": {"w": torch.randn(numel)}}
        local = workdir / "plain.pt"
        torch.save(state, local)
        size = local.stat().st_size
        rows: dict[str, list[float]] = {k: [] for k in ("plain put", "checkpoint save", "plain get", "checkpoint load")}
        for rnd in range(args.repeats):
            start = time.perf_counter()
            fs.put_file(str(local), f"bench/plain/r{rnd}.pt", **store.transfer_options(fs))
            rows["plain put"].append(time.perf_counter() - start)

            final = f"s3://bench/ckpts/r{rnd}"
            start = time.perf_counter()
            outcome = store.write(final, "tok", 0, {SHARED_STATE_FILE: (state, ["model"])})
            manifest = _manifest_for(final, outcome)
            store.publish(final, "tok", manifest)
            rows["checkpoint save"].append(time.perf_counter() - start)

            start = time.perf_counter()
            fs.get_file(f"bench/plain/r{rnd}.pt", str(workdir / "got.pt"), **store.transfer_options(fs))
            rows["plain get"].append(time.perf_counter() - start)
            (workdir / "got.pt").unlink()

            io = ManifestCheckpointIO(inner=None, store_at=lambda location: store)  # type: ignore[arg-type]
            start = time.perf_counter()
            io.load_checkpoint(final)
            rows["checkpoint load"].append(time.perf_counter() - start)
        for key, runs in rows.items():
            median = statistics.median(runs)
            print(f"  {key:<16} {median:.3f} s  {size / 1e6 / median:7.0f} MB/s  {fmt(runs)}")
        print(
            f"  save ÷ put = {statistics.median(rows['checkpoint save']) / statistics.median(rows['plain put']):.2f},"
            f"  load ÷ get = {statistics.median(rows['checkpoint load']) / statistics.median(rows['plain get']):.2f}"
            f"  ({size / 1e6:.0f} MB, part size {store.part_bytes >> 20} MiB, {store.max_concurrency} parts in flight)"
        )
    finally:
        server.stop()


def _manifest_for(final: str, outcome: Any) -> Any:
    from lightning_field.checkpoint.commit import manifest_files
    from lightning_field.core.manifest import Manifest

    return Manifest(
        name=final.rsplit("/", 1)[-1],
        step=0,
        epoch=0,
        world_size=1,
        files=manifest_files([outcome]),
        components={"model": [0]},
        recoverable=False,
        missing=["benchmark state"],
    )


def fmt(runs: list[float]) -> str:
    return "[" + " ".join(f"{r:.3f}" for r in runs) + "]"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    a = sub.add_parser("async")
    a.add_argument("--sizes-mb", type=float, nargs="+", default=[1000, 4000])
    a.add_argument("--repeats", type=int, default=5)
    for name, size in (("verify", 1000), ("load", 1000), ("s3", 256)):
        s = sub.add_parser(name)
        s.add_argument("--size-mb", type=float, default=size)
        s.add_argument("--repeats", type=int, default=5)
    r = sub.add_parser("resume")
    r.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", type=Path, default=None)
    args = p.parse_args()
    _quiet()
    parent = args.dir if args.dir is not None else default_parent()
    workdir = Path(tempfile.mkdtemp(prefix="scale-bench-", dir=parent))
    print(
        f"{args.what}  {time.strftime('%Y-%m-%d %H:%M')}  torch {torch.__version__}  cpus {os.cpu_count()}"
        f"  load average {os.getloadavg()[0]:.2f}"
    )
    try:
        {"async": bench_async, "verify": bench_verify, "load": bench_load, "resume": bench_resume, "s3": bench_s3}[
            args.what
        ](args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        print(f"load average after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
