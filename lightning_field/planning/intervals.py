"""Checkpoint intervals from save cost and failure rate (Young 1974; Daly 2006).

With a blocking save cost δ and a mean time between failures M:

* Young's first-order optimum: τ = √(2δM).
* Daly's higher-order optimum: τ = √(2δM)·[1 + ⅓·√(δ/2M) + (1/9)·(δ/2M)] − δ for δ < 2M, else τ = M.

τ is compute time between the end of one save and the start of the next.
"""

from __future__ import annotations

import math

FORMULAS = ("daly", "young")
# Seconds from a failure to training again when nothing measured says otherwise: requeue, process
# start, restore. One figure for every estimate (field-train's launch estimate, `field plan`, and
# the ``plan.restart_seconds`` default in field_train.yaml, which a test holds to it), so the two
# tools never price the same failure differently.
DEFAULT_RESTART_SECONDS = 30.0


def _check(save_s: float, mtbf_s: float) -> None:
    if not (save_s > 0 and math.isfinite(save_s)):
        raise ValueError(f"save cost must be a positive number of seconds, got {save_s}")
    if not (mtbf_s > 0 and math.isfinite(mtbf_s)):
        raise ValueError(f"MTBF must be a positive number of seconds, got {mtbf_s}")


def young_interval(save_s: float, mtbf_s: float) -> float:
    _check(save_s, mtbf_s)
    return math.sqrt(2.0 * save_s * mtbf_s)


def daly_interval(save_s: float, mtbf_s: float) -> float:
    _check(save_s, mtbf_s)
    if save_s >= 2.0 * mtbf_s:
        return mtbf_s
    ratio = save_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * save_s * mtbf_s) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - save_s


def interval(save_s: float, mtbf_s: float, formula: str = "daly") -> float:
    if formula == "daly":
        return daly_interval(save_s, mtbf_s)
    if formula == "young":
        return young_interval(save_s, mtbf_s)
    raise ValueError(f"unknown interval formula {formula!r}; use one of {', '.join(FORMULAS)}")


def expected_waste_fraction(interval_s: float, save_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """First-order share of wall time lost to saving and to failures: δ/τ for the saves, plus, per
    failure (one every M), half an interval of lost work and the restart."""
    return save_s / interval_s + (interval_s / 2.0 + restart_s) / mtbf_s
