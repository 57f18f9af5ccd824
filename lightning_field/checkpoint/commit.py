"""The commit protocol: how one save goes from every rank's state to an advertised checkpoint.

This is the middle of the three files a save passes through: ``ManifestCheckpoint`` decides *when*
to save and captures a :class:`SaveJob` on the training thread; :func:`commit_save` runs the
protocol below over a :class:`~lightning_field.checkpoint.store.CheckpointStore`; the bytes reach
the disk through ``core/fsio.py``. The job holds everything the commit needs, so the same function
runs on the training thread (a sync save) or on the writer thread (``async_save``).

1. Every rank writes its files into a hidden temporary directory, hashing while writing, and fsyncs.
2. Every rank's receipts (file, size, hash) are gathered.
3. Rank 0 writes ``manifest.json`` (temporary file, fsync, rename), renames the directory into
   place, fsyncs the parent, and replaces the ``LAST`` pointer.

A crash at any point before step 3's directory rename leaves only a hidden ``.tmp-*`` directory,
which no resolver considers and the next run deletes. After it, the checkpoint is complete.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from lightning_field.checkpoint import sharded
from lightning_field.checkpoint.components import missing_components, present_components
from lightning_field.checkpoint.resolver import LAST_POINTER, TEMP_PREFIXES, committed_checkpoints
from lightning_field.checkpoint.store import CheckpointStore, RankOutcome, Receipt, describe_error
from lightning_field.compat.torch import save_without_crc32
from lightning_field.core.distributed import all_gather_objects, broadcast_object
from lightning_field.core.fsio import (
    HashingWriter,
    atomic_write_bytes,
    exchange_or_replace_dir,
    fsync_dir,
    remove_dir_unseen,
)
from lightning_field.core.manifest import SHARED_STATE_FILE, FileEntry, Manifest, rank_state_file
from lightning_field.core.storage import Location, StorageOptions, basename, parent
from lightning_field.state import provenance

__all__ = [
    "CheckpointSaveError",
    "LocalStore",
    "RankOutcome",
    "SaveJob",
    "commit_save",
    "not_saved_message",
    "write_last_pointer",
]


class CheckpointSaveError(RuntimeError):
    """A save failed on some rank; nothing was committed and earlier checkpoints are untouched."""


@dataclass
class SaveJob:
    """One save, captured on the training thread: the commit needs nothing else."""

    final: Location
    store: CheckpointStore
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
    provenance: dict[str, Any] | None = None  # all but the model's, which is hashed at commit time
    blocking_seconds: float = 0.0
    snapshot_error: str | None = None  # this rank's deferred copy saw its state written in place
    shared_file: str = SHARED_STATE_FILE
    shards: dict[str, Any] | None = None  # DTensor state for DCP, under sharding strategies
    model_state: Any = None

    @classmethod
    def capture(
        cls,
        trainer: pl.Trainer,
        final: Location,
        start: float,
        *,
        store: CheckpointStore,
        checkpoint: dict[str, Any],
        rank_state: dict[str, Any],
        rank_missing: list[str],
        weights_only: bool,
        provenance: dict[str, Any],
    ) -> SaveJob:
        """This rank's part of a save, from Lightning's dumped ``checkpoint`` and its own
        ``rank_state``: every rank writes its rank file; rank 0 also the shared state, whose
        components it lists; under a sharding strategy the model and optimizer go through DCP."""
        rank = trainer.global_rank
        files: dict[str, tuple[Any, list[str]]] = {rank_state_file(rank): (rank_state, ["rng", "data_position"])}
        shared_components: list[str] = []
        shared_missing: list[str] = []
        if trainer.is_global_zero:
            shared_components = present_components(checkpoint, trainer)
            shared_missing = missing_components(checkpoint, trainer, shared_components, weights_only)
        shards = None
        shared_file = SHARED_STATE_FILE
        if sharded.is_sharded(trainer.strategy):
            # Every rank holds its own shards of the model and optimizer: they go through DCP.
            shards = sharded.split_state(checkpoint)
            shared_file = sharded.SHARDED_SHARED_FILE
            shared_components = [c for c in shared_components if c not in sharded.DCP_COMPONENTS]
        if trainer.is_global_zero:
            files[shared_file] = (checkpoint, shared_components)
        return cls(
            final=final,
            store=store,
            rank=rank,
            is_global_zero=trainer.is_global_zero,
            step=trainer.global_step,
            epoch=trainer.current_epoch,
            world_size=trainer.world_size,
            files=files,
            rank_missing=rank_missing,
            data_restore=list(rank_state["data_position"]["restore"]),
            stream_positions=list(rank_state["data_position"].get("stream_positions", [])),
            shared_components=shared_components,
            shared_missing=shared_missing,
            start=start,
            kind="export" if weights_only else "recovery",
            provenance=provenance,
            shared_file=shared_file,
            shards=shards,
            model_state=shards["state_dict"] if shards is not None else checkpoint.get("state_dict", {}),
        )

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
    if job.is_global_zero:
        store.prepare(final)
    # The broadcast also orders every rank's writes after rank 0's preparation.
    token = broadcast_object(uuid.uuid4().hex[:8], group=group)
    referenced: list[str] = []
    if job.snapshot_error is not None:  # this rank has nothing to write; the exchange still runs
        outcome = RankOutcome(job.rank, [], job.snapshot_error)
    elif job.shards is not None:
        outcome, referenced = _write_sharded(job, token, group)
    else:
        outcome = store.write(final, token, job.rank, job.files)
    gathered: list[tuple[RankOutcome, list[str], list[str], list[dict[str, Any]]]] = all_gather_objects(
        (outcome, job.rank_missing, job.data_restore, job.stream_positions), group=group
    )
    outcomes = [o for o, _, _, _ in gathered]
    missing_all = [m for _, m, _, _ in gathered]
    restore_all = {str(o.rank): r for o, _, r, _ in gathered}
    positions_all = {str(o.rank): p for o, _, _, p in gathered if p}
    error = None
    failed = [o for o in outcomes if o.error]
    if failed:
        error = "; ".join(f"rank {o.rank}: {o.error}" for o in failed)
    elif unreported := sharded.unreported_shards(referenced, outcomes):
        error = f"rank 0 (commit): DCP metadata references files no rank reported: {', '.join(unreported)}"
    elif job.is_global_zero:
        try:
            manifest = build_manifest(job, outcomes, missing_all)
            manifest.data_restore = restore_all
            manifest.stream_positions = positions_all
            manifest.save_seconds = time.perf_counter() - job.start
            store.publish(final, token, manifest)
        except Exception as err:
            error = f"rank 0 (commit): {describe_error(err)}"
    if job.is_global_zero and error is not None:
        store.discard(final, token)
    return broadcast_object(error, group=group)


def _write_sharded(job: SaveJob, token: str, group: Any) -> tuple[RankOutcome, list[str]]:
    """DCP's shards and this rank's files, with the files DCP's metadata references (rank 0).
    Locally both go straight (durably) into the hidden directory the rename publishes; under a
    URL into a private staging directory, uploaded only when everything in it was written."""
    assert job.shards is not None
    store = job.store
    with store.staging(job.final, token) as staging:
        durable = store.writes_in_place
        outcome, referenced = sharded.write_shards(staging, job.rank, job.shards, group, durable=durable)
        written = write_rank_files(staging, job.rank, job.files, durable=durable)
        outcome.receipts += written.receipts
        outcome.error = outcome.error or written.error
        if outcome.error is None:
            outcome.error = store.upload(job.final, staging, [receipt.file for receipt in outcome.receipts])
        return outcome, referenced


def build_manifest(job: SaveJob, outcomes: list[RankOutcome], missing_all: list[list[str]]) -> Manifest:
    """The manifest of a save every rank wrote: which rank holds which component, what is missing
    on any rank (so whether it is recoverable), and the provenance a resume is checked against."""
    components: dict[str, list[int]] = {c: [0] for c in job.shared_components}
    components["rng"] = sorted(o.rank for o in outcomes)
    components["data_position"] = sorted(
        o.rank
        for o, missing in zip(outcomes, missing_all, strict=True)
        if not any(m.startswith("data_position") for m in missing)
    )
    missing = sorted({m for ranks in missing_all for m in ranks})
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
        provenance={**(job.provenance or {}), "model": provenance.model_provenance(job.model_state)},
    )


def not_saved_message(final: Location, error: str, storage_options: StorageOptions | None = None) -> str:
    """What a failed save tells the user: the cause, and that the previous checkpoint is intact."""
    committed = committed_checkpoints(parent(final), storage_options)
    kept = f"the previous checkpoint ({committed[0].path}) is intact" if committed else "no earlier one exists"
    return f"Checkpoint {final} was not saved: {error}. Nothing was committed; {kept}."


# ---------------------------------------------------------------- the protocol on a local disk


def save_durably(obj: Any, path: Path, durable: bool = True) -> tuple[int, str]:
    """``torch.save`` straight to disk through a hashing writer; returns (size, hash).

    ``durable=False`` skips the fsync, for local staging copies whose durability is the upload's job.
    """
    writer = HashingWriter(path)
    try:
        save_without_crc32(obj, writer)  # the manifest's hash covers every byte instead
        return writer.finish(sync=durable)
    except BaseException:
        writer.close()
        raise


def write_rank_files(
    tmp: Path, rank: int, files: dict[str, tuple[Any, list[str]]], durable: bool = True
) -> RankOutcome:
    """Write this rank's files into ``tmp``; errors are returned, not raised, so every rank still
    reaches the receipt exchange and nobody waits forever on a rank that failed."""
    start = time.perf_counter()
    receipts = []
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        for name, (obj, contents) in files.items():
            size, digest = save_durably(obj, tmp / name, durable)
            receipts.append(Receipt(name, size, digest, rank, contents))
        if durable:
            fsync_dir(tmp)
    except Exception as err:
        return RankOutcome(rank, receipts, describe_error(err), time.perf_counter() - start)
    return RankOutcome(rank, receipts, None, time.perf_counter() - start)




def temp_dir_for(dirpath: Path, name: str, token: str) -> Path:
    return dirpath / f".tmp-{name}-{token}"


def manifest_files(outcomes: list[RankOutcome]) -> dict[str, FileEntry]:
    return {r.file: FileEntry(r.size, r.hash, r.rank, r.contents) for o in outcomes for r in o.receipts}


def write_last_pointer(dirpath: str | os.PathLike[str], checkpoint: str | os.PathLike[str]) -> None:
    """Point ``LAST`` at ``checkpoint`` by atomic replace: readers (``resolver.read_last_pointer``)
    never see it missing. Written last in :func:`publish`, after the directory rename."""
    atomic_write_bytes(Path(dirpath) / LAST_POINTER, (Path(checkpoint).name + "\n").encode())


def publish(tmp: Path, final: Path, manifest: Manifest) -> None:
    """Rank 0's step 3: manifest last, then the directory rename that makes it visible, then LAST."""
    manifest.write(tmp)
    fsync_dir(tmp)
    replaced = exchange_or_replace_dir(tmp, final)
    fsync_dir(final.parent)
    write_last_pointer(final.parent, final)
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)


def discard(tmp: Path) -> None:
    shutil.rmtree(tmp, ignore_errors=True)


def clean_leftovers(dirpath: Path) -> list[Path]:
    """Delete the hidden directories interrupted saves and removals left behind."""
    removed: list[Path] = []
    if not dirpath.is_dir():
        return removed
    for child in dirpath.iterdir():
        if child.is_dir() and child.name.startswith(TEMP_PREFIXES):
            shutil.rmtree(child, ignore_errors=True)
            removed.append(child)
    return removed


class LocalStore:
    """The commit protocol on a POSIX filesystem: hidden temporary directory, fsync, atomic rename.
    A :class:`~lightning_field.checkpoint.store.CheckpointStore`."""

    writes_in_place = True

    def prepare(self, final: Path) -> None:
        """Nothing to do: the rename in :meth:`publish` swaps out any checkpoint of the same name."""

    def hidden_dir(self, final: Path, token: str) -> Path:
        """The hidden directory this save's files are written into before the rename publishes it."""
        return temp_dir_for(final.parent, final.name, token)

    @contextlib.contextmanager
    def staging(self, final: Path, token: str) -> Iterator[Path]:
        """The hidden directory itself: what is written there is what the rename publishes."""
        yield self.hidden_dir(final, token)

    def upload(self, final: Path, staging: Path, names: list[str]) -> str | None:
        """Nothing to upload: the files are already in place."""
        return None

    def write(self, final: Path, token: str, rank: int, files: dict[str, tuple[Any, list[str]]]) -> RankOutcome:
        return write_rank_files(self.hidden_dir(final, token), rank, files)

    def publish(self, final: Path, token: str, manifest: Manifest) -> None:
        publish(temp_dir_for(final.parent, final.name, token), final, manifest)

    def discard(self, final: Path, token: str) -> None:
        discard(temp_dir_for(final.parent, final.name, token))

    def remove(self, final: Path) -> None:
        remove_dir_unseen(final)

    def clean_leftovers(self, dirpath: Path) -> list[Path]:
        return clean_leftovers(dirpath)
