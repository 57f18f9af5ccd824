"""Per-rank state capture (RNG, data position) and provenance."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_field.core.lazy import lazy_exports

# Imported on first use: the readers of recorded provenance (`field evidence check`, `field record`)
# import modules of this package and must not pay for torch through the RNG capture.
_EXPORTS: dict[str, str] = {
    name: "lightning_field.state.rng"
    for name in ("WorkerRngCapture", "capture_rng_state", "restore_rng_state", "rng_digest")
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from lightning_field.state.rng import WorkerRngCapture, capture_rng_state, restore_rng_state, rng_digest

__all__ = ["WorkerRngCapture", "capture_rng_state", "restore_rng_state", "rng_digest"]
