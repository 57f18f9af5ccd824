"""Loading a sharded (DCP) checkpoint behind the same checks as every other load.

``sharded.py`` writes the shards inside the commit protocol; this module reads them back: every
file verified first (split across ranks, or the downloaded copies of a URL's), then Lightning's own
sharded load from exactly those bytes, then this rank's own state merged as for unsharded loads.
"""

from __future__ import annotations

import pickle
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightning_field.checkpoint.io import attach_rank_state, rank_files_to_load
from lightning_field.checkpoint.object_store import ObjectStore
from lightning_field.checkpoint.sharded import DCP_METADATA, SHARDED_SHARED_FILE
from lightning_field.checkpoint.store import describe_error
from lightning_field.checkpoint.verify import CheckpointCorruptError, LocalFiles, verify_against, verify_checkpoint
from lightning_field.compat import lightning as internals
from lightning_field.core.distributed import all_gather_objects
from lightning_field.core.manifest import Manifest, is_checkpoint_dir, read_manifest
from lightning_field.core.storage import Location, StorageOptions, as_location

__all__ = ["dcp_files", "load_from_object_store", "load_through_strategy", "load_verified", "verify_in_parallel"]


def verify_in_parallel(path: Path, names: list[str], rank: int, world_size: int) -> list[str]:
    """Collective: each rank hashes every ``world_size``-th file, and all ranks get all problems, so
    a sharded checkpoint is read once in total, not once per rank, and every rank decides alike."""
    mine = sorted(names)[rank::world_size]
    report = verify_checkpoint(path, mine)
    return [p for problems in all_gather_objects(report.problems) for p in problems]


def dcp_files(manifest: Manifest) -> list[str]:
    """Every DCP file of a sharded checkpoint: a rank's shards may sit in any rank's file (DCP
    deduplicates replicated entries into one of them, and resharding mixes them), so a rank loading
    from copies needs them all."""
    return sorted(name for name in manifest.files if name == DCP_METADATA or name.endswith(".distcp"))


def load_from_object_store(
    load: Callable[..., dict[str, Any]], url: str, manifest: Manifest, store: ObjectStore, weights_only: bool | None
) -> dict[str, Any]:
    """Collective: a sharded checkpoint under a URL, downloaded into a local directory of this rank,
    verified there and loaded through the strategy from exactly those verified bytes.

    Every rank downloads every DCP file (see :func:`dcp_files`), ``meta.pt`` and its rank state.
    Download and verification problems are gathered so every rank raises alike: a rank that went on
    into DCP's collectives alone would hang the others.
    """
    start = time.perf_counter()
    names = [*dcp_files(manifest), SHARDED_SHARED_FILE, *rank_files_to_load(manifest)]
    with tempfile.TemporaryDirectory(prefix="lightning-field-load-") as staging:
        local = Path(staging)
        try:
            store.download(url, local, names)
            problems = verify_against(manifest, LocalFiles(local), names).problems
        except Exception as err:
            problems = [f"download from {url} failed: {describe_error(err)}"]
        problems = [p for rank_problems in all_gather_objects(problems) for p in rank_problems]
        if problems:
            raise CheckpointCorruptError(f"checkpoint {url} failed verification:\n  " + "\n  ".join(problems))
        checkpoint = load_through_strategy(load, local, weights_only)
        return attach_rank_state(checkpoint, manifest, local, url, start)


def load_through_strategy(load: Callable[..., dict[str, Any]], path: Path, weights_only: bool | None) -> dict[str, Any]:
    """Lightning's own sharded load (DCP into the live model and optimizers, then ``meta.pt``).

    The bytes were verified first, so a ``meta.pt`` that needs full unpickling (hparams holding
    arbitrary objects) is loaded with it, as for unsharded checkpoints. Every rank reads the same
    ``meta.pt``, so every rank takes the same branch and DCP's collectives stay matched.
    """
    try:
        return load(path, weights_only=True if weights_only is None else weights_only)
    except pickle.UnpicklingError:
        return load(path, weights_only=False)


def load_verified(
    load: Callable[..., dict[str, Any]],
    path: Any,
    weights_only: bool | None,
    *,
    strategy: Any,
    store: ObjectStore,
    storage_options: StorageOptions | None,
    check_resume: Callable[[Manifest, Location], None],
) -> Any:
    """A sharding strategy's ``load_checkpoint``, behind the same checks as the CheckpointIO's:
    compatibility (``check_resume``), then every file verified (split across ranks, or the
    downloaded copies of a URL's) before DCP reads a byte. Collective; plain paths pass through."""
    if not is_checkpoint_dir(path, storage_options):
        return load(path, weights_only=weights_only)
    start = time.perf_counter()
    location = as_location(path)
    manifest = read_manifest(location, storage_options)
    check_resume(manifest, location)
    if not isinstance(location, Path):
        # Each rank loads the copy it downloaded and verified itself (Lightning's own load would
        # read rank 0's private directory on every rank).
        def own_copy(local: Path, weights_only: bool | None = None) -> dict[str, Any]:
            return internals.load_sharded_from(strategy, local, weights_only)

        return load_from_object_store(own_copy, location, manifest, store, weights_only)
    names = list(manifest.files)
    problems = verify_in_parallel(location, names, strategy.global_rank, strategy.world_size)
    if problems:
        raise CheckpointCorruptError(f"checkpoint {location} failed verification:\n  " + "\n  ".join(problems))
    checkpoint = load_through_strategy(load, location, weights_only)
    return attach_rank_state(checkpoint, manifest, location, location, start)
