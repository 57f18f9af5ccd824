"""A training job run as a real child process by the resume and fault tests.

It trains the demo workload with either ManifestCheckpoint or plain ModelCheckpoint, optionally
kills itself with SIGKILL right after the checkpoint at --kill-after-step is committed, and on
completion writes the final weights and optimizer state for bitwise comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from lightning_field import (
    ManifestCheckpoint,
    ResumeConfig,
    SnapshotConfig,
    StorageConfig,
    TrainingPreempted,
    latest_recoverable,
)
from lightning_field.checkpoint.stores import LocalStore, ObjectStore
from lightning_field.core.distributed import exit_finished_process
from lightning_field.state.rng import capture_rng_state, rng_digest
from lightning_field.workloads.demo import DemoDataModule, DemoRegressor, DemoShardedRegressor


class KillAfterStep(Callback):
    """SIGKILL this rank at the start of the batch after ``step`` (the save of ``step`` is done).

    With ``after``, ranks other than 0 first wait (up to 60 s) for that file from rank 0: Lightning's
    child-process observer SIGKILLs rank 0 within seconds of a dead rank, and rank 0 must record
    what it saw first (a race the loaded suite lost now and then)."""

    def __init__(self, step: int, after: str | None = None) -> None:
        self.step = step
        self.after = after

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            if self.after is not None and not trainer.is_global_zero:
                deadline = time.monotonic() + 60
                while not os.path.exists(self.after) and time.monotonic() < deadline:
                    time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGKILL)


class KillBeforeCommit(ObjectStore):
    """SIGKILL this process after every rank uploaded the save of ``step`` but before its manifest
    PUT: the prefix then holds that save's objects and no commit."""

    def __init__(self, step: int, **options) -> None:
        super().__init__(**options)
        self.step = step

    def publish(self, final, token, manifest) -> None:
        if manifest.step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)
        super().publish(final, token, manifest)


class HoldWriter(LocalStore):
    """The real local commit, except that the background writer of the save of ``step`` stops
    before DCP writes a byte and stays there (until the process is killed)."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.holding = threading.Event()

    def staging(self, final, token):
        if final.name.endswith(f"step={self.step}"):
            self.holding.set()
            threading.Event().wait()
        return super().staging(final, token)


class SeenWhileHeld(Callback):
    """At the batch after the held save (training went on: the step blocked only for the snapshot),
    record on rank 0 what anyone else could see of that save."""

    def __init__(self, store: HoldWriter, ckpts: str, path: str) -> None:
        self.store, self.ckpts, self.path = store, ckpts, path

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step != self.store.step or not trainer.is_global_zero:
            return
        assert self.store.holding.wait(60), "the writer never reached the held save"
        latest = latest_recoverable(self.ckpts)
        seen = {
            "latest": latest.name if latest else None,
            "names": sorted(p for p in os.listdir(self.ckpts) if not p.startswith(".")),
            "last_committed": trainer.checkpoint_callback.last_committed[1],
        }
        with open(self.path + ".tmp", "w") as f:
            json.dump(seen, f)
        os.replace(self.path + ".tmp", self.path)  # whole, for the rank that waits on it


class SignalAtStep(Callback):
    """Send ``signum`` to this process (on ``rank`` only) once ``step`` has been trained."""

    def __init__(self, step: int, signum: int, rank: int) -> None:
        self.step, self.signum, self.rank = step, signum, rank

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            os.kill(os.getpid(), self.signum)


class DumpLoadedState(Callback):
    """Gather the full weights and optimizer state right after the resume's load, before any step:
    what a resharded load put into the model, in the same form as the job's final state."""

    def __init__(self, path: str, sharded: bool) -> None:
        self.path = path
        self.sharded = sharded

    def on_train_start(self, trainer, pl_module) -> None:
        state = _full_state(pl_module, trainer, self.sharded)  # collective when sharded: every rank gathers
        if trainer.is_global_zero:
            torch.save({**state, "step": trainer.global_step}, self.path)


class StepTrace(Callback):
    """Per-step loss, batch digest and RNG digest, so a failing comparison names its first divergence."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._rng_at_start = rng_digest(capture_rng_state())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        record = {
            "rng_start": self._rng_at_start,
            "rank": trainer.global_rank,
            "step": trainer.global_step,
            "loss": float(outputs["loss"]),
            "batch": float(batch[0].double().sum()),
            # Feature differences cancel the per-sample jitter: this identifies the samples alone.
            "order": [round(float(v), 4) for v in (batch[0][:, 0] - batch[0][:, 1])],
            "rng": rng_digest(capture_rng_state()),
        }
        with open(f"{self.path}.rank{trainer.global_rank}", "a") as f:
            f.write(json.dumps(record) + "\n")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--checkpoint", choices=["manifest", "plain"], default="manifest")
    p.add_argument("--max-steps", type=int, default=40)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--kill-after-step", type=int, default=None)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--ckpt-path", default=None, help="resume from exactly this checkpoint")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--size", type=int, default=96)
    p.add_argument("--val-every", type=int, default=None)
    p.add_argument("--stateful", type=int, default=1)
    p.add_argument("--hidden", type=int, default=32, help="width of the hidden layer: the state grows ~17x this")
    p.add_argument("--weights-only", action="store_true")
    p.add_argument("--signal-after-step", type=int, default=None)
    p.add_argument("--signal", default="SIGTERM")
    p.add_argument("--signal-rank", type=int, default=0)
    p.add_argument("--ckpt-url", default=None, help="save to this fsspec URL instead of <root>/checkpoints")
    p.add_argument("--endpoint-url", default=None, help="S3 endpoint for --ckpt-url")
    p.add_argument("--kill-before-commit-step", type=int, default=None)
    p.add_argument("--async-save", action="store_true")
    p.add_argument("--strategy", default=None, help="Lightning strategy name (default: ddp for >1 device, else auto)")
    p.add_argument("--sharded", action="store_true", help="FSDP2 under ModelParallelStrategy (DCP checkpoints)")
    p.add_argument("--tensor-parallel", type=int, default=1,
                   help="with --sharded: ModelParallelStrategy's tensor-parallel size (data split over the rest)")
    p.add_argument("--allow-mismatch", action="append", default=[], help="ResumeConfig(allow_mismatch)")
    p.add_argument("--hold-writer-step", type=int, default=None, help="the async writer of this save never finishes")
    p.add_argument("--dump-loaded", default=None, help="save the full state right after the resume's load here")
    p.add_argument("--no-snapshots", action="store_true", help="snapshots off (default: auto)")
    args = p.parse_args()

    pl.seed_everything(1234, workers=False)
    ckpt_dir = args.ckpt_url or os.path.join(args.root, "checkpoints")
    storage_options = {"endpoint_url": args.endpoint_url} if args.endpoint_url else {}
    # The real commit protocols, with a fault or a hold at one step where the test asks for one.
    store = None
    if args.kill_before_commit_step is not None:
        store = KillBeforeCommit(args.kill_before_commit_step, storage_options=storage_options)
    elif args.hold_writer_step is not None:
        store = HoldWriter(args.hold_writer_step)
    if args.checkpoint == "manifest":
        checkpoint = ManifestCheckpoint(
            dirpath=ckpt_dir,
            every_n_train_steps=args.every,
            save_top_k=-1,
            save_last=True,
            save_weights_only=args.weights_only,
            storage=StorageConfig(options=storage_options, async_save=args.async_save, store=store),
            resume=ResumeConfig(allow_mismatch=args.allow_mismatch),
            snapshots=SnapshotConfig(every_n_train_steps=None if args.no_snapshots else "auto"),
        )
    else:
        checkpoint = ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=args.every, save_top_k=-1, save_last=True)
    callbacks = [checkpoint, StepTrace(args.out + ".trace")]
    if isinstance(store, HoldWriter):
        callbacks.append(SeenWhileHeld(store, ckpt_dir, args.out + ".seen.json"))
    if args.signal_after_step is not None:
        callbacks.append(SignalAtStep(args.signal_after_step, signal.Signals[args.signal], args.signal_rank))
    if args.dump_loaded is not None:
        callbacks.append(DumpLoadedState(args.dump_loaded, args.sharded))
    if args.kill_after_step is not None:
        seen = args.out + ".seen.json" if args.hold_writer_step is not None else None
        callbacks.append(KillAfterStep(args.kill_after_step, after=seen))
    trainer = pl.Trainer(
        default_root_dir=args.root,
        accelerator="cpu",
        devices=args.devices,
        strategy=_strategy(args),
        max_steps=args.max_steps,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=2 if args.val_every else 0,
        val_check_interval=args.val_every,
        check_val_every_n_epoch=None if args.val_every else 1,
        deterministic=True,
    )
    model = (DemoShardedRegressor if args.sharded else DemoRegressor)(hidden=args.hidden)
    data = DemoDataModule(size=args.size, num_workers=args.workers, stateful=bool(args.stateful))
    ckpt_path = args.ckpt_path
    if args.resume:
        # Lightning cannot resolve "last" under a URL (it has no storage options): ask the resolver.
        ckpt_path = latest_recoverable(ckpt_dir, storage_options) if args.ckpt_url else "last"
        print(f"RESUME-FROM {ckpt_path}")
    try:
        trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
    except TrainingPreempted as stop:
        print(f"PREEMPTED-CHECKPOINT {stop.checkpoint} at step {stop.step}")
        exit_finished_process(stop.code)
    state = _full_state(model, trainer, args.sharded)  # collective when sharded: every rank gathers
    if trainer.is_global_zero:
        torch.save({**state, "step": trainer.global_step}, args.out)
    exit_finished_process(0)


def _strategy(args: argparse.Namespace) -> object:
    if args.sharded:
        from lightning.pytorch.strategies import ModelParallelStrategy

        tensor = args.tensor_parallel
        return ModelParallelStrategy(data_parallel_size=args.devices // tensor, tensor_parallel_size=tensor)
    if args.strategy is not None:
        return args.strategy
    return "ddp" if args.devices > 1 else "auto"


def _full_state(model: torch.nn.Module, trainer: pl.Trainer, sharded: bool) -> dict:
    optimizer = trainer.optimizers[0]
    if not sharded:
        return {"state_dict": model.state_dict(), "optimizer": optimizer.state_dict()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights, optim = get_state_dict(model, optimizer, options=options)
    return {"state_dict": weights, "optimizer": optim}


if __name__ == "__main__":
    main()
