"""Baseline before scale: checks that data, labels and model are sound before a run is spent on them.

``check_data`` samples a few batches and reports NaN/Inf, inconsistent shapes, labels out of range,
class imbalance, empty batches, train/val duplicates and what ``drop_last`` does; ``tiny_overfit``
tells whether the model and its loss can memorise a few fixed batches, and if not, what to try;
``run_preflight`` adds a one-device baseline and the fit (``field preflight``); ``run_study`` measures
scaling at constant effective batch with gradient equivalence and names the bottleneck (``field scale``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_field.core.lazy import lazy_exports

# Imported on first use: `field --help` and the readers of reports must not pay for torch and
# Lightning, which the checks and the studies need.
_EXPORTS: dict[str, str] = {
    "CheckResult": "lightning_field.baseline.check_result",
    "format_results": "lightning_field.baseline.check_result",
    "check_data": "lightning_field.baseline.data_checks",
    "split_batch": "lightning_field.baseline.data_sample",
    "OverfitResult": "lightning_field.baseline.overfit",
    "tiny_overfit": "lightning_field.baseline.overfit",
    "PreflightSettings": "lightning_field.baseline.preflight",
    "run_preflight": "lightning_field.baseline.preflight",
    "StudyConfig": "lightning_field.baseline.scale",
    "run_study": "lightning_field.baseline.scale",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from lightning_field.baseline.check_result import CheckResult, format_results
    from lightning_field.baseline.data_checks import check_data
    from lightning_field.baseline.data_sample import split_batch
    from lightning_field.baseline.overfit import OverfitResult, tiny_overfit
    from lightning_field.baseline.preflight import PreflightSettings, run_preflight
    from lightning_field.baseline.scale import StudyConfig, run_study

__all__ = [
    "CheckResult",
    "OverfitResult",
    "PreflightSettings",
    "StudyConfig",
    "check_data",
    "format_results",
    "run_preflight",
    "run_study",
    "split_batch",
    "tiny_overfit",
]
