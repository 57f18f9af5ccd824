"""``Checkpointer``: the checkpoint core as a plain object, with no Lightning in it.

One ``Checkpointer`` owns one ``dirpath`` and the store chosen for it once: it commits saves
(:func:`~lightning_field.checkpoint.commit.commit_save`), lists, resolves and verifies what is
there, applies retention (never removing the only recoverable checkpoint), and remembers the
verifications it made so that the load it hands them to hashes nothing twice.
:class:`~lightning_field.checkpoint.manifest_checkpoint.ManifestCheckpoint` is the adapter that
turns Lightning's hooks into these calls; :meth:`Checkpointer.save` and :meth:`Checkpointer.restore`
are the same core for a loop without a Trainer, over named ``Stateful`` objects as torchtitan keeps them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from lightning_field.checkpoint.commit import CheckpointSaveError, SaveJob, commit_save, not_saved_message
from lightning_field.checkpoint.load import FIELD_KEY, load_from_store, load_on_every_rank
from lightning_field.checkpoint.resolver import CheckpointEntry, committed_checkpoints, latest_recoverable
from lightning_field.checkpoint.stores import (
    DEFAULT_CONCURRENCY,
    DEFAULT_PART_BYTES,
    CheckpointStore,
    CheckpointWriter,
    ObjectStore,
    store_for,
)
from lightning_field.checkpoint.stores.base import describe_error
from lightning_field.checkpoint.verify import VerifyReport, verify_checkpoint
from lightning_field.core.distributed import all_gather_objects, global_rank, world_size
from lightning_field.core.errors import CheckpointError
from lightning_field.core.manifest import SHARED_STATE_FILE, Manifest, Provenance, rank_state_file
from lightning_field.core.storage import Location, as_location, join, parent, same_location
from lightning_field.state.rng import capture_rng_state, restore_rng_state

__all__ = ["Checkpointer", "NothingToRestoreError", "Restored", "Stateful"]

DRILL_MISMATCH = "mismatch"  # a restore drill's outcome (evidence.drill_runs, which sits above this package)


@runtime_checkable
class Stateful(Protocol):
    """What :meth:`Checkpointer.save` takes as a component: a module, optimizer, scheduler, a
    ``StatefulDataLoader`` or anything else with these two methods."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state_dict: Any) -> Any: ...


class NothingToRestoreError(CheckpointError, FileNotFoundError):
    """:meth:`Checkpointer.restore` found no recoverable checkpoint to restore."""


@dataclass(frozen=True)
class Restored:
    """What :meth:`Checkpointer.restore` put back: from which checkpoint, at which step."""

    path: Location
    manifest: Manifest
    unrestored_rng: list[str]

    @property
    def step(self) -> int:
        return self.manifest.step


class Checkpointer:
    """Store, commit, retention, resolution and verification of the checkpoints under ``dirpath``.

    Args:
        dirpath: the directory or fsspec URL the checkpoints live under (settable until the first
            save: ``ModelCheckpoint`` resolves its own at setup).
        store: a :class:`~lightning_field.checkpoint.stores.CheckpointStore` of your own; else a
            ``LocalStore`` for a path and an ``ObjectStore`` for a URL, chosen once.
        storage_options: fsspec options for a URL ``dirpath`` (an endpoint, credentials).
        upload_part_bytes, upload_concurrency: multipart part size and parts in flight (object stores).
        keep: how many committed checkpoints :meth:`save` keeps, newest first (None: all). The only
            recoverable one is never removed. ``ManifestCheckpoint`` leaves this None and applies
            ModelCheckpoint's own ``save_top_k`` through :meth:`remove`.
        trust_pickles: :meth:`restore` unpickles fully instead of ``weights_only``.

    Raises:
        TypeError: ``store`` does not implement the writing half of ``CheckpointStore``.
        ValueError: ``keep`` is below 1.

    Example::

        from lightning_field import Checkpointer

        checkpointer = Checkpointer("ckpts", keep=2)
        states = {"model": model, "optimizer": optimizer}
        restored = checkpointer.restore(states, missing_ok=True)  # None on the first attempt
        for step in range(restored.step if restored else 0, 1000):
            train_one_step()
            if (step + 1) % 100 == 0:
                checkpointer.save(states, step=step + 1)
    """

    def __init__(
        self,
        dirpath: str | os.PathLike[str] | None = None,
        *,
        store: CheckpointStore | None = None,
        storage_options: Mapping[str, Any] | None = None,
        upload_part_bytes: int = DEFAULT_PART_BYTES,
        upload_concurrency: int = DEFAULT_CONCURRENCY,
        keep: int | None = None,
        trust_pickles: bool = False,
    ) -> None:
        if store is not None and not isinstance(store, CheckpointWriter):
            raise TypeError(
                "store must implement lightning_field.checkpoint.stores.CheckpointStore (at least its writing half,"
                f" CheckpointWriter: prepare, write, staging, upload, publish, ...); got {type(store).__name__}"
            )
        if keep is not None and keep < 1:
            raise ValueError(f"keep must be >= 1 (or None to keep every checkpoint), got {keep}")
        self.dirpath: Any = dirpath
        self.storage_options = dict(storage_options or {})
        self.keep = keep
        self.trust_pickles = trust_pickles
        self._object_store = ObjectStore(self.storage_options, upload_part_bytes, upload_concurrency)
        self._given_store = store
        # Verifications this process made, by checkpoint: handed to the load of the one resolved.
        self._verified: dict[Location, VerifyReport] = {}

    # ------------------------------------------------------------------ where checkpoints live
    @property
    def store(self) -> CheckpointWriter:
        """How saves under ``dirpath`` commit: the store given, else the default for its kind."""
        return self._given_store or self.store_at(self._root())

    def store_at(self, location: str | os.PathLike[str]) -> CheckpointStore:
        """What reads (and removes) the checkpoints at ``location``: the store given, where it reads,
        else the default one for its kind, with this checkpointer's storage options."""
        return store_for(location, self.storage_options, self._given_store, self._object_store)

    def _root(self) -> Location:
        if self.dirpath is None:
            raise ValueError("Checkpointer has no dirpath yet")
        return as_location(self.dirpath)

    # ------------------------------------------------------------------ saving
    def commit(self, job: SaveJob) -> None:
        """Run the commit protocol for one prepared save (collective: every rank, same job).

        Raises:
            CheckpointSaveError: the save failed on some rank; nothing was committed.
        """
        error = commit_save(job)
        if error is not None:
            raise CheckpointSaveError(self.not_saved_message(job.final, error))

    def not_saved_message(self, final: Location, error: str) -> str:
        return not_saved_message(final, error, store=self.store_at(final))

    def save(
        self,
        states: Mapping[str, Stateful],
        *,
        step: int,
        epoch: int = 0,
        name: str | None = None,
        generators: Mapping[str, torch.Generator] | None = None,
        provenance: Provenance | None = None,
    ) -> Location:
        """Commit ``states`` (each one's ``state_dict()``, from rank 0) and every rank's RNG streams
        as a checkpoint named ``name`` (default ``step=<step>``); then retention.

        Collective: every rank calls it at the same step. The checkpoint is recoverable when every
        component's state was captured; what ``states`` must include for an exact continuation
        (the data loader's position, say) is the caller's to know.

        Raises:
            CheckpointSaveError: the save failed on some rank; nothing was committed.
        """
        start = time.perf_counter()
        final = join(self._root(), name or f"step={step}")
        rank, zero = global_rank(), global_rank() == 0
        shared = {key: state.state_dict() for key, state in states.items()} if zero else {}
        files: dict[str, tuple[Any, list[str]]] = {
            rank_state_file(rank): ({"rng": capture_rng_state(generators)}, ["rng"])
        }
        if zero:
            files[SHARED_STATE_FILE] = (shared, sorted(shared))
        model = shared.get("model")
        job = SaveJob(
            final=final,
            store=self.store,
            rank=rank,
            is_global_zero=zero,
            step=step,
            epoch=epoch,
            world_size=world_size(),
            files=files,
            rank_missing=[],
            data_restore=[],
            stream_positions=[],
            shared_components=sorted(shared),
            shared_missing=[],
            start=start,
            provenance=Provenance(**(provenance or {})),
            model_state=model if isinstance(model, Mapping) else {},
        )
        self.commit(job)
        # A verification of an earlier checkpoint of this name describes files that are gone.
        self._verified = {path: r for path, r in self._verified.items() if not same_location(path, final)}
        if zero and self.keep is not None:
            for entry in self.committed()[self.keep :]:
                self.remove(entry.path)
        return final

    # ------------------------------------------------------------------ reading
    def committed(self) -> list[CheckpointEntry]:
        """Every committed checkpoint under ``dirpath``, newest first."""
        root = self._root()
        return committed_checkpoints(root, store=self.store_at(root))

    def latest_recoverable(self, skipped: dict[Location, str] | None = None, log_skips: bool = True) -> Location | None:
        """The newest checkpoint that is recoverable and verifies; its verification is kept for the load."""
        root = self._root()
        return latest_recoverable(
            root, reports=self._verified, skipped=skipped, log_skips=log_skips, store=self.store_at(root)
        )

    def verify(self, checkpoint: str | os.PathLike[str]) -> VerifyReport:
        """Every byte of ``checkpoint`` against its manifest (and its signature, when keys are set)."""
        return verify_checkpoint(checkpoint, store=self.store_at(checkpoint))

    def verified(self, checkpoint: str | os.PathLike[str]) -> VerifyReport | None:
        """This process's verification of ``checkpoint``, if it made one."""
        return next((r for path, r in self._verified.items() if same_location(path, checkpoint)), None)

    def restore(
        self,
        states: Mapping[str, Stateful],
        checkpoint: str | os.PathLike[str] | None = None,
        *,
        generators: Mapping[str, torch.Generator] | None = None,
        missing_ok: bool = False,
    ) -> Restored | None:
        """Load ``checkpoint`` (default: :meth:`latest_recoverable`), verified, into ``states`` and
        this rank's RNG streams. Collective: every rank calls it, the ranks agree on the checkpoint,
        and each reads its own RNG state; a failure on any rank is raised on every rank.

        Raises:
            NothingToRestoreError: no recoverable checkpoint exists (unless ``missing_ok``: None).
            CheckpointCorruptError: the checkpoint fails verification.
            CheckpointError: the ranks resolved different checkpoints, or one could not resolve any.
            ValueError: it was written by another world size, or lacks a component of ``states``.
        """
        location = self._agreed_checkpoint(checkpoint)
        if location is None:
            if missing_ok:
                return None
            raise NothingToRestoreError(f"no recoverable checkpoint under {self.dirpath}")

        def check(manifest: Manifest, path: Location) -> None:
            if manifest.world_size != world_size():
                raise ValueError(f"{path} was written by {manifest.world_size} ranks; this run has {world_size()}")
            absent = sorted(set(states) - set(manifest.components))
            if absent:
                raise ValueError(f"{path} holds no {', '.join(absent)} (it holds {', '.join(manifest.components)})")

        store, earlier = self.store_at(location), self.verified(location)
        # Collective: a rank whose own file fails raises on every rank, not alone (one rank's exit
        # would leave the others waiting in their next collective).
        loaded = load_on_every_rank(
            location, lambda: load_from_store(store, location, "cpu", check, self.trust_pickles, earlier)
        )
        for key, state in states.items():
            state.load_state_dict(loaded[key])
        field = loaded[FIELD_KEY]
        rank_state = field["rank_state"] or {}
        unrestored = restore_rng_state(rank_state["rng"], generators) if "rng" in rank_state else ["rng"]
        return Restored(location, field["manifest"], unrestored)

    def _agreed_checkpoint(self, checkpoint: str | os.PathLike[str] | None) -> Location | None:
        """Collective: the checkpoint every rank restores (``checkpoint``, or each rank's
        :meth:`latest_recoverable`), once every rank found the same one; else raised on every rank, so
        that no rank enters the load's collective alone."""
        location, error = None, None
        try:
            location = as_location(checkpoint) if checkpoint is not None else self.latest_recoverable()
        except Exception as err:  # gathered below: never raised on one rank alone
            error = err
        own = (str(location) if location is not None else None, describe_error(error) if error is not None else None)
        picks = all_gather_objects(own)
        if error is not None:
            raise error
        problems = [f"rank {rank}: {problem}" for rank, (_, problem) in enumerate(picks) if problem is not None]
        if problems:
            raise CheckpointError(
                "no checkpoint to restore could be resolved on every rank:\n  " + "\n  ".join(problems)
            )
        if len({pick for pick, _ in picks}) > 1:
            found = "\n  ".join(f"rank {rank}: {pick}" for rank, (pick, _) in enumerate(picks))
            raise CheckpointError(f"the ranks resolved different checkpoints to restore:\n  {found}")
        return location

    # ------------------------------------------------------------------ retention
    def is_own(self, checkpoint: str | os.PathLike[str]) -> bool:
        """Whether ``checkpoint`` names a checkpoint directly in ``dirpath`` (``..`` resolved), the only
        places retention may remove."""
        if self.dirpath is None:
            return False
        location, root = as_location(checkpoint), as_location(self.dirpath)
        if isinstance(location, Path) and isinstance(root, Path):
            # The parent resolved, not the entry: a symbolic link in dirpath (an advertised ``.ckpt``
            # where hard links fail) is this dirpath's, wherever it points.
            return location.name not in ("", ".", "..") and location.parent.resolve() == root.resolve()
        head, _, name = str(location).rpartition("/")
        return head == str(root) and name not in ("", ".", "..")

    def protection_reason(self, checkpoint: str | os.PathLike[str]) -> str | None:
        """Why retention must keep ``checkpoint``, else None: it is the only recoverable checkpoint;
        or the newest one whose restore drill passed (the release record's evidence that this run's
        checkpoints restore, until a newer one passes a drill); or its restore drill found a mismatch
        (the record's evidence of the failure; the resolver never resumes from it)."""
        entries = committed_checkpoints(parent(checkpoint), store=self.store_at(checkpoint))
        recoverable = [e for e in entries if e.manifest is not None and e.manifest.recoverable]
        if len(recoverable) == 1 and same_location(recoverable[0].path, checkpoint):
            return "it is the only recoverable checkpoint"
        this = next((e.manifest for e in entries if same_location(e.path, checkpoint)), None)
        if this is None:
            return None
        if (this.restore_drill or {}).get("outcome") == DRILL_MISMATCH:
            return "its restore drill found a mismatch (the release record's evidence of the failure)"
        newest_tested = next((e for e in entries if e.manifest is not None and e.manifest.restore_tested), None)
        if newest_tested is not None and same_location(newest_tested.path, checkpoint):
            return "it is the newest checkpoint whose restore drill passed (kept until a newer one passes)"
        return None

    def remove_superseded_drilled(self, retained: Callable[[Location], bool]) -> list[Location]:
        """Remove the checkpoints :meth:`protection_reason` kept only because their restore drill
        passed, now that a newer checkpoint has passed one: each drill-passed checkpoint older than
        the newest, unless ``retained`` (ModelCheckpoint's own retention) still keeps it. Nothing
        outside ``dirpath`` and nothing otherwise protected is removed (:meth:`remove`). On the
        coordinating rank only.

        Returns:
            The checkpoints removed.
        """
        entries = self.committed()
        tested = [e.path for e in entries if e.manifest is not None and e.manifest.restore_tested]
        removed = []
        for older in tested[1:]:
            if not retained(older) and self.remove(older) is None:
                removed.append(older)
        return removed

    def remove(self, checkpoint: str | os.PathLike[str]) -> str | None:
        """Remove ``checkpoint`` (on the coordinating rank only), unless it is not this dirpath's or is
        protected: then the reason it was kept, and nothing is removed."""
        if not self.is_own(checkpoint):
            return f"it is not a checkpoint directly in {self.dirpath}"
        reason = self.protection_reason(checkpoint)
        if reason is None:
            location = as_location(checkpoint)
            self.store_at(location).remove(location)
            self._verified.pop(location, None)
        return reason

    def clean_leftovers(self) -> list[Any]:
        """Delete what interrupted saves and removals left (coordinating rank, no save in flight)."""
        return self.store.clean_leftovers(self._root())
