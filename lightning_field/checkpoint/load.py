"""One load of a manifest checkpoint, Lightning-free: verified before anything is unpickled, then
unpickled as untrusted input, with this rank's own RNG and data position merged in.

The resolver's verification of the checkpoint it picked is handed on, so the load hashes nothing
twice. Lightning's restore path reaches this through
:class:`~lightning_field.checkpoint.io.ManifestCheckpointIO`; a loop without a Trainer through
:meth:`~lightning_field.checkpoint.checkpointer.Checkpointer.restore`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from lightning_field.checkpoint.safe_load import torch_load_untrusted
from lightning_field.checkpoint.stores import CheckpointReader, CheckpointStore, LocalStore, read_manifest
from lightning_field.checkpoint.stores.base import describe_error
from lightning_field.checkpoint.verify import CheckpointCorruptError, VerifyReport, refuse_misnamed, verify_against
from lightning_field.core.distributed import all_gather_objects, global_rank, world_size
from lightning_field.core.manifest import SHARED_STATE_FILE, Manifest, rank_state_file
from lightning_field.core.storage import Location
from lightning_field.state import reshard

log = logging.getLogger(__name__)

LOCAL_FILES = cast(CheckpointReader, LocalStore())  # it reads Paths, which is all a local copy is
"""What reads the local copy a load verifies and loads."""

FIELD_KEY = "lightning_field"
"""Key under which a loaded checkpoint dict carries the manifest and this rank's own state."""


def load_on_every_rank(path: Any, load: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Collective (every rank loads a resume's checkpoint): ``load()``, with a failure
    on any rank raised on all of them, naming it.

    Each rank verifies its own rank file, so one corrupt file fails one rank. Alone, that rank's
    exit leaves the others to fail later in an unrelated collective ("connection closed by peer"
    under gloo) or to wait in one until its timeout (NCCL).
    """
    checkpoint, error = None, None
    try:
        checkpoint = load()
    except Exception as err:
        error = err
    own = None if error is None else f"rank {global_rank()}: {describe_error(error)}"
    problems = [problem for problem in all_gather_objects(own) if problem is not None]
    if error is not None:
        raise error
    if problems:
        listed = "\n  ".join(problems)
        raise CheckpointCorruptError(f"checkpoint {path} could not be loaded on every rank:\n  {listed}")
    assert checkpoint is not None
    return checkpoint


def load_from_store(
    store: CheckpointStore,
    checkpoint: Location,
    map_location: Any = None,
    on_manifest: Callable[[Manifest, Location], None] | None = None,
    trust_pickles: bool = False,
    verified: VerifyReport | None = None,
) -> dict[str, Any]:
    """Read the manifest, check compatibility (``on_manifest`` may raise), take a local copy of this
    rank's files (the checkpoint itself on a local disk; parallel multipart downloads from an object
    store), verify that copy against the manifest, and load exactly those verified bytes, as
    untrusted input (:func:`~lightning_field.checkpoint.safe_load.torch_load_untrusted`).

    ``verified``: the resolver's verification of this checkpoint; a local file it hashed whose entry
    in the manifest read here and whose stat identity are unchanged since is not hashed again
    (:func:`~lightning_field.checkpoint.verify.verify_against`). The manifest is read here, not
    taken from that verification: a checkpoint published again under the same name since (its
    manifest replaced) is checked against what it holds now."""
    start = time.perf_counter()
    manifest = read_manifest(checkpoint, store=store)
    refuse_misnamed(checkpoint, manifest)
    if on_manifest is not None:
        on_manifest(manifest, checkpoint)
    wanted = _wanted_files(manifest)
    with store.local_copy(checkpoint, wanted) as local:
        report = verify_against(manifest, LOCAL_FILES, local, wanted, earlier=verified)
        if not report.intact:
            problems = "\n  ".join(report.problems)
            raise CheckpointCorruptError(f"checkpoint {checkpoint} failed verification:\n  {problems}")
        # Like Lightning's own CheckpointIO: tensors land on the CPU and the strategy moves them.
        loaded = torch_load_untrusted(local / SHARED_STATE_FILE, map_location or "cpu", trust_pickles)
        return attach_rank_state(loaded, manifest, local, checkpoint, start, trust_pickles)


def _wanted_files(manifest: Manifest) -> list[str]:
    return [SHARED_STATE_FILE, *rank_files_to_load(manifest)]


def rank_files_to_load(manifest: Manifest) -> list[str]:
    """The per-rank state files this rank reads: its own, and rank 0's on a resharded resume,
    which takes the data position from rank 0."""
    own = {rank_state_file(global_rank())}
    if manifest.world_size != world_size():
        own.add(rank_state_file(0))
    return sorted(f for f in own if f in manifest.files)


def attach_rank_state(
    checkpoint: dict[str, Any],
    manifest: Manifest,
    path: Path,
    shown: Any,
    start: float,
    trust_pickles: bool,
    data_parallel: int | None = None,
) -> Any:
    """Merge this rank's own RNG and data position (verified already) into a loaded checkpoint; from a
    different world size, the remapping of :mod:`lightning_field.state.reshard` instead, the position
    moved to ``data_parallel`` ranks of data (default: the world size, as under DDP)."""
    rank = global_rank()
    own = rank_state_file(rank)
    rank_state = torch_load_untrusted(path / own, "cpu", trust_pickles) if own in manifest.files else None
    if manifest.world_size != world_size():
        rank_state = _resharded_rank_state(
            checkpoint, manifest, path, shown, rank, rank_state, trust_pickles, data_parallel
        )
    if rank_state is not None:
        loader_states = rank_state.get("data_position", {}).get("loader_states")
        fit_loop = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict")
        if fit_loop is not None and (loader_states or manifest.world_size != world_size()):
            # Rank 0's copy in the shared file is replaced by this rank's own loader position.
            fit_loop["combined_loader"] = loader_states or []
    else:
        log.warning("Checkpoint %s has no state for rank %d: its RNG and data position start fresh", shown, rank)
    checkpoint[FIELD_KEY] = {
        "manifest": manifest,
        "path": str(shown),
        "rank_state": rank_state,
        "load_seconds": time.perf_counter() - start,
    }
    return checkpoint


def _resharded_rank_state(
    checkpoint: dict[str, Any],
    manifest: Manifest,
    path: Path,
    shown: Any,
    rank: int,
    own: Any,
    trust_pickles: bool,
    data_parallel: int | None,
) -> dict[str, Any] | None:
    """This rank's state from a checkpoint of another world size (the resume policy allowed it)."""
    zero = rank_state_file(0)
    if zero not in manifest.files:
        return own
    rank_zero = own if rank == 0 and own is not None else torch_load_untrusted(path / zero, "cpu", trust_pickles)
    state, warnings = reshard.remap_rank_state(own, rank_zero, manifest.world_size, world_size(), rank, data_parallel)
    for warning in warnings:
        log.warning("Resharded resume from %s: %s", shown, warning)
    # The epoch's batch counters follow the loader: rescaled with it, or back to 0 when it restarts.
    batches = state["data_position"].get("resharded_batches") if state["data_position"]["loader_states"] else 0
    reshard.rescale_fit_loop(checkpoint.get("loops", {}), batches or 0)
    return state
