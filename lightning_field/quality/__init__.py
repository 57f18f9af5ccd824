"""Time and cost to a quality target, the goodput ledger, and checkpoint cadence."""

from __future__ import annotations

from lightning_field.quality.cadence import CheckpointCadence
from lightning_field.quality.forecast import Forecast, forecast
from lightning_field.quality.ledger import BUCKETS, Ledger, goodput_ledger
from lightning_field.quality.target import quality_summary
from lightning_field.quality.time_to_quality import TimeToQuality

__all__ = [
    "BUCKETS",
    "CheckpointCadence",
    "Forecast",
    "Ledger",
    "TimeToQuality",
    "forecast",
    "goodput_ledger",
    "quality_summary",
]
