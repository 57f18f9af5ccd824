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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_field.checkpoint.stores import LocalStore, RankOutcome
from lightning_field.core.fsio import atomic_write_bytes

KILL_MODES = ("step", "save")


def kill_job(record_path: Path, step: int, mode: str) -> None:
    """Record when and where the kill happens (durably: it is the start of the recovery clock), then
    SIGKILL this process group."""
    record = {"step": step, "mode": mode, "wall_time": time.time(), "pid": os.getpid()}
    record_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(record_path, json.dumps(record).encode())
    print(
        f"[lightning_field] fault drill: SIGKILL of this job at step {step} ({mode}); recorded in {record_path}",
        file=sys.stderr,
        flush=True,
    )
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


class KillDuringSave(LocalStore):
    """A local store whose save of ``step`` SIGKILLs the job between writing rank files and committing.

    The kill is a store, not a patch of the commit's internals, so it lands wherever the commit
    writes rank files (a plain save's :meth:`write`, a sharded save's :meth:`upload` after DCP's
    shards): on the coordinator, once its own files are on disk, while other ranks may still be
    writing theirs. ``get_trainer`` returns the trainer once it exists; ``kill`` is
    :func:`kill_job` (a test passes one that raises instead).
    """

    def __init__(
        self,
        get_trainer: Callable[[], pl.Trainer | None],
        step: int,
        record_path: str | os.PathLike[str],
        kill: Callable[[Path, int, str], None] = kill_job,
    ) -> None:
        self.get_trainer = get_trainer
        self.step = step
        self.record_path = Path(record_path)
        self.kill = kill

    def _kill_if_due(self) -> None:
        trainer = self.get_trainer()
        if trainer is not None and trainer.global_step == self.step and trainer.is_global_zero:
            self.kill(self.record_path, self.step, "save")

    @override
    def write(self, final: Path, token: str, rank: int, files: dict[str, tuple[Any, list[str]]]) -> RankOutcome:
        outcome = super().write(final, token, rank, files)
        self._kill_if_due()
        return outcome

    @override
    def upload(self, final: Path, staging: Path, names: list[str]) -> str | None:
        error = super().upload(final, staging, names)
        self._kill_if_due()
        return error
