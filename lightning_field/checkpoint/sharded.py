"""Sharded state (FSDP2 / DTensor under Lightning's ModelParallelStrategy) through
``torch.distributed.checkpoint`` (DCP), inside the same commit protocol.

The checkpoint directory is Lightning's own sharded layout plus this library's files:

* ``__<rank>_<n>.distcp`` (every rank) and ``.metadata`` (rank 0): DCP's shards of the model
  (``state_dict``) and optimizer (``optimizer_<i>``) state, written with fsync by DCP;
* ``meta.pt`` (rank 0): everything else of the Lightning checkpoint, under Lightning's name for it,
  so ``ModelParallelStrategy.load_checkpoint`` reads the directory unchanged;
* ``rank-NNNNN.pt`` (every rank) and ``manifest.json``, as for unsharded checkpoints.

DCP writes ``.metadata`` last as its own commit marker but checksums nothing, so each rank hashes the
files it wrote and the manifest lists every one of them; rank 0 checks the list against DCP's
metadata, so a shard DCP references but nobody reported fails the save instead of the resume.
Per-rank RNG and data position stay in ``rank-NNNNN.pt`` files, outside DCP: DCP deduplicates
identical entries across ranks, and two ranks' RNG states must never collapse into one.

Under an fsspec URL each rank has DCP write into a private local staging directory and uploads what
it wrote; the manifest PUT still commits. Loading (``sharded_load.py``) downloads the DCP files,
verifies the copies and has the strategy read those.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning_field.checkpoint.stores.base import RankOutcome, Receipt, describe_error
from lightning_field.core.hashing import hash_file

SHARDED_SHARED_FILE = "meta.pt"
"""The non-tensor rest of a sharded checkpoint; Lightning's ``_METADATA_FILENAME``."""

DCP_METADATA = ".metadata"
DCP_COMPONENTS = ["model", "optimizer"]


def split_state(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """Pop the DTensor parts out of a dumped checkpoint, keyed as Lightning's loader expects them."""
    shards = {"state_dict": checkpoint.pop("state_dict")}
    for index, optimizer_state in enumerate(checkpoint.pop("optimizer_states", [])):
        shards[f"optimizer_{index}"] = optimizer_state
    return shards


def write_shards(
    tmp: Path, rank: int, shards: dict[str, Any], group: Any = None, durable: bool = True
) -> tuple[RankOutcome, list[str]]:
    """Collective over ``group``: DCP-save ``shards`` into ``tmp`` (which exists: the caller made it
    before every rank agreed to enter the save), then hash the files this rank wrote.

    ``tmp`` may be private to this rank (a local staging directory before an upload): DCP names
    every rank's files apart and only rank 0 writes ``.metadata``. ``durable=False`` skips the fsync
    for such staging copies, whose durability is the upload's.

    An async save runs this on the writer thread with host copies of the shards and the commit's
    own gloo group, so DCP's planning collectives never interleave with training's.

    Returns this rank's outcome (errors returned, not raised: DCP already raised on every rank
    alike, and the receipt exchange must still happen) and, on rank 0, every file DCP's metadata
    references.
    """
    import torch.distributed.checkpoint as dcp  # lazy: ~0.2 s to import, and only sharded saves need it

    receipts: list[Receipt] = []
    referenced: list[str] = []
    try:
        writer = dcp.FileSystemWriter(tmp, sync_files=durable)
        metadata = dcp.save(shards, storage_writer=writer, process_group=group)
        own = sorted(p.name for p in tmp.glob(f"__{rank}_*.distcp"))
        if rank == 0:
            own.append(DCP_METADATA)
            referenced = sorted({info.relative_path for info in (metadata.storage_data or {}).values()})
        for name in own:
            size, digest = hash_file(tmp / name)
            receipts.append(Receipt(name, size, digest, rank, list(DCP_COMPONENTS)))
    except Exception as err:
        return RankOutcome(rank, receipts, f"distributed checkpoint save failed: {describe_error(err)}"), referenced
    return RankOutcome(rank, receipts), referenced


def unreported_shards(referenced: list[str], outcomes: list[RankOutcome]) -> list[str]:
    """Files DCP's metadata needs that no rank reported: a manifest without them would be incomplete."""
    reported = {r.file for o in outcomes for r in o.receipts}
    return [name for name in referenced if name not in reported]
