"""Step snapshots: ``ManifestCheckpoint(snapshot_every_n_train_steps=N)``.

A snapshot is a checkpoint like any other (the same state, manifest, hashes and atomic commit),
taken every ``N`` steps at the point a step checkpoint would be, and committed by a background
thread into a node-local directory that outlives the process but not the machine (``/dev/shm`` by
default). A process that dies between persistent checkpoints (SIGKILL, an OOM kill, a crash in a
kernel) resumes from the newest snapshot that verifies, so it redoes at most the steps since that
snapshot; the persistent checkpoints keep their cadence and cover the loss of the machine.

The newest :data:`KEEP` snapshots are kept, so the host memory they take is bounded; the log says
how much at the first one. The snapshot directory is the user's own: created private, and refused
when another user owns it or can write it, since a snapshot planted there would be resumed.
"""

from __future__ import annotations

import logging
import os
import stat
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import lightning.pytorch as pl
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lightning_field.checkpoint.async_controller import AsyncSaves
from lightning_field.checkpoint.checkpointer import Checkpointer
from lightning_field.checkpoint.commit import SaveJob
from lightning_field.checkpoint.stores import CheckpointStore, LocalStore, read_manifest
from lightning_field.checkpoint.verify import VerifyReport
from lightning_field.core.distributed import all_gather_objects
from lightning_field.core.hashing import IDENTITY_ALGORITHM, new_hasher
from lightning_field.core.storage import Location, as_location, basename

if TYPE_CHECKING:  # the owner imports this module
    from lightning_field.checkpoint.manifest_checkpoint import ManifestCheckpoint

__all__ = ["KEEP", "SnapshotCosts", "StepSnapshots", "snapshot_dir_for"]

log = logging.getLogger(__name__)

KEEP = 2
"""Snapshots kept: the newest, and the one before it in case the newest fails verification."""

DEFAULT_PARENT = Path("/dev/shm")


def snapshot_dir_for(checkpoint_dir: str | os.PathLike[str], parent: str | os.PathLike[str] | None = None) -> Path:
    """Where the snapshots of the checkpoints under ``checkpoint_dir`` live: one private folder per
    user under ``parent`` (``/dev/shm`` where it is writable, else the temporary directory), then
    one per checkpoint directory, so that a restarted run on the same machine finds its own."""
    if parent is None:
        parent = DEFAULT_PARENT if os.access(DEFAULT_PARENT, os.W_OK | os.X_OK) else Path(tempfile.gettempdir())
    location = as_location(checkpoint_dir)
    identity = str(location.resolve()) if isinstance(location, Path) else location
    key = new_hasher(IDENTITY_ALGORITHM)
    key.update(identity.encode())
    return Path(parent) / f"lightning_field-snapshots-{os.getuid()}" / f"{basename(location)}-{key.hexdigest()[:16]}"


def _make_private(root: Path) -> None:
    """Create ``root`` (and its per-user parent) private; refuse one another user could write."""
    root.parent.parent.mkdir(parents=True, exist_ok=True)
    for folder in (root.parent, root):
        folder.mkdir(mode=0o700, exist_ok=True)
        info = folder.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
            raise PermissionError(
                f"snapshot directory {folder} is not a private directory of this user (owner uid {info.st_uid},"
                f" mode {stat.filemode(info.st_mode)}): a snapshot planted there would be resumed. Remove it, or"
                " pass ManifestCheckpoint(snapshot_dir=...) a directory of your own."
            )


@dataclass(frozen=True)
class SnapshotCosts:
    """What the newest committed snapshot cost: training's wait, and its commit behind training."""

    step: int
    blocking_s: float  # the training thread's capture and its wait for the deferred copy
    commit_s: float  # the background commit, from submission to the manifest's rename


class StepSnapshots:
    """The snapshot tier of one :class:`~lightning_field.checkpoint.manifest_checkpoint.ManifestCheckpoint`.

    Raises:
        ValueError: ``every_n_train_steps`` is below 1; at setup, a run over several nodes (every
            rank's file must reach the one node-local directory).
    """

    def __init__(
        self, owner: ManifestCheckpoint, every_n_train_steps: int | None, directory: str | os.PathLike[str] | None
    ) -> None:
        if every_n_train_steps is not None and every_n_train_steps < 1:
            raise ValueError(f"snapshot_every_n_train_steps must be >= 1 (or None: off), got {every_n_train_steps}")
        self.every_n_train_steps = every_n_train_steps
        self.directory = directory
        self._owner = owner
        self._checkpointer: Checkpointer | None = None
        self._saves: AsyncSaves | None = None
        self._last_step = -1
        self._reported = False
        self._kept: list[Location] = []  # this tier's snapshots, oldest first (rank 0)
        self.last_costs: SnapshotCosts | None = None

    @property
    def root(self) -> Path | None:
        """This run's snapshot directory on this machine (None before setup, or when off)."""
        return Path(self._checkpointer.dirpath) if self._checkpointer is not None else None

    def holds(self, checkpoint: str | os.PathLike[str]) -> bool:
        """Whether ``checkpoint`` is one of this tier's snapshots (a resume reports which tier it loaded)."""
        root, location = self.root, as_location(checkpoint)
        return root is not None and isinstance(location, Path) and location.resolve().parent == root.resolve()

    @property
    def enabled(self) -> bool:
        return self.every_n_train_steps is not None

    def _checkpointer_for(self, checkpoint_dir: Location) -> Checkpointer:
        root = snapshot_dir_for(checkpoint_dir, self.directory)
        if self._checkpointer is None or self._checkpointer.dirpath != root:
            # No fsync: a snapshot need only outlive the process, and the page cache does.
            store = cast(CheckpointStore, LocalStore(durable=False))  # it serves the Paths it is given
            self._checkpointer = Checkpointer(root, store=store, trust_pickles=self._owner.trust_pickles)
        return self._checkpointer

    # ------------------------------------------------------------------ resume
    def latest(self, checkpoint_dir: Location, log_skips: bool) -> tuple[Location, int] | None:
        """The newest snapshot of ``checkpoint_dir``'s run that is recoverable and verifies, with its step."""
        if not self.enabled:
            return None
        checkpointer = self._checkpointer_for(checkpoint_dir)
        if not Path(checkpointer.dirpath).is_dir():
            return None
        found = checkpointer.latest_recoverable(log_skips=log_skips)
        if found is None:
            return None
        report = checkpointer.verified(found)
        assert report is not None and report.manifest is not None  # it was just verified
        return found, report.manifest.step

    def verified_here_or(self, other: Checkpointer) -> Callable[[Location], VerifyReport | None]:
        """The verification a resume's load hands on: ``other``'s (the persistent tier's) or this tier's."""

        def verified(path: Location) -> VerifyReport | None:
            found = other.verified(path)
            return found if found is not None or self._checkpointer is None else self._checkpointer.verified(path)

        return verified

    # ------------------------------------------------------------------ saving
    def setup(self, trainer: pl.Trainer) -> None:
        if not self.enabled:
            return
        if trainer.num_nodes > 1:
            raise ValueError(
                f"snapshot_every_n_train_steps needs every rank on one machine; this run has {trainer.num_nodes}"
                " nodes, whose ranks would write their snapshot files into directories on different machines."
                " Use persistent checkpoints (every_n_train_steps) for multi-node runs."
            )
        assert self._owner.dirpath is not None  # ModelCheckpoint.setup resolved it
        checkpointer = self._checkpointer_for(self._owner.dirpath)
        root = Path(checkpointer.dirpath)
        problems = [p for p in all_gather_objects(_prepared(root)) if p]  # every rank: all learn of any problem
        if problems:
            raise PermissionError(problems[0])
        if self._saves is None:
            self._saves = AsyncSaves(
                "warn",  # a snapshot that fails is reported; the persistent checkpoints carry on
                advertise=self._advertise,
                remove=lambda trainer, path: None,  # snapshots are pruned by count, at each commit
                not_saved_message=checkpointer.not_saved_message,
                events=lambda: self._owner.events,
                agreement_step=lambda trainer: True,
            )
        self._saves.setup(trainer, f"{self._owner.state_key}/snapshots")
        if trainer.is_global_zero:
            for leftover in checkpointer.clean_leftovers():
                log.info("Removed leftover of an interrupted snapshot: %s", leftover)

    def after_step(self, trainer: pl.Trainer) -> None:
        """At a step's end, where a step checkpoint would be taken (every rank, the same steps)."""
        saves = self._saves
        if saves is None or self._checkpointer is None:
            return
        saves.check(trainer)
        step = trainer.global_step
        assert self.every_n_train_steps is not None
        if step == 0 or step % self.every_n_train_steps or step == self._last_step or _not_training(trainer):
            return
        if step == self._owner.last_saved_step:
            return  # a persistent checkpoint holds this very step
        start = time.perf_counter()
        saves.settle(trainer)  # the previous snapshot commits before this one reuses its buffers
        final = Path(self._checkpointer.dirpath) / f"epoch={trainer.current_epoch}-step={step}"
        job = self._owner._prepare_save(trainer, final, start, store=self._checkpointer.store)  # the owner's capture
        saves.submit(trainer, job, start)
        self._last_step = step

    def _advertise(self, trainer: pl.Trainer, job: SaveJob, blocking: float, commit_s: float | None = None) -> None:
        self.last_costs = SnapshotCosts(job.step, blocking, commit_s or 0.0)
        events = self._owner.events
        if events is not None:
            payload = {"path": str(job.final), "blocking_s": blocking, "commit_s": commit_s}
            events.emit("snapshot_committed", step=job.step, payload=payload)
        if not trainer.is_global_zero or self._checkpointer is None:
            return
        if not self._kept:
            # The first commit of this attempt: the snapshots earlier attempts left are listed once
            # (the resume has loaded its own by now); later commits retire the oldest they know.
            self._kept = [e.path for e in reversed(self._checkpointer.committed()) if e.path != job.final]
        if job.final in self._kept:
            self._kept.remove(job.final)
        self._kept.append(job.final)
        while len(self._kept) > KEEP:
            self._checkpointer.store.remove(self._kept.pop(0))
        if not self._reported:
            self._reported = True
            manifest = read_manifest(job.final, store=self._checkpointer.store_at(job.final))
            size = sum(entry.size for entry in manifest.files.values())
            buffers = self._saves.snapshot.nbytes if self._saves and self._saves.snapshot else 0
            every, where = self.every_n_train_steps, self._checkpointer.dirpath
            rank_zero_info(
                f"lightning_field: a snapshot every {every} step(s) into {where} ({size / 1e6:.1f} MB each,"
                f" {KEEP} kept, {buffers / 1e6:.1f} MB of host buffers on rank 0)"
            )

    # ------------------------------------------------------------------ the end
    def close(self, trainer: pl.Trainer) -> None:
        if self._saves is not None:
            self._saves.close(trainer)

    def interrupt(self, trainer: pl.Trainer) -> None:
        if self._saves is not None:
            self._saves.interrupt(trainer)

    def wait_for_copy(self) -> None:
        """Block until the pending snapshot has copied what training writes next."""
        if self._saves is not None:
            self._saves.wait_for_snapshot_copy()


def _prepared(root: Path) -> str | None:
    try:
        _make_private(root)
    except OSError as err:
        return str(err)
    return None


def _not_training(trainer: pl.Trainer) -> bool:
    # fast_dev_run is set by the Trainer's argument parsing (absent from its annotations).
    fast_dev_run = bool(getattr(trainer, "fast_dev_run", False))
    return fast_dev_run or trainer.state.fn != TrainerFn.FITTING or trainer.sanity_checking
