"""``StepTracer``: a per-batch record of everything a continuation must reproduce, per rank.

Used by the controlled comparison (every run of the protocol carries one) and by the restore drill.
Each record holds the digests *going into* the batch (data, RNG, weights, optimizer) and the loss
coming out, so the first record where two runs differ names the component that diverged first.
Digests need host copies: this callback belongs in evidence runs, not in production training.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_field.checkpoint.observe import find_manifest_checkpoint
from lightning_field.core.events import read_jsonl
from lightning_field.core.fsio import atomic_write_bytes
from lightning_field.evidence.digest import (
    batch_digest,
    metric_state_digest,
    optimizer_digest,
    rng_state_digest,
    scheduler_digest,
    weights_digest,
)


def trace_file(trace_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(trace_dir) / f"rank-{rank:05d}.jsonl"


def attempt_file(trace_dir: str | os.PathLike[str], attempt: int) -> Path:
    return Path(trace_dir) / f"attempt-{attempt}.json"


def loss_value(outputs: Any) -> float | None:
    if isinstance(outputs, torch.Tensor):
        return float(outputs.detach().float().item())
    if isinstance(outputs, Mapping) and isinstance(outputs.get("loss"), torch.Tensor):
        return float(outputs["loss"].detach().float().item())
    return None


def read_trace(trace_dir: str | os.PathLike[str], rank: int = 0) -> list[dict[str, Any]]:
    """Records of one rank in the order written; a torn last line (SIGKILL mid-write) is dropped."""
    return read_jsonl(trace_file(trace_dir, rank))


def _ends_mid_line(path: Path) -> bool:
    """Whether a file's last byte is not a newline (only the last byte is read)."""
    if not path.is_file() or path.stat().st_size == 0:
        return False
    with open(path, "rb") as f:
        f.seek(-1, 2)
        return f.read(1) != b"\n"


class StepTracer(Callback):
    """Writes ``<trace_dir>/rank-NNNNN.jsonl`` (one line per training batch) and, on rank 0,
    ``attempt-<n>.json`` with the attempt's timeline (setup, restore, first batch) for recovery cost.

    Args:
        trace_dir: where the records go; every attempt of a run appends to the same files.
        attempt: which attempt of the run this process is (1 for the first start).
        state_every_n_steps: how often to digest weights and optimizer state (host copies of the
            whole model). Data, RNG and loss are recorded for every batch.
        launched_unix: when the parent launched this process, to include interpreter start-up.
    """

    def __init__(
        self,
        trace_dir: str | os.PathLike[str],
        attempt: int = 1,
        state_every_n_steps: int = 1,
        launched_unix: float | None = None,
    ) -> None:
        if state_every_n_steps < 1:
            raise ValueError(f"state_every_n_steps must be >= 1, got {state_every_n_steps}")
        self.trace_dir = Path(trace_dir)
        self.attempt = attempt
        self.state_every_n_steps = state_every_n_steps
        self.timeline: dict[str, Any] = {"attempt": attempt, "pid": os.getpid(), "launched_unix": launched_unix}
        self._file: IO[str] | None = None
        self._generators: dict[str, torch.Generator] = {}
        self._pending: dict[str, Any] | None = None
        self._is_zero = True

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        self._is_zero = trainer.is_global_zero
        path = trace_file(self.trace_dir, trainer.global_rank)
        torn = _ends_mid_line(path)
        self._file = open(path, "a", buffering=1)  # noqa: SIM115
        if torn:
            self._file.write("\n")  # a SIGKILL mid-line must not swallow this attempt's first record
        checkpoint = find_manifest_checkpoint(trainer)
        if checkpoint is not None:
            self._generators = dict(checkpoint.generators)
        self.timeline["setup_unix"] = time.time()

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Lightning has restored weights, optimizer and loops by now; the data position is restored
        # when the first batch is fetched, so the gap to the first batch is the data fast-forward.
        self.timeline["train_start_unix"] = time.time()
        self.timeline["resumed_from"] = str(trainer.ckpt_path) if trainer.ckpt_path else None
        self.timeline["start_step"] = trainer.global_step

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        now = time.time()
        record: dict[str, Any] = {
            "attempt": self.attempt,
            "rank": trainer.global_rank,
            "epoch": trainer.current_epoch,
            "batch_idx": batch_idx,
            "step_before": trainer.global_step,
            "t_start": now,
            "batch": batch_digest(batch),
            "rng": rng_state_digest(self._generators),
        }
        if trainer.global_step % self.state_every_n_steps == 0:
            record["weights"] = weights_digest(pl_module)
            record["optimizer"] = optimizer_digest(trainer)
            record["scheduler"] = scheduler_digest(trainer)
            metrics = metric_state_digest(pl_module)
            if metrics is not None:
                record["metrics"] = metrics
        self._pending = record
        if "first_batch_unix" not in self.timeline:
            self.timeline["first_batch_unix"] = now
            self.timeline["first_batch"] = [trainer.current_epoch, batch_idx]
            self._write_timeline()

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        record, self._pending = self._pending, None
        if record is None or self._file is None:
            return
        record["loss"] = loss_value(outputs)
        record["step"] = trainer.global_step
        record["t_end"] = time.time()
        self._file.write(json.dumps(record) + "\n")

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.timeline["end_unix"] = time.time()
        self.timeline["end_step"] = trainer.global_step
        self._write_timeline()

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self.teardown(trainer, pl_module, "fit")  # Lightning calls no teardown after an exception

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _write_timeline(self) -> None:
        if self._is_zero:
            atomic_write_bytes(attempt_file(self.trace_dir, self.attempt), json.dumps(self.timeline).encode())
