"""The step snapshots' schedule in a training run (:mod:`~lightning_field.checkpoint.snapshot_interval`
fed by the Trainer's steps), what a run is told about its snapshots, and their release at its end.

At every step's end it times the step (per optimizer step: accumulation batches are one step; the
snapshot taken at the previous step is not counted in it) and says whether this step takes a
snapshot; after each snapshot it records the training thread's wait for it and, when a choice is
due, makes it with every rank (one small all-gather, at the same snapshot on every rank). Each
choice is said in the log and the event log (``snapshot_interval``), and every manifest written
afterwards carries it (``Manifest.snapshot_interval``).

With ``"auto"``, a snapshot that fails (a full ``/dev/shm``, say) turns snapshots off for the rest of
the attempt with one warning that names the cause and the way out, instead of a warning every step:
the default must never cost a run more than it saves. A user's own interval keeps trying, each
failure reported, as before.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

import lightning.pytorch as pl
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from lightning_field.checkpoint.snapshot_interval import AUTO, IntervalChoice, SnapshotInterval
from lightning_field.core.distributed import all_gather_objects
from lightning_field.core.events import EventLog
from lightning_field.core.manifest_records import SnapshotIntervalRecord
from lightning_field.planning.intervals import FailureModel

if TYPE_CHECKING:
    from lightning_field.checkpoint.checkpointer import Checkpointer
    from lightning_field.core.storage import Location

__all__ = ["SnapshotSchedule", "describe_tier", "release_superseded"]


class SnapshotSchedule:
    """When snapshots are due in one attempt, measured and agreed across ranks.

    Args:
        requested: ``"auto"`` or an integer >= 1 (the caller handles ``None``: no schedule).
        budget: the largest share of step time snapshots may take, for ``"auto"``.
        failures: what ``"auto"`` weighs them against.
        persistent_interval: the seconds between the run's persistent checkpoints at a step time
            (None: none due before the end); the persistent tier's side of the cost model.
    """

    def __init__(
        self,
        requested: int | str,
        budget: float,
        failures: FailureModel | None = None,
        persistent_interval: Callable[[pl.Trainer, float], float | None] | None = None,
    ) -> None:
        self.requested = requested
        self.interval = SnapshotInterval(AUTO if requested == AUTO else int(requested), budget, failures)
        self.off_reason: str | None = None
        self.commit_s = 0.0  # how long the newest snapshot took to become resumable (0: in line)
        self._persistent_interval = persistent_interval or (lambda trainer, step_s: None)
        self._timed_step: int | None = None
        self._timed_at = 0.0
        self._excluded = 0.0

    @property
    def every_n_train_steps(self) -> int | None:
        """The interval now (None while off: turned off, or "auto" found they do not pay)."""
        if self.off_reason is not None or self.interval.off:
            return None
        return self.interval.every_n_train_steps

    def assume(self, failures: FailureModel) -> None:
        """The failure model the next ``"auto"`` choice weighs snapshots against (``CheckpointCadence``'s
        posterior MTBF and measured restart, once it has them)."""
        self.interval.failures = failures

    def adopt(self, trainer: pl.Trainer, choice: IntervalChoice, events: EventLog | None) -> None:
        """An ``"auto"`` interval chosen with the persistent one (``CheckpointCadence``), said where it changes."""
        if not self.interval.auto or self.off_reason is not None:
            return
        changed = (choice.every_n_train_steps, choice.off) != (self.interval.every_n_train_steps, self.interval.off)
        self.interval.adopt(choice)
        if changed:
            self._announce(trainer, choice, events)

    def record(self) -> SnapshotIntervalRecord:
        """What every manifest says of the snapshots: asked for, chosen, why (or why they are off)."""
        if self.off_reason is not None:
            return {"requested": self.requested, "every_n_train_steps": None, "reason": self.off_reason}
        return cast(SnapshotIntervalRecord, {"requested": self.requested, **self.interval.choice.record()})

    def step_ended(self, trainer: pl.Trainer, events: EventLog | None) -> None:
        """At each batch's end: the time of each optimizer step, without the snapshot taken in it; while
        "auto" has them off, the choice made again when due (collective: every rank, the same step)."""
        step, now = trainer.global_step, time.perf_counter()
        if self._timed_step is not None and step > self._timed_step:
            steps = step - self._timed_step
            self.interval.step_ended((now - self._timed_at - self._excluded) / steps)
            if self.off_reason is None and self.interval.off and self.interval.choice_due():
                self._choose(trainer, events)
        if self._timed_step is None or step != self._timed_step:
            self._timed_step, self._timed_at, self._excluded = step, now, 0.0

    def due(self, step: int) -> bool:
        return self.off_reason is None and self.interval.due(step)

    def snapshot_taken(self, trainer: pl.Trainer, seconds: float, failure: str | None, events: EventLog | None) -> None:
        """After a snapshot (every rank): its cost counted, a choice made where one is due.

        Collective where a choice is due: every rank reaches it at the same snapshot."""
        self._excluded += seconds
        if failure is not None and self.requested == AUTO:
            # A commit's outcome is the same on every rank (it is broadcast): all turn off together.
            self.off_reason = f"a snapshot failed, so they are off for the rest of this attempt: {failure}"
            rank_zero_warn(
                f"lightning_field: {self.off_reason}. Give them a node-local folder with room for two of them"
                " (SnapshotConfig(directory=...)), or turn them off (SnapshotConfig(every_n_train_steps=None))."
            )
            if events is not None:
                events.emit("snapshot_interval", step=trainer.global_step, payload=dict(self.record()))
            return
        self.interval.snapshot_taken(seconds)
        if self.interval.choice_due():
            self._choose(trainer, events)

    def _choose(self, trainer: pl.Trainer, events: EventLog | None) -> None:
        choice = self.interval.choose(
            lambda figures: all_gather_objects(figures),  # every rank
            lambda step_s: self._persistent_interval(trainer, step_s),
            replicated=trainer.num_nodes > 1,
            commit_s=self.commit_s,
        )
        if choice is not None:
            self._announce(trainer, choice, events)

    def _announce(self, trainer: pl.Trainer, choice: IntervalChoice, events: EventLog | None) -> None:
        every = choice.every_n_train_steps
        what = "snapshots off" if choice.off else f"snapshots every {every} step{'s' if every > 1 else ''}"
        rank_zero_info(f"lightning_field: {what} ({choice.chosen_by}): {choice.reason}.")
        if events is not None:
            events.emit("snapshot_interval", step=trainer.global_step, payload=dict(self.record()))


def describe_tier(
    schedule: SnapshotSchedule, where: Location, size: int, kept: int, host_buffers: int | None, nodes: int
) -> str:
    """The line a run's first snapshot logs: when, where, how large, how committed (``host_buffers``:
    the bytes of host buffers a commit beside training copies into; None: committed in line)."""
    replicas = f", each node's files replicated to the next of {nodes} nodes" if nodes > 1 else ""
    how = (
        "committed in line before the next step, no host copy"
        if host_buffers is None
        else f"committed beside training, {host_buffers / 1e6:.1f} MB of host buffers on rank 0"
    )
    when = f"a snapshot every {schedule.every_n_train_steps} step(s)"
    if schedule.interval.auto:
        when = "snapshots (auto: every step while their cost is measured, then where they pay)"
    return f"lightning_field: {when} into {where} ({size / 1e6:.1f} MB each, {kept} kept, {how}{replicas})"


def release_superseded(snapshots: Checkpointer, persistent: Checkpointer) -> None:
    """After a finished fit: remove this run's snapshot folder where no snapshot in it is newer than
    the newest persistent checkpoint (a rerun resumes from that one, and the memory is given back);
    else keep it, and say why."""
    root = Path(snapshots.dirpath)
    held = [e.manifest.step for e in snapshots.committed() if e.manifest is not None]
    if not held:
        return
    newest = max(held)
    durable = [e.manifest.step for e in persistent.committed() if e.manifest is not None]
    if durable and max(durable) >= newest:
        shutil.rmtree(root, ignore_errors=True)
        return
    rank_zero_info(
        f"lightning_field: kept the snapshots in {root}: step {newest}, the newest resume point, is only there"
        " (a rerun with larger limits resumes from it; InterruptConfig(save_on_train_end=True) also saves it"
        " persistently, and the snapshots are then released at the end)."
    )
