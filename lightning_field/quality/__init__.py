"""Time and cost to a quality target, the goodput ledger, and checkpoint cadence."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_field.core.lazy import lazy_exports

# Eager: the function `forecast` shares its module's name, and a lazy name would lose to the submodule,
# which the import system sets on the package (the module needs numpy only).
from lightning_field.quality.forecast import Forecast, forecast

# Imported on first use: `field plan` reads a goodput ledger, and the cadence callback needs Lightning.
_EXPORTS: dict[str, str] = {
    "CheckpointCadence": "lightning_field.quality.cadence",
    "BUCKETS": "lightning_field.quality.ledger",
    "Ledger": "lightning_field.quality.ledger",
    "goodput_ledger": "lightning_field.quality.ledger",
    "quality_summary": "lightning_field.quality.target",
    "TimeToQuality": "lightning_field.quality.time_to_quality",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from lightning_field.quality.cadence import CheckpointCadence
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
