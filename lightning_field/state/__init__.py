"""Per-rank state capture (RNG, data position) and provenance."""

from lightning_field.state.rng import WorkerRngCapture, capture_rng_state, restore_rng_state, rng_digest

__all__ = ["WorkerRngCapture", "capture_rng_state", "restore_rng_state", "rng_digest"]
