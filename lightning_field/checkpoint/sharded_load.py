"""Loading a sharded (DCP) checkpoint behind the same checks as every other load.

``sharded.py`` writes the shards inside the commit protocol; this module reads them back: every
file verified first (split across ranks, or the downloaded copies of a URL's), then Lightning's own
sharded load from exactly those bytes, then this rank's own state merged as for unsharded loads.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightning_field.checkpoint.load import LOCAL_FILES, attach_rank_state, rank_files_to_load
from lightning_field.checkpoint.safe_load import check_dcp_metadata, load_untrusted
from lightning_field.checkpoint.sharded import DCP_METADATA, SHARDED_SHARED_FILE
from lightning_field.checkpoint.stores import (
    CheckpointReader,
    CheckpointStore,
    describe_error,
    is_checkpoint,
    read_manifest,
)
from lightning_field.checkpoint.verify import CheckpointCorruptError, refuse_misnamed, verify_against, verify_checkpoint
from lightning_field.compat import lightning as internals
from lightning_field.core.distributed import all_gather_objects
from lightning_field.core.manifest import Manifest
from lightning_field.core.storage import Location, as_location
from lightning_field.state import reshard

__all__ = ["dcp_files", "load_sharded_from_store", "load_through_strategy", "load_verified", "verify_in_parallel"]


def verify_in_parallel(
    store: CheckpointReader,
    path: Location,
    names: list[str],
    rank: int,
    world_size: int,
    manifest: Manifest | None = None,
) -> list[str]:
    """Collective: of the ``world_size`` ranks reading ``path``, the ``rank``-th hashes every
    ``world_size``-th file, and all ranks get all problems, so a sharded checkpoint is read once in
    total, not once per rank, and every rank decides alike. ``manifest``: the one the caller read
    and checks the rest of the load against (else it is read here)."""
    mine = sorted(names)[rank::world_size]
    report = verify_checkpoint(path, mine, store=store, manifest=manifest)
    return [p for problems in all_gather_objects(report.problems) for p in problems]


def dcp_files(manifest: Manifest) -> list[str]:
    """Every DCP file of a sharded checkpoint: a rank's shards may sit in any rank's file (DCP
    deduplicates replicated entries into one of them, and resharding mixes them), so a rank loading
    from copies needs them all."""
    return sorted(name for name in manifest.files if name == DCP_METADATA or name.endswith(".distcp"))


def load_sharded_from_store(
    load: Callable[..., dict[str, Any]],
    checkpoint: Location,
    manifest: Manifest,
    store: CheckpointStore,
    strategy: Any,
    trust_pickles: bool = False,
) -> dict[str, Any]:
    """Collective: a sharded checkpoint verified and loaded through the strategy from exactly the
    verified bytes.

    Where the store's local copy is the checkpoint itself (a local disk every rank sees), the ranks
    split the hashing (:func:`verify_in_parallel`) and Lightning's own load reads it; where the ranks
    name different folders (each node's copy of a replicated snapshot), the ranks of each folder split
    its hashing and each rank reads its own. Elsewhere each
    rank downloads every DCP file (see :func:`dcp_files`), ``meta.pt`` and its rank state into a
    directory of its own, verifies them, and loads its own copy (Lightning's load would read rank 0's
    private directory on every rank). Download and verification problems are gathered so every rank
    raises alike: a rank that went on into DCP's collectives alone would hang the others.
    """
    start = time.perf_counter()
    names = [*dcp_files(manifest), SHARDED_SHARED_FILE, *rank_files_to_load(manifest)]
    with contextlib.ExitStack() as stack:
        local, error = None, None
        try:
            local = stack.enter_context(store.local_copy(checkpoint, names))
        except Exception as err:  # maybe on one rank alone: gathered below, never raised alone
            error = f"download from {checkpoint} failed: {describe_error(err)}"
        folders = all_gather_objects(str(checkpoint))  # each rank's: one, or each node's copy of a snapshot
        if local == checkpoint:  # the same on every rank: the store's kind decides it
            # The ranks that name one folder split its hashing: every copy is hashed whole, once.
            sharing = [rank for rank, folder in enumerate(folders) if folder == str(checkpoint)]
            problems = verify_in_parallel(
                store, checkpoint, list(manifest.files), sharing.index(strategy.global_rank), len(sharing), manifest
            )
        else:
            own = [error] if local is None else verify_against(manifest, LOCAL_FILES, local, names).problems
            problems = [p for rank_problems in all_gather_objects(own) for p in rank_problems if p]
        if local != checkpoint or len(set(folders)) > 1:
            # Each rank's own copy: a private download, or a node's own snapshot folder (resolved
            # per node over the replicas); Lightning's load would read rank 0's on every rank.
            def own_copy(path: Path, weights_only: bool | None = None) -> dict[str, Any]:
                return internals.load_sharded_from(strategy, path, weights_only)

            load = own_copy
        if problems:
            raise CheckpointCorruptError(f"checkpoint {checkpoint} failed verification:\n  " + "\n  ".join(problems))
        assert local is not None
        check_dcp_metadata(local / DCP_METADATA, manifest.files, trust_pickles)  # same bytes, same outcome, every rank
        loaded = load_through_strategy(load, local, trust_pickles)
        data_parallel = reshard.data_parallel_size(strategy)  # its tensor-parallel ranks read the same batches
        return attach_rank_state(loaded, manifest, local, checkpoint, start, trust_pickles, data_parallel)


def load_through_strategy(load: Callable[..., dict[str, Any]], path: Path, trust_pickles: bool) -> dict[str, Any]:
    """Lightning's own sharded load (DCP into the live model and optimizers, then ``meta.pt``, as
    untrusted input: :func:`~lightning_field.checkpoint.safe_load.load_untrusted`). Every rank reads
    the same ``meta.pt``, so every rank loads or refuses it alike and DCP's collectives stay matched.
    """
    return load_untrusted(lambda **kw: load(path, **kw), path / SHARDED_SHARED_FILE, trust_pickles)


def guard_strategy_load(
    strategy: Any,
    store_at: Callable[[Location], CheckpointStore],
    check_resume: Callable[[Manifest, Location], None],
    trust_pickles: bool,
    on_loaded: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Put :func:`load_verified` in front of a sharding strategy's own ``load_checkpoint``, which loads
    without the CheckpointIO (so without its verification); ``on_loaded`` sees the loaded dict before
    Lightning does, as the CheckpointIO's does. Idempotent per strategy."""

    def verified(load: Callable[..., dict[str, Any]], path: Any, weights_only: bool | None) -> Any:
        loaded = load_verified(
            load,
            path,
            weights_only,
            strategy=strategy,
            store=store_at(as_location(path)),
            check_resume=check_resume,
            trust_pickles=trust_pickles,
        )
        if on_loaded is not None and isinstance(loaded, dict):
            on_loaded(loaded)
        return loaded

    internals.wrap_strategy_load(strategy, verified)


def load_verified(
    load: Callable[..., dict[str, Any]],
    path: Any,
    weights_only: bool | None,
    *,
    strategy: Any,
    store: CheckpointStore,
    check_resume: Callable[[Manifest, Location], None],
    trust_pickles: bool = False,
) -> Any:
    """A sharding strategy's ``load_checkpoint``, behind the same checks as the CheckpointIO's:
    compatibility (``check_resume``), then every file verified (split across ranks, or the
    downloaded copies of a URL's) before DCP reads a byte. Collective; plain paths pass through."""
    location = as_location(path)
    if not is_checkpoint(location, store=store):
        return load(path, weights_only=weights_only)
    manifest = read_manifest(location, store=store)
    refuse_misnamed(location, manifest)  # every rank reads the same manifest: all refuse alike
    check_resume(manifest, location)
    return load_sharded_from_store(load, location, manifest, store, strategy, trust_pickles)
