"""Real interruptions for the controlled comparison: SIGKILL of the whole job at a chosen moment.

The job kills its own process group, so every rank and DataLoader worker dies at once, as on a node
failure; nothing gets to flush or clean up. Two moments are offered: right after a training step
(before any save of that step), and in the middle of a save (this rank's files written and
fsynced, the manifest not yet committed), the worst moment for a checkpoint protocol.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_field.checkpoint import commit
from lightning_field.core.fsio import atomic_write_bytes

KILL_MODES = ("step", "save")


def kill_job(record_path: Path, step: int, mode: str) -> None:
    """Record when and where the kill happens (durably: it is the start of the recovery clock), then
    SIGKILL this process group."""
    record = {"step": step, "mode": mode, "wall_time": time.time(), "pid": os.getpid()}
    record_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(record_path, json.dumps(record).encode())
    print(f"[lightning_field] fault drill: SIGKILL of this job at step {step} ({mode}); recorded in {record_path}",
          file=sys.stderr, flush=True)  # fmt: skip
    os.killpg(os.getpgrp(), signal.SIGKILL)


class KillAtStep(Callback):
    """SIGKILL the job once training step ``step`` is done, before that step is checkpointed.

    Lightning runs checkpoint callbacks after all others, so a save due at ``step`` never starts:
    the work since the previous commit is lost, as it would be on a real failure.
    """

    def __init__(self, step: int, record_path: str | os.PathLike[str]) -> None:
        self.step = step
        self.record_path = Path(record_path)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self.step and trainer.is_global_zero:
            kill_job(self.record_path, self.step, "step")


@contextmanager
def kill_during_save(
    get_trainer: Callable[[], pl.Trainer | None], step: int, record_path: str | os.PathLike[str]
) -> Iterator[None]:
    """While active, the save of ``step`` SIGKILLs the job between writing rank files and committing.

    ``get_trainer`` returns the trainer once it exists. Rank 0 kills once its own files are on
    disk; other ranks may still be writing theirs.
    """
    original = commit.write_rank_files

    def write_then_kill(*args: Any, **kwargs: Any) -> Any:
        outcome = original(*args, **kwargs)
        trainer = get_trainer()
        if trainer is not None and trainer.global_step == step and trainer.is_global_zero:
            kill_job(Path(record_path), step, "save")
        return outcome

    commit.write_rank_files = write_then_kill
    try:
        yield
    finally:
        commit.write_rank_files = original
