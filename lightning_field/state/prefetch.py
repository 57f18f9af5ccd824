"""The data position of the last batch trained, where Lightning has already fetched the next one.

From a train loader without a length (an ``IterableDataset`` stream), Lightning fetches one batch
ahead, to know which batch ends the epoch. At a save, the loader's own position then counts that
fetched batch as trained, and a resume from it would skip the batch. So, for such loaders only,
each fetch is preceded by a copy of the loaders' states and of the RNG streams; a save taken while
a batch waits uses the copy from before that batch's fetch. Both are exactly the states the
uninterrupted run had after the last trained batch's fetch, so the resume re-fetches the waiting
batch from them and goes on as if never stopped.

Loaders with a length are not fetched ahead; nothing is copied for them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_field.compat import lightning as internals
from lightning_field.state.rng import capture_rng_state

__all__ = ["PositionBeforeFetch", "PrefetchedPosition"]


@dataclass(frozen=True)
class PositionBeforeFetch:
    """The train loaders' states and this rank's RNG streams just before one fetch."""

    loader_states: list[Any]  # as CombinedLoader._state_dicts() lists them: its stateful loaders, in order
    rng: dict[str, Any]
    fetches_before: int  # the fetcher's count of batches fetched this epoch, before this fetch


class PrefetchedPosition:
    """Copies, before each train fetch from loaders without a length, what a save needs if the
    fetched batch is still waiting to be trained when the save comes.

    Args:
        generators: the named ``torch.Generator`` objects whose state is saved with the global streams.
    """

    def __init__(self, generators: Mapping[str, torch.Generator] | None = None) -> None:
        # Shared, not copied: generators registered on the checkpoint later are captured too.
        self.generators = generators if generators is not None else {}
        self._last: PositionBeforeFetch | None = None
        self._previous: PositionBeforeFetch | None = None
        self.for_every_loader = False
        """Also copy before fetches from loaders with a length (an exception save needs the position
        from before the failed step's fetch): ~40 us a fetch for a StatefulDataLoader."""

    def before_fetch(self, trainer: pl.Trainer) -> None:
        if not (self.for_every_loader or internals.fetches_ahead(trainer)):
            self._last = self._previous = None
            return
        loaders = internals.saved_loaders(trainer)
        self._previous = self._last
        # Deep: an in-process dataset's state_dict may hand out its live counters.
        self._last = PositionBeforeFetch(
            [copy.deepcopy(loader.state_dict()) for loader in loaders],
            capture_rng_state(self.generators),
            internals.successful_fetches(trainer),
        )

    def before(self, fetches: int) -> PositionBeforeFetch | None:
        """The copy taken just before the fetch that followed ``fetches`` fetches this epoch, if kept."""
        for kept in (self._last, self._previous):
            if kept is not None and kept.fetches_before == fetches:
                return kept
        return None

    def at_save(self, trainer: pl.Trainer) -> tuple[PositionBeforeFetch | None, str | None]:
        """What to save instead of the live loader states and RNG streams, or ``None`` where they are
        the trained batch's own; and why neither can be trusted, where that is so."""
        ahead = internals.batches_fetched_ahead(trainer)
        if ahead == 0:
            return None, None
        last = self._last
        if ahead > 1 or last is None or last.fetches_before + 1 != internals.successful_fetches(trainer):
            return None, (
                f"Lightning holds {ahead} batch(es) fetched ahead of the last one trained, and lightning_field"
                " did not see the loaders' state before that fetch"
            )
        return last, None
