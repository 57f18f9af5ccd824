"""How sibling callbacks (drills, time accounting, cadence, profiling) see ManifestCheckpoint's commits.

Lightning runs checkpoint callbacks after all others, so a save at step *s* has happened by the
start of the next batch, where ``global_step`` is still *s*. That is the one place a sibling can
learn of a commit, on every rank at the same step (the commit itself is collective).
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl

from lightning_field.checkpoint.manifest_checkpoint import ManifestCheckpoint
from lightning_field.compat import lightning as internals
from lightning_field.core.layout import run_directory


def find_manifest_checkpoint(trainer: pl.Trainer) -> ManifestCheckpoint | None:
    return next((c for c in internals.trainer_callbacks(trainer) if isinstance(c, ManifestCheckpoint)), None)


def field_run_dir(trainer: pl.Trainer) -> Path:
    """The run directory every callback of this package writes under, the one ManifestCheckpoint
    keeps its event log in (:func:`~lightning_field.core.layout.run_directory`)."""
    checkpoint = find_manifest_checkpoint(trainer)
    dirpath = checkpoint.dirpath if checkpoint is not None else None
    return run_directory(trainer.default_root_dir, bool(trainer.loggers), dirpath)


def configured_every_n_train_steps(checkpoint: ManifestCheckpoint) -> int | None:
    """The step interval the user gave ``checkpoint`` (``every_n_train_steps``), or None if none was given.

    This is the value from construction, not the live one, which ``CheckpointCadence`` may have
    retuned since. Lightning stores "no step interval" as 0.
    """
    return checkpoint.configured_every_n_train_steps


class CommitWatcher:
    """Reports each commit once, at the start of the batch that follows it."""

    def __init__(self) -> None:
        self._seen: tuple[str, int] | None = None

    def reset(self) -> None:
        self._seen = None

    def new_commit(self, checkpoint: ManifestCheckpoint | None, trainer: pl.Trainer) -> tuple[str, int] | None:
        """(path, step) of a commit made right before this batch and not reported yet, else None."""
        committed = checkpoint.last_committed if checkpoint is not None else None
        if committed is None or committed == self._seen or committed[1] != trainer.global_step:
            return None
        self._seen = committed
        return committed
