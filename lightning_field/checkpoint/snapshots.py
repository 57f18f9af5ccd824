"""Step snapshots: ``ManifestCheckpoint(snapshots=SnapshotConfig(every_n_train_steps=N))``.

A snapshot is a checkpoint like any other (the same state, manifest, hashes and atomic commit), taken every ``N`` steps
where a step checkpoint would be, and committed into a node-local directory that outlives the process but not the
machine (``/dev/shm`` by default). A process that dies between persistent checkpoints (SIGKILL, an OOM kill, a crash in
a kernel) resumes from the newest snapshot that verifies, redoing at most the steps since it; the persistent
checkpoints keep their cadence and cover the loss of the machine.

The newest :data:`KEEP` snapshots are kept, so the host memory they take is bounded; the log says
how much at the first one. The snapshot directory is the user's own: created private, and refused
when another user owns it or can write it, since a snapshot planted there would be resumed.

Over several machines, each snapshot is also replicated to a partner node as part of its commit,
and a resume agrees on one step over every node's copies before anything loads
(:mod:`~lightning_field.checkpoint.replica`): a lost machine costs the steps since the newest
snapshot, not since the newest persistent checkpoint.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import lightning.pytorch as pl
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lightning_field.checkpoint import resume_last
from lightning_field.checkpoint.async_controller import AsyncSaves
from lightning_field.checkpoint.checkpointer import Checkpointer
from lightning_field.checkpoint.commit import SaveJob, commit_save
from lightning_field.checkpoint.owner import SnapshotOwner
from lightning_field.checkpoint.replica import NodeTopology, commit_replicated, node_key, shared_between_nodes
from lightning_field.checkpoint.replica_resume import agree_across_nodes
from lightning_field.checkpoint.resolver import Resolution
from lightning_field.checkpoint.snapshot_dirs import private_folder_problem, snapshot_dir_for
from lightning_field.checkpoint.snapshot_interval import DEFAULT_BUDGET, IntervalChoice, check_every_n_train_steps
from lightning_field.checkpoint.snapshot_lineage import join_run, prepared_for_run, same_run
from lightning_field.checkpoint.snapshot_schedule import SnapshotSchedule, describe_tier, release_superseded
from lightning_field.checkpoint.stores import CheckpointStore, read_manifest
from lightning_field.checkpoint.stores.snapshot import SnapshotStore
from lightning_field.compat import lightning as internals
from lightning_field.core.distributed import all_gather_objects, global_rank, new_host_group
from lightning_field.core.manifest_records import SnapshotIntervalRecord
from lightning_field.core.storage import Location, as_location
from lightning_field.planning.intervals import FailureModel

__all__ = ["KEEP", "SnapshotCosts", "StepSnapshots", "snapshot_dir_for"]

log = logging.getLogger(__name__)

KEEP = 2
"""Snapshots kept: the newest, and the one before it in case the newest fails verification."""


@dataclass(frozen=True)
class SnapshotCosts:
    """What the newest committed snapshot cost: training's wait, and its commit behind training."""

    step: int
    blocking_s: float  # the training thread's capture and its wait for the deferred copy
    commit_s: float  # the background commit, from submission to the manifest's rename


class StepSnapshots:
    """The snapshot tier of one :class:`~lightning_field.checkpoint.manifest_checkpoint.ManifestCheckpoint`.

    Raises:
        ValueError: ``every_n_train_steps`` is below 1; at setup, over several nodes: nodes with
            different numbers of ranks, or one directory shared by two nodes.
        PermissionError: at setup, a snapshot directory another user owns or could write.
    """

    def __init__(
        self,
        owner: SnapshotOwner,
        every_n_train_steps: int | str | None,
        directory: str | os.PathLike[str] | None,
        in_line: bool | None = None,
        budget: float = DEFAULT_BUDGET,
        failures: FailureModel | None = None,
        persistent_interval: Callable[[pl.Trainer, float], float | None] | None = None,
    ) -> None:
        check_every_n_train_steps(every_n_train_steps, budget)
        self.requested = every_n_train_steps
        self.schedule = (
            SnapshotSchedule(every_n_train_steps, budget, failures, persistent_interval)
            if every_n_train_steps is not None
            else None
        )
        self.directory = directory
        self.commits_in_line = in_line
        self._owner = owner
        self._checkpointer: Checkpointer | None = None
        self._saves: AsyncSaves | None = None
        self._last_step = -1
        self._reported = False
        self._kept: list[Location] | None = None  # this tier's snapshots, oldest first (each node's leader)
        self._topology: NodeTopology | None = None
        self._resume_group: Any = None
        self.last_costs: SnapshotCosts | None = None
        self.last_committed: tuple[str, int] | None = None  # (path, step) of this attempt's newest snapshot
        self.resumed_tier: str | None = None
        """Where the last multi-node resume came from: "snapshot" (every node held it) or "replica"
        (some node received files from another node's copy); None otherwise."""

    @property
    def root(self) -> Path | None:
        """This run's snapshot directory on this machine (None before setup, or when off)."""
        return Path(self._checkpointer.dirpath) if self._checkpointer is not None else None

    def holds(self, checkpoint: str | os.PathLike[str]) -> bool:
        """Whether ``checkpoint`` is one of this tier's snapshots."""
        root, location = self.root, as_location(checkpoint)
        return root is not None and isinstance(location, Path) and location.resolve().parent == root.resolve()

    def tier_of(self, checkpoint: str | os.PathLike[str]) -> str:
        """Which tier a resume loaded ``checkpoint`` from: "persistent", "snapshot" or "replica"."""
        if not self.holds(checkpoint):
            return "persistent"
        return self.resumed_tier or "snapshot"

    def spans_nodes(self, trainer: pl.Trainer) -> bool:
        """Whether this run's snapshots are replicated between machines (and its resume agreed on)."""
        return self.enabled and trainer.num_nodes > 1

    @property
    def enabled(self) -> bool:
        """Whether this run has a snapshot tier (asked for; ``"auto"`` may still turn it off mid-run)."""
        return self.schedule is not None

    @property
    def every_n_train_steps(self) -> int | None:
        """The interval snapshots are taken at now: the user's, or the one ``"auto"`` chose; None: off."""
        return self.schedule.every_n_train_steps if self.schedule is not None else None

    def assume(self, failures: FailureModel) -> None:
        """The failure model ``"auto"`` weighs the snapshots against from now on (see :class:`SnapshotSchedule`)."""
        if self.schedule is not None:
            self.schedule.assume(failures)

    def adopt(self, trainer: pl.Trainer, choice: IntervalChoice) -> None:
        """An ``"auto"`` interval chosen together with the persistent one (every rank, the same step)."""
        if self.schedule is not None:
            self.schedule.adopt(trainer, choice, self._owner.events)

    def interval_choice(self) -> IntervalChoice | None:
        """The snapshots' interval choice in force (None: no snapshot tier)."""
        return self.schedule.interval.choice if self.schedule is not None else None

    @property
    def failures(self) -> FailureModel | None:
        """The failure model the snapshots are weighed against (None: no snapshot tier)."""
        return self.schedule.interval.failures if self.schedule is not None else None

    def interval_record(self) -> SnapshotIntervalRecord | None:
        """What each manifest says of this run's snapshots (asked for, chosen, why), or None when off."""
        return self.schedule.record() if self.schedule is not None else None

    def _checkpointer_for(self, checkpoint_dir: Location, trainer: pl.Trainer) -> Checkpointer:
        node = trainer.node_rank if trainer.num_nodes > 1 else None  # nodes on one host keep apart
        root = snapshot_dir_for(checkpoint_dir, self.directory, node)
        if self._checkpointer is None or self._checkpointer.dirpath != root:
            # No fsync, raw tensor files, the retired snapshot's files reused (stores/snapshot.py).
            store = cast(CheckpointStore, SnapshotStore())  # it serves the Paths it is given
            self._checkpointer = Checkpointer(root, store=store, trust_pickles=self._owner.trust_pickles)
        return self._checkpointer

    # ------------------------------------------------------------------ resume
    def latest(self, checkpoint_dir: Location, trainer: pl.Trainer) -> Resolution | None:
        """The newest snapshot of ``checkpoint_dir``'s run that is recoverable and verifies, with its verification."""
        if not self.enabled:
            return None
        log_skips = trainer.is_global_zero
        checkpointer = self._checkpointer_for(checkpoint_dir, trainer)
        root = Path(checkpointer.dirpath)
        if not root.is_dir() or not same_run(root, self._owner.store_at(checkpoint_dir), checkpoint_dir, log_skips):
            return None
        found = checkpointer.latest_recoverable(log_skips=log_skips)
        if found is None:
            return None
        return Resolution(str(found), tier="snapshot", verification=checkpointer.verified(found))

    def resolve_last(
        self,
        trainer: pl.Trainer,
        where: Location,
        allow_inexact: bool,
        store: CheckpointStore,
    ) -> Resolution:
        """``ckpt_path="last"`` over the tiers: the newest step that verifies, a persistent checkpoint
        on a tie (:func:`~lightning_field.checkpoint.resume_last.resolve_last`), agreed on across
        the nodes of a multi-node run (:meth:`resolve_across_nodes`)."""
        if not self.spans_nodes(trainer):
            snapshot = self.latest(where, trainer)
            return resume_last.resolve_last(where, allow_inexact, store, snapshot)
        persistent: list[Resolution] = []  # the persistent tier's resolution, where the nodes asked for it

        def resolve_persistent() -> str | None:
            persistent.append(resume_last.resolve_last(where, allow_inexact, store))
            return persistent[-1].path

        found = self.resolve_across_nodes(trainer, where, resolve_persistent)
        if found is not None and self.holds(found):  # a snapshot is recoverable: this continuation is exact
            verification = self._checkpointer.verified(found) if self._checkpointer is not None else None
            return Resolution(found, tier=self.resumed_tier or "snapshot", verification=verification)
        return persistent[-1] if persistent else Resolution(found)

    def resolve_across_nodes(
        self, trainer: pl.Trainer, checkpoint_dir: Location, persistent: Callable[[], str | None]
    ) -> str | None:
        """``ckpt_path="last"`` in a run over several machines: the newest step that every node can
        load, over the node-local snapshots, their replicas on the partner nodes and the persistent
        checkpoints (``persistent()`` resolves those, on every rank); this node's copy of it, made
        complete first where the node lacks files (:mod:`~lightning_field.checkpoint.replica`).

        Collective, before Lightning's own process group exists: it is started here as Lightning
        would start it (``compat.lightning.start_process_group_early``).

        Raises:
            NoRecoverableCheckpointError: from ``persistent()``, when no snapshot is newer either.
            RuntimeError: the ranks found different persistent checkpoints.
        """
        internals.start_process_group_early(trainer)
        if self._resume_group is None:
            self._resume_group = new_host_group()  # every rank: creating a group is collective
        topology = self._gather_topology(trainer, self._resume_group)
        checkpointer = self._checkpointer_for(checkpoint_dir, trainer)
        root = Path(checkpointer.dirpath)
        found, tier = agree_across_nodes(
            root,
            checkpointer.store_at(root),
            topology,
            self._resume_group,
            persistent,
            self._owner.store_at,
            prepare=lambda root: prepared_for_run(root, self._owner.store_at(checkpoint_dir), checkpoint_dir),
            log_skips=trainer.is_global_zero,
            same_run=lambda root: same_run(root, self._owner.store_at(checkpoint_dir), checkpoint_dir, True),
        )
        self.resumed_tier = tier
        return found

    def _gather_topology(self, trainer: pl.Trainer, group: Any = None) -> NodeTopology:
        """Which ranks share this run's node-local directories (collective)."""
        members = all_gather_objects((node_key(trainer.node_rank), global_rank()), group=group)
        self._topology = NodeTopology.from_members(members, global_rank())
        return self._topology

    # ------------------------------------------------------------------ saving
    def setup(self, trainer: pl.Trainer) -> None:
        if not self.enabled:
            return
        topology = self._gather_topology(trainer)
        dirpath = self._owner.dirpath
        assert dirpath is not None  # ModelCheckpoint.setup resolved it
        checkpointer = self._checkpointer_for(dirpath, trainer)
        root = Path(checkpointer.dirpath)
        problems = [p for p in all_gather_objects(private_folder_problem(root)) if p]  # all learn of any problem
        if problems:
            raise PermissionError(problems[0])
        try:
            join_run(root, self._owner.store_at(dirpath), as_location(dirpath), topology.is_leader)
        except OSError as err:  # every rank alike: unbound snapshots could be resumed by a later, other run
            log.warning("lightning_field: step snapshots are off for this run: %s. Persistent checkpoints go on.", err)
            self.schedule = None
            return
        shared, one_host = shared_between_nodes(root, topology.node)
        if shared is not None:
            raise ValueError(shared)
        if one_host is not None and trainer.is_global_zero:
            log.warning("lightning_field: %s", one_host)
        if self._saves is None:
            self._saves = AsyncSaves(
                "warn",  # a snapshot that fails is reported; the persistent checkpoints carry on
                advertise=self._advertise,
                remove=lambda trainer, path: None,  # snapshots are pruned by count, at each commit
                not_saved_message=checkpointer.not_saved_message,
                events=lambda: self._owner.events,
                agreement_step=lambda trainer: True,
                commit=self._commit,
            )
        self._saves.setup(trainer, f"{self._owner.state_key}/snapshots")
        if topology.is_leader:  # each node's own directory
            for leftover in checkpointer.clean_leftovers():
                log.info("Removed leftover of an interrupted snapshot: %s", leftover)

    def after_step(self, trainer: pl.Trainer) -> None:
        """At a step's end, where a step checkpoint would be taken (every rank, the same steps)."""
        saves, schedule = self._saves, self.schedule
        if saves is None or self._checkpointer is None or schedule is None:
            return
        saves.check(trainer)
        step = trainer.global_step
        schedule.step_ended(trainer, self._owner.events)
        if not schedule.due(step) or step == self._last_step or _not_training(trainer):
            return
        if step == self._owner.last_saved_step:
            return  # a persistent checkpoint holds this very step
        start = time.perf_counter()
        failures = saves.save_failures
        saves.settle(trainer)  # the previous snapshot commits before this one reuses its buffers
        self._retire_oldest(trainer)
        final = Path(self._checkpointer.dirpath) / f"epoch={trainer.current_epoch}-step={step}"
        job = self._owner.capture_save(trainer, final, start, store=self._checkpointer.store)  # the owner's capture
        if self.in_line(trainer):
            saves.commit_in_line(trainer, job, start, "Step snapshot")  # a failure is reported; training goes on
        else:
            saves.submit(trainer, job, start)
        self._last_step = step
        failure = saves.last_save_error if saves.save_failures > failures else None
        schedule.snapshot_taken(trainer, time.perf_counter() - start, failure, self._owner.events)

    def _retire_oldest(self, trainer: pl.Trainer) -> None:
        """Before a snapshot is written: with :data:`KEEP` held, the oldest is un-published and its
        files are overwritten by the new one (:meth:`SnapshotStore.recycle`), on each node's leader,
        before the commit's first collective orders every rank's writes after it."""
        leads = self._topology.is_leader if self._topology is not None else trainer.is_global_zero
        if not leads or not self._kept or len(self._kept) < KEEP or self._checkpointer is None:
            return
        store = self._checkpointer.store
        retired = self._kept.pop(0)
        if isinstance(store, SnapshotStore) and isinstance(retired, Path):
            store.recycle(retired)
        else:
            store.remove(retired)

    def in_line(self, trainer: pl.Trainer) -> bool:
        """Whether snapshots commit on the training thread, before the next step, instead of beside it
        (``SnapshotConfig.in_line``; by default where training computes on the CPU).

        There training already keeps the cores busy: a writer thread beside it takes a core from
        torch's intra-op threads, whose parallel regions then wait for the one descheduled, so it
        costs about twice its own CPU time; committed in line, a snapshot needs no host copy either
        (nothing writes the state meanwhile), and the step it holds is never lost. On an accelerator
        the host is idle while the device steps, and the commit runs beside it
        (``benchmarks/RESULTS.md`` §14 has both on the main job)."""
        if self.commits_in_line is not None:
            return self.commits_in_line
        return trainer.strategy.root_device.type == "cpu"

    def _commit(self, job: SaveJob, group: Any) -> str | None:
        topology = self._topology
        if topology is not None and topology.multi_node:
            return commit_replicated(job, topology, group)
        return commit_save(job, group)

    def _advertise(self, trainer: pl.Trainer, job: SaveJob, blocking: float, commit_s: float | None = None) -> None:
        self.last_costs = SnapshotCosts(job.step, blocking, commit_s or 0.0)
        if self.schedule is not None:  # what the next choice prices: resumable at once when in line
            self.schedule.commit_s = 0.0 if self.in_line(trainer) else commit_s or 0.0
        self.last_committed = (str(job.final), job.step)
        events = self._owner.events
        if events is not None:
            payload = {"path": str(job.final), "blocking_s": blocking, "commit_s": commit_s}
            payload["in_line"] = self.in_line(trainer)  # its commit_s is inside blocking_s, not after it
            events.emit("snapshot_committed", step=job.step, payload=payload, durable=False)
        leads = self._topology.is_leader if self._topology is not None else trainer.is_global_zero
        if not leads or self._checkpointer is None:
            return
        if self._kept is None:
            # The first commit of this attempt: the snapshots earlier attempts left are listed once
            # (the resume has loaded its own by now); later saves recycle the oldest they know.
            self._kept = [e.path for e in reversed(self._checkpointer.committed()) if e.path != job.final]
        if job.final in self._kept:
            self._kept.remove(job.final)
        self._kept.append(job.final)
        while len(self._kept) > KEEP:
            self._checkpointer.store.remove(self._kept.pop(0))
        if not self._reported and trainer.is_global_zero:
            self._reported = True
            manifest = read_manifest(job.final, store=self._checkpointer.store_at(job.final))
            size = sum(entry.size for entry in manifest.files.values())
            buffers = self._saves.snapshot.nbytes if self._saves and self._saves.snapshot else 0
            nodes = len(self._topology.nodes) if self._topology is not None else 1
            assert self.schedule is not None
            rank_zero_info(
                describe_tier(
                    self.schedule,
                    self._checkpointer.dirpath,
                    size,
                    KEEP,
                    None if self.in_line(trainer) else buffers,
                    nodes,
                )
            )

    # ------------------------------------------------------------------ the end
    def close(self, trainer: pl.Trainer, finished: bool = False) -> None:
        """Wait for the last snapshot; after a ``finished`` fit, release the memory of snapshots that
        a persistent checkpoint of the same or a later step supersedes (each node's leader, its own)."""
        if self._saves is not None:
            self._saves.close(trainer)
        leads = self._topology.is_leader if self._topology is not None else trainer.is_global_zero
        if finished and leads and self._checkpointer is not None and self._owner.dirpath is not None:
            release_superseded(self._checkpointer, self._owner.checkpointer)

    def interrupt(self, trainer: pl.Trainer) -> None:
        if self._saves is not None:
            self._saves.interrupt(trainer)

    def wait_for_copy(self) -> None:
        """Block until the pending snapshot has copied what training writes next."""
        if self._saves is not None:
            self._saves.wait_for_snapshot_copy()


def _not_training(trainer: pl.Trainer) -> bool:
    # fast_dev_run is set by the Trainer's argument parsing (absent from its annotations).
    fast_dev_run = bool(getattr(trainer, "fast_dev_run", False))
    return fast_dev_run or trainer.state.fn != TrainerFn.FITTING or trainer.sanity_checking
