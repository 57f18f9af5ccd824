"""What the checkpoint callback's policies and its snapshot tier may use of it: small protocols.

``ManifestCheckpoint`` builds its policies (the preemption, exception and stop-point saves, the
no-progress guard) and its snapshot tier, each with its own options, and hands each the callback as
its owner for the saves and the event log they share. Typed against
the callback itself, every one of them would import it, and it imports them: a circle, type-only
but a circle (issue 45). Each is typed against the few members it uses instead, named here, so the
dependency runs one way and a reader sees at a glance how much of the callback a policy touches.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

import lightning.pytorch as pl

from lightning_field.checkpoint.checkpointer import Checkpointer
from lightning_field.checkpoint.commit import SaveJob
from lightning_field.checkpoint.stores import CheckpointStore, CheckpointWriter
from lightning_field.core.events import EventLog
from lightning_field.core.manifest import StopRecord
from lightning_field.core.storage import Location

__all__ = ["EventSource", "ExceptionSaveOwner", "SavePoint", "SnapshotOwner"]


class EventSource(Protocol):
    """Whatever writes the run's event log (the no-progress guard reads and extends it)."""

    @property
    def events(self) -> EventLog | None: ...


class SavePoint(EventSource, Protocol):
    """A callback that can save the step reached, now (the preemption save)."""

    @property
    def last_saved_step(self) -> int: ...

    def save_now(
        self,
        trainer: pl.Trainer,
        name: str | None = "manual-{step}",
        *,
        blocking: bool = False,
        unless_saved: bool = False,
        as_resume_point: bool = False,
        stopped: StopRecord | None = None,
    ) -> str | None: ...


class ExceptionSaveOwner(SavePoint, Protocol):
    """The exception and Ctrl-C saves: whether and how the user asked for them (ModelCheckpoint's own
    arguments), and the newest commit."""

    save_on_exception: bool
    last_committed: tuple[str, int] | None
    filename: str | None


class SnapshotOwner(EventSource, Protocol):
    """The snapshot tier: the persistent tier beside it, the capture it shares, where to store."""

    dirpath: Any  # ModelCheckpoint's: a path or URL, None before setup
    trust_pickles: bool

    @property
    def state_key(self) -> str: ...

    @property
    def last_saved_step(self) -> int: ...

    @property
    def checkpointer(self) -> Checkpointer: ...

    def store_at(self, location: str | os.PathLike[str]) -> CheckpointStore: ...

    def capture_save(
        self,
        trainer: pl.Trainer,
        final: Location,
        start: float,
        store: CheckpointWriter | None = None,
        checkpoint: dict[str, Any] | None = None,
    ) -> SaveJob: ...
