"""The commit protocol: how one save goes from every rank's state to an advertised checkpoint.

This is the middle of the three files a save passes through: ``ManifestCheckpoint`` decides *when*
to save and captures a :class:`SaveJob` on the training thread; :func:`commit_save` runs the
protocol below over a :class:`~lightning_field.checkpoint.stores.base.CheckpointWriter`; the store
puts the bytes where they live (``checkpoint/stores/``). The job holds everything the commit needs,
so the same function runs on the training thread (a sync save) or on the writer thread
(``async_save``).

1. Every rank writes its files through the store, hashing while writing, never visible yet.
2. Every rank's receipts (file, size, hash) are gathered.
3. Rank 0 builds the manifest from them and the store publishes it, the one atomic step that makes
   the checkpoint visible (a directory rename on a local disk, the manifest's PUT in an object store).

A crash at any point before step 3 leaves nothing a reader lists, and the next run's setup deletes
what it left. After it, the checkpoint is complete.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_field.checkpoint import sharded
from lightning_field.checkpoint.resolver import committed_checkpoints
from lightning_field.checkpoint.stores.base import (
    CheckpointReader,
    CheckpointWriter,
    RankOutcome,
    describe_error,
    write_rank_files,
)
from lightning_field.checkpoint.stores.local import (
    advertise,
)
from lightning_field.core.distributed import all_gather_objects, broadcast_object
from lightning_field.core.errors import CheckpointError
from lightning_field.core.manifest import (
    RANK_COMPONENTS,
    SHARED_STATE_FILE,
    FileEntry,
    Manifest,
    Provenance,
    SnapshotIntervalRecord,
    StopRecord,
)
from lightning_field.core.signing import keys_from_environment
from lightning_field.core.storage import Location, StorageOptions, basename, parent
from lightning_field.state import provenance

log = logging.getLogger(__name__)


RankReport = tuple[RankOutcome, list[str], list[str], list[dict[str, Any]]]
"""What each rank reports to the commit: its outcome, what it lacks, its data restore, its stream positions."""


class CheckpointSaveError(CheckpointError, RuntimeError):
    """A save failed on some rank; nothing was committed and earlier checkpoints are untouched."""


@dataclass
class SaveJob:
    """One save, captured on the training thread: the commit needs nothing else. Lightning's state
    is captured into one by :func:`~lightning_field.checkpoint.capture.capture_job`; a loop without
    a Trainer has :meth:`~lightning_field.checkpoint.checkpointer.Checkpointer.save` build it from
    named ``Stateful`` objects."""

    final: Location
    store: CheckpointWriter
    rank: int
    is_global_zero: bool
    step: int
    epoch: int
    world_size: int
    files: dict[str, tuple[Any, list[str]]]
    rank_missing: list[str]
    data_restore: list[str]
    stream_positions: list[dict[str, Any]]
    shared_components: list[str]
    shared_missing: list[str]
    start: float
    kind: str = "recovery"
    provenance: Provenance | None = None  # all but the model's, which is hashed at commit time
    blocking_seconds: float = 0.0
    snapshot_error: str | None = None  # this rank's deferred copy saw its state written in place
    shared_file: str = SHARED_STATE_FILE
    shards: dict[str, Any] | None = None  # DTensor state for DCP, under sharding strategies
    model_state: Any = None
    stopped: StopRecord | None = None  # why training stopped at this save (``save_now(stopped=...)``)
    snapshot_interval: SnapshotIntervalRecord | None = None  # the run's step snapshots then
    advertised_suffix: str | None = None  # name state.pt <name><suffix> beside the folder (stores.local.advertise)

    @property
    def shared_components_all(self) -> list[str]:
        """Shared components plus those DCP holds on every rank."""
        if self.shards is None:
            return self.shared_components
        with_optimizer = any(key.startswith("optimizer_") for key in self.shards)
        return [*self.shared_components, "model", *(["optimizer"] if with_optimizer else [])]


def commit_save(job: SaveJob, group: Any = None) -> str | None:
    """The commit protocol for one prepared save; the error that stopped it, else None.

    Collective over ``group`` (the default group when None): every rank runs it for the same save,
    and every rank returns the same answer, so all of them raise, or none does.
    """
    store, final = job.store, job.final
    unprepared = None
    if job.is_global_zero:
        try:
            store.prepare(final)
        except Exception as err:  # broadcast below: the other ranks must not wait in a collective rank 0 left
            unprepared = f"rank 0 (prepare): {describe_error(err)}"
    # The broadcast also orders every rank's writes after rank 0's preparation.
    token, unprepared = broadcast_object((uuid.uuid4().hex[:8], unprepared), group=group)
    if unprepared is not None:
        return unprepared
    outcome, referenced = write_rank_part(job, token, group)
    gathered: list[RankReport] = all_gather_objects(
        (outcome, job.rank_missing, job.data_restore, job.stream_positions), group=group
    )
    error = written_error([o for o, _, _, _ in gathered], referenced)
    if error is None and job.is_global_zero:
        try:
            manifest = build_manifest(job, gathered)
            manifest.sign(keys_from_environment())
            store.publish(final, token, manifest)
        except Exception as err:
            error = f"rank 0 (commit): {describe_error(err)}"
        else:
            if job.advertised_suffix and isinstance(final, Path):
                advertise_committed(final, job.advertised_suffix, getattr(store, "durable", True))
    if job.is_global_zero and error is not None:
        store.discard(final, token)
    return broadcast_object(error, group=group)


def advertise_committed(final: Path, suffix: str, durable: bool) -> None:
    """After the commit, the advertised ``<name>.ckpt``; its failure loses nothing (the checkpoint is
    committed and resumes from its folder), so it is said, not raised."""
    try:
        advertise(final, suffix, durable)
    except OSError as err:
        log.warning(
            "lightning_field: checkpoint %s is committed, but its Lightning-format file could not be named %s%s"
            " (%s); load it with trainer.fit(ckpt_path=%r) or from %s/state.pt",
            final,
            final.name,
            suffix,
            describe_error(err),
            str(final),
            final,
        )


def write_rank_part(job: SaveJob, token: str, group: Any) -> tuple[RankOutcome, list[str]]:
    """Step 1 of the commit on this rank: its files written into the save's hidden place, with, on
    rank 0 of a sharded save, every file DCP's metadata references. Collective over ``group`` for a
    sharded save (DCP plans across the ranks); a rank whose capture failed writes nothing."""
    if job.shards is not None:
        return _write_sharded(job, token, group)
    if job.snapshot_error is not None:  # this rank has nothing to write; the exchange still runs
        return RankOutcome(job.rank, [], job.snapshot_error), []
    return job.store.write(job.final, token, job.rank, job.files), []


def written_error(outcomes: list[RankOutcome], referenced: list[str]) -> str | None:
    """Why the gathered writes cannot be committed (some rank failed, or a file DCP's metadata
    references was reported by no rank), else None."""
    failed = [o for o in outcomes if o.error]
    if failed:
        return "; ".join(f"rank {o.rank}: {o.error}" for o in failed)
    if referenced and (unreported := sharded.unreported_shards(referenced, outcomes)):  # a DCP save's
        return f"rank 0 (commit): DCP metadata references files no rank reported: {', '.join(unreported)}"
    return None


def _write_sharded(job: SaveJob, token: str, group: Any) -> tuple[RankOutcome, list[str]]:
    """DCP's shards and this rank's files, with the files DCP's metadata references (rank 0).
    Locally both go straight (durably) into the hidden directory the rename publishes; under a
    URL into a private staging directory, uploaded only when everything in it was written."""
    assert job.shards is not None
    store = job.store
    with contextlib.ExitStack() as stack:
        error, staging = job.snapshot_error, None
        if error is None:
            try:
                staging = stack.enter_context(store.staging(job.final, token))
                staging.mkdir(parents=True, exist_ok=True)
            except Exception as err:  # gathered below: never raised on one rank alone
                error = f"staging the distributed checkpoint failed: {describe_error(err)}"
        # DCP's save is collective: where any rank cannot enter it (its capture or its staging failed),
        # none does (one that did would wait for the others forever); the failed rank's outcome says why.
        if any(all_gather_objects(error is not None, group=group)):
            return RankOutcome(job.rank, [], error), []
        assert staging is not None
        # Durable where the files are the checkpoint itself, unless the store is not (a node-local snapshot's).
        durable = store.writes_in_place and getattr(store, "durable", True)
        outcome, referenced = sharded.write_shards(staging, job.rank, job.shards, group, durable=durable)
        written = write_rank_files(staging, job.rank, job.files, durable=durable)
        outcome.receipts += written.receipts
        outcome.error = outcome.error or written.error
        if outcome.error is None:
            outcome.error = store.upload(job.final, staging, [receipt.file for receipt in outcome.receipts])
        return outcome, referenced


def build_manifest(job: SaveJob, gathered: list[RankReport]) -> Manifest:
    """The manifest of a save every rank wrote, complete at once (nothing is added after it is
    built): which rank holds which component, as each rank's receipts say its files hold them;
    what is missing on any rank (so whether it is recoverable); each rank's data position; and the
    provenance a resume is checked against."""
    outcomes = [o for o, _, _, _ in gathered]
    components: dict[str, list[int]] = {c: [0] for c in job.shared_components}
    for component in RANK_COMPONENTS:
        declared, holders = False, []
        for outcome, lacking, _, _ in gathered:
            if any(component in receipt.contents for receipt in outcome.receipts):
                declared = True
                # A rank that could not capture it (its data position, say) does not hold it.
                if not any(m.startswith(component) for m in lacking):
                    holders.append(outcome.rank)
        if declared:
            components[component] = sorted(holders)
    missing = sorted({m for _, ranks, _, _ in gathered for m in ranks})
    missing += job.shared_missing
    if job.shards is not None:
        holders = sorted({r.rank for o in outcomes for r in o.receipts if r.file.endswith(".distcp")})
        components.update({c: holders for c in sharded.DCP_COMPONENTS if c in job.shared_components_all})
    return Manifest(
        name=basename(job.final),
        step=job.step,
        epoch=job.epoch,
        world_size=job.world_size,
        files=manifest_files(outcomes),
        components=components,
        recoverable=not missing,
        missing=missing,
        kind=job.kind,
        provenance={**(job.provenance or Provenance()), "model": provenance.model_provenance(job.model_state)},
        save_seconds=time.perf_counter() - job.start,
        data_restore={str(o.rank): restore for o, _, restore, _ in gathered},
        stream_positions={str(o.rank): positions for o, _, _, positions in gathered if positions},
        stopped=job.stopped,
        snapshot_interval=job.snapshot_interval,
    )


def not_saved_message(
    final: Location, error: str, storage_options: StorageOptions | None = None, store: CheckpointReader | None = None
) -> str:
    """What a failed save tells the user: the cause, and that the previous checkpoint is intact."""
    committed = committed_checkpoints(parent(final), storage_options, store)
    kept = f"the previous checkpoint ({committed[0].path}) is intact" if committed else "no earlier one exists"
    return f"Checkpoint {final} was not saved: {error}. Nothing was committed; {kept}."


def manifest_files(outcomes: list[RankOutcome]) -> dict[str, FileEntry]:
    return {r.file: FileEntry(r.size, r.hash, r.rank, r.contents) for o in outcomes for r in o.receipts}
