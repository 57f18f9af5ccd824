"""One rank's part of a checkpoint: the state no ``state_dict`` holds, captured at save time.

Lightning's checkpoint holds the weights, optimizers, schedulers and loop progress. Exact resume
also needs, per rank: every RNG stream, the data position (loader states, the sampler's drawn epoch
order, samples seen) and the epoch-level logged values accumulated so far. ``ManifestCheckpoint``
writes this into ``rank-<N>.pt``; the manifest records which ranks' files are complete.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.fabric.utilities.data import sized_len
from torch.utils.data import IterableDataset

from lightning_field.compat import lightning as internals
from lightning_field.state.data_position import capture_sampler_state, describe_restore
from lightning_field.state.epoch_metrics import capture_epoch_metrics
from lightning_field.state.loaders import Adoption
from lightning_field.state.reshard import data_parallel_size
from lightning_field.state.streams import has_own_position, stream_positions, torch_stream, unrestorable_stream


def epoch_closed(trainer: pl.Trainer) -> bool:
    """Whether the save is inside the epoch's end (its batches done, ``on_train_epoch_end`` under way)."""
    progress = trainer.fit_loop.epoch_progress.current
    done = progress.processed  # type: ignore[attr-defined]  # a _ProcessedTracker, typed as its base
    return bool(done == progress.completed + 1)


def _paired(adoptions: list[Adoption], loaders: list[Any]) -> list[Adoption | None]:
    return list(adoptions) if len(adoptions) == len(loaders) else [None] * len(loaders)


def _as_written(loader: Any, adoption: Adoption | None) -> str:
    """``DataLoader over StreamDataset``: the loader class the user built and its dataset's."""
    name = adoption.original if adoption is not None else type(loader).__name__
    return f"{name} over {type(getattr(loader, 'dataset', None)).__name__}"


def capture_rank_state(
    trainer: pl.Trainer,
    checkpoint: dict[str, Any],
    rng: dict[str, Any],
    *,
    weights_only: bool,
    samples_seen: int,
    tokens_seen: int | None,
    adoptions: list[Adoption],
    sees_fetches: bool = True,
) -> tuple[dict[str, Any], list[str]]:
    """This rank's file of a checkpoint: its RNG streams, data position and epoch-metric state,
    and what it lacks for an exact resume (each entry also a reason this checkpoint is not
    recoverable). Every rank calls it at the same save; nothing here is collective.

    ``sees_fetches``: the tracker copies the loaders' state before each fetch, so a loader without a
    length (fetched a batch ahead) still saves the trained batch's position.
    """
    loaders = list(internals.iter_loaders(trainer.train_dataloader))
    stateful = bool(loaders) and all(callable(getattr(dl, "state_dict", None)) for dl in loaders)
    fit_loop_state = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict", {})
    missing = []
    # Named as the user wrote them (a plain DataLoader is adopted as a StatefulDataLoader).
    described = [_as_written(dl, adoption) for dl, adoption in zip(loaders, _paired(adoptions, loaders), strict=True)]
    unsized = [(dl, name) for dl, name in zip(loaders, described, strict=True) if sized_len(dl) is None]
    stateless_streams = [
        name for dl, name in unsized if (stream := torch_stream(dl)) is not None and not has_own_position(stream)
    ]
    if weights_only:
        missing.append("rng and data position (save_weights_only=True makes an export, not a recovery point)")
    elif unsized and not sees_fetches:
        # Lightning fetches one batch ahead from a loader without a length (to know which batch
        # is the last): without the fetch hook, the position from before that fetch is not known.
        missing.append(
            f"data_position (rank {trainer.global_rank}: the train loader {', '.join(n for _, n in unsized)} has no"
            " length, and this Lightning offers no hook before a fetch, so the batch it fetches ahead would count"
            " as trained)"
        )
    elif stateless_streams:
        missing.append(
            f"data_position (rank {trainer.global_rank}: the train loader {', '.join(stateless_streams)} streams an"
            " IterableDataset without a state_dict/load_state_dict pair, so a resume could only re-read the stream"
            " from its start and drop what was trained, which is exact only if it yields the same samples again;"
            " give the dataset a state_dict() returning its position and a load_state_dict(state) that seeks to"
            " it: docs/streamed-data.md)"
        )
    elif unrestorable := [
        f"{name}: {why}" for dl, name in zip(loaders, described, strict=True) if (why := unrestorable_stream(dl))
    ]:
        missing.append(f"data_position (rank {trainer.global_rank}: the train loader {'; '.join(unrestorable)})")
    elif not stateful:
        reasons = [f"{a.original}: {a.reason}" for a in adoptions if a.reason]
        if not reasons:
            kinds = sorted(set(described)) or ["no train dataloader"]
            reasons = [f"{', '.join(kinds)} has no state_dict; use torchdata's StatefulDataLoader"]
        missing.append(f"data_position (rank {trainer.global_rank}: train loader {'; '.join(reasons)})")
    epoch_loop = trainer.fit_loop.epoch_loop
    loader_states = fit_loop_state.get("combined_loader", [])
    state = {
        "rank": trainer.global_rank,
        "rng": rng,
        "data_position": {
            "loader_states": loader_states,
            "stateful": stateful,
            "epoch": trainer.current_epoch,
            "batch_idx": epoch_loop.batch_progress.current.completed,
            # Saved in on_train_epoch_end: the epoch's batches are done, its end is under way.
            "epoch_closed": epoch_closed(trainer),
            "global_step": trainer.global_step,
            # Over how many ranks the data is split (not the world size under tensor parallelism):
            # a resume on another number of ranks moves the position by it (state/reshard.py).
            "data_parallel_size": data_parallel_size(trainer.strategy),
            "samples_seen": samples_seen,
            "tokens_seen": tokens_seen,
            "sampler_state": capture_sampler_state(loaders),
            "restore": [describe_restore(dl) for dl in loaders],
            # Per stream loader and worker, its dataset's own position (JSON, for the manifest).
            "stream_positions": [
                stream_positions(state)
                for dl, state in zip(loaders, loader_states, strict=False)
                if isinstance(getattr(dl, "dataset", None), IterableDataset)
            ],
            # As the user built them (before adoption and DDP's sampler), compared on resume.
            "loader_settings": [dict(a.settings) for a in adoptions] if adoptions else None,
        },
        "epoch_metrics": capture_epoch_metrics(trainer, trainer.lightning_module),
    }
    return state, missing
