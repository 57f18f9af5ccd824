"""Per-rank state across a change of world size (a resharded resume).

Per-rank RNG streams and loader positions belong to one rank of one partition of the data, so they
cannot map 1:1 onto a different number of ranks. What this module defines instead:

* **RNG**: rank ``r`` of the new run continues rank ``r``'s saved streams where the old run had a
  rank ``r``; ranks beyond the old count start fresh streams (whatever the run seeded), with a
  warning naming them.
* **Data position**: taken from rank 0's global progress. Ranks of a distributed sampler advance in
  lockstep through one epoch permutation that does not depend on the world size (seed and epoch
  only), so after ``k`` samples per rank on ``old`` ranks the first ``k * old`` samples of that
  permutation are consumed. Every new rank resumes ``k * old / new`` samples into its own share,
  replaying rank 0's epoch order, and the fit loop's batch counters of the epoch are rescaled to
  match. When ``k * old`` is not a whole number of new batches per rank the position rounds down, so
  a few samples are seen twice (never skipped), with a warning. That holds while the new run's
  loader draws from the same kind of order; :func:`order_warnings` says when it does not.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from torch.utils.data import DistributedSampler, SequentialSampler

log = logging.getLogger(__name__)

_BATCH_COUNTERS = ("_sampler_iter_yielded", "_num_yielded")
_PROGRESS_KEY = "epoch_loop.batch_progress"


def data_parallel_size(strategy: Any) -> int:
    """Over how many ranks the data is split: the ``num_replicas`` a strategy gives its distributed
    sampler (the world size under DDP, the data-parallel size of a ``ModelParallelStrategy``, whose
    tensor-parallel ranks read the same batches), 1 without one (a single device)."""
    kwargs = getattr(strategy, "distributed_sampler_kwargs", None) or {}
    return int(kwargs.get("num_replicas") or 1)


def rescaled_position(samples_per_rank: int, batches_per_rank: int, old: int, new: int) -> tuple[int, int, bool]:
    """``(samples, batches, exact)`` per new rank for a position of ``samples_per_rank`` on ``old`` ranks."""
    if batches_per_rank <= 0 or samples_per_rank <= 0:
        return 0, 0, True
    batch_size = samples_per_rank // batches_per_rank
    consumed = samples_per_rank * old
    batches = consumed // (new * batch_size)
    exact = samples_per_rank % batches_per_rank == 0 and batches * new * batch_size == consumed
    return batches * batch_size, batches, exact


def rescale_loader_state(state: Any, old: int, new: int) -> tuple[Any, int | None, bool]:
    """A copy of one StatefulDataLoader state moved to the same global position on ``new`` ranks.

    Returns ``(state, batches, exact)``; ``batches`` is None when the state does not have the shape of
    a map-style StatefulDataLoader's (an iterable dataset's own state), which cannot be rescaled.
    """
    sampler_iter = state.get("_sampler_iter_state") if isinstance(state, dict) else None
    if not isinstance(sampler_iter, dict) or "samples_yielded" not in sampler_iter or state.get("dataset_state"):
        return state, None, False
    samples, batches, exact = rescaled_position(
        int(sampler_iter["samples_yielded"]), int(state.get("_num_yielded") or 0), old, new
    )
    moved = copy.deepcopy(state)
    moved["_sampler_iter_state"]["samples_yielded"] = samples
    for key in _BATCH_COUNTERS:
        if key in moved:
            moved[key] = batches
    return moved, batches, exact


def rescale_fit_loop(loops: dict[str, Any], batches: int) -> None:
    """Set the epoch's batch counters (not the run's totals) to the new per-rank position, so the
    batch index and the epoch end Lightning sees match what the rescaled loader will yield."""
    progress = loops.get("fit_loop", {}).get(_PROGRESS_KEY, {}).get("current")
    if not isinstance(progress, dict):
        return
    done = progress.get("completed", 0) < progress.get("ready", 0)  # mid-save: last batch not completed
    for key in ("ready", "started", "processed"):
        if key in progress:
            progress[key] = batches
    if "completed" in progress:
        progress["completed"] = batches - 1 if done else batches


def remap_rank_state(
    own: dict[str, Any] | None, rank_zero: dict[str, Any], old: int, new: int, rank: int, new_data: int | None = None
) -> tuple[dict[str, Any], list[str]]:
    """This rank's state for a resume from ``old`` to ``new`` ranks, and warnings to report.

    ``own`` is the saved state of the same rank number (None beyond the old count); ``rank_zero``
    supplies the data position for every rank. The position moves between the data-parallel sizes,
    which are the world sizes under DDP: the saved run's (recorded in its position) and ``new_data``.
    """
    warnings: list[str] = []
    position = copy.deepcopy(rank_zero.get("data_position", {}))
    old_data = int(position.get("data_parallel_size") or old)
    new_data = new if new_data is None else new_data
    position["data_parallel_size"] = new_data
    rescaled = []
    inexact = False
    for state in position.get("loader_states") or []:
        moved, batches, exact = rescale_loader_state(state, old_data, new_data)
        if batches is None:
            warnings.append(
                f"rank {rank}: a train loader's position ({type(state).__name__} without a sample count) cannot be"
                f" moved from {old} to {new} ranks; it restarts the interrupted epoch"
            )
            moved = None
        inexact = inexact or not exact
        rescaled.append((moved, batches))
    position["loader_states"] = [m for m, _ in rescaled if m is not None] if all(m for m, _ in rescaled) else []
    position["resharded_batches"] = next((b for _, b in rescaled if b is not None), None)
    if inexact:
        warnings.append(
            f"rank {rank}: the epoch position on {old_data} ranks is not a whole number of batches on {new_data};"
            " it rounds down, so a few samples of this epoch are seen twice"
        )
    if own is None:
        warnings.append(
            f"rank {rank}: the checkpoint was written by {old} ranks and has no RNG state for rank {rank};"
            " it starts fresh RNG streams"
        )
    # Rank 0's counters, rescaled to a per-rank share of the same global progress.
    position["samples_seen"] = int(position.get("samples_seen") or 0) * old_data // new_data
    if position.get("tokens_seen") is not None:
        position["tokens_seen"] = int(position["tokens_seen"]) * old_data // new_data
    return {"rank": rank, "rng": (own or {}).get("rng"), "data_position": position}, warnings


def order_warnings(loaders: list[Any], old: int, new: int) -> list[str]:
    """Why the rescaled position will not continue the interrupted epoch, for each train loader whose
    sampler does not follow a distributed sampler's epoch order: Lightning adds a
    ``DistributedSampler`` only under a distributed strategy, so the same job on one device with the
    default strategy draws from a ``RandomSampler``'s own order instead (a sequential order is the
    same either way)."""
    warnings = []
    for index, loader in enumerate(loaders):
        sampler = getattr(getattr(loader, "batch_sampler", None), "sampler", None) or getattr(loader, "sampler", None)
        if sampler is None or isinstance(sampler, (DistributedSampler, SequentialSampler)):
            continue
        warnings.append(
            f"train loader {index} draws from {type(sampler).__name__}, not the DistributedSampler order of the"
            f" {old}-rank run it resumes: the rest of the interrupted epoch comes in another order, so some of its"
            f" samples repeat and others are skipped. Keep a distributed strategy (e.g. strategy='ddp' with"
            f" devices={new}) for the same order."
        )
    return warnings
