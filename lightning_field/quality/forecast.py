"""Forecast steps and time to a quality target from the trajectory so far, with an uncertainty band.

The model is a saturating power law, ``m(step) = a + b * step**(-c)`` (quality curves of training
runs are well described by one; ``a`` is where the metric levels off). It is fitted by least squares
over a grid of exponents, and the band comes from a residual bootstrap: each resample gives a step
at which the curve crosses the target, or none if its floor ``a`` is above it. The deadline risk is
the share of resamples that cross too late or never.

"No forecast" is an answer: with fewer than ``MIN_POINTS`` evaluations, a metric that is not
improving, or a fit whose resamples mostly never reach the target, nothing is extrapolated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

MIN_POINTS = 4
EXPONENTS = np.linspace(0.05, 2.0, 40)
RESAMPLES = 300
MODEL = "metric = a + b * step^(-c), least squares over c in [0.05, 2]; band: residual bootstrap (10th-90th pct)"


@dataclass
class Forecast:
    available: bool
    reason: str
    steps_to_target: float | None = None
    steps_band: tuple[float, float] | None = None
    seconds_to_target: float | None = None  # from the run's start, at the run's measured pace
    seconds_band: tuple[float, float] | None = None
    reach_probability: float | None = None
    deadline_miss_probability: float | None = None
    model: str = MODEL

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fit(steps: np.ndarray, values: np.ndarray) -> tuple[float, float, float, float]:
    """(a, b, c, sse) of the best fit with b > 0 (an improving metric)."""
    best = (0.0, 0.0, 1.0, float("inf"))
    for c in EXPONENTS:
        x = steps ** (-c)
        design = np.stack([np.ones_like(x), x], axis=1)
        (a, b), *_ = np.linalg.lstsq(design, values, rcond=None)
        sse = float(np.sum((design @ np.array([a, b]) - values) ** 2))
        if b > 0 and sse < best[3]:
            best = (float(a), float(b), float(c), sse)
    return best


def _crossing(a: float, b: float, c: float, target: float) -> float:
    """The step where ``a + b * s**-c`` falls to ``target``; inf if it never does."""
    if target <= a or b <= 0:
        return float("inf")
    return float((b / (target - a)) ** (1.0 / c))


def forecast(
    history: Sequence[tuple[int, float]],
    target: float,
    mode: str,
    current_step: int,
    elapsed_s: float,
    deadline_s: float | None = None,
    seed: int = 0,
) -> Forecast:
    """Forecast from ``history`` of (step, metric value). ``mode`` is "min" or "max"."""
    points = [(s, v) for s, v in history if s > 0 and np.isfinite(v)]
    if len(points) < MIN_POINTS:
        return Forecast(False, f"no forecast: {len(points)} evaluations, at least {MIN_POINTS} are needed")
    sign = 1.0 if mode == "min" else -1.0  # fit a decreasing curve either way
    steps = np.array([s for s, _ in points], dtype=float)
    values = sign * np.array([v for _, v in points], dtype=float)
    goal = sign * target
    a, b, c, sse = _fit(steps, values)
    if not np.isfinite(sse):
        return Forecast(False, "no forecast: the metric is not improving with steps")
    fitted = a + b * steps ** (-c)
    residuals = values - fitted
    rng = np.random.default_rng(seed)
    crossings = []
    for _ in range(RESAMPLES):
        resampled = fitted + rng.choice(residuals, size=len(residuals), replace=True)
        ra, rb, rc, rsse = _fit(steps, resampled)
        crossings.append(_crossing(ra, rb, rc, goal) if np.isfinite(rsse) else float("inf"))
    crossings_arr = np.array(crossings)
    reach = float(np.mean(np.isfinite(crossings_arr)))
    if reach < 0.5:
        return Forecast(
            False,
            f"no forecast: the fitted curve levels off before the target in {100 * (1 - reach):.0f}% of resamples",
            reach_probability=reach,
            deadline_miss_probability=1.0 - reach if deadline_s is not None else None,
        )
    pace = elapsed_s / max(current_step, 1)  # wall seconds per step so far, every overhead included
    central = max(_crossing(a, b, c, goal), float(current_step))
    low, high = (float(np.percentile(crossings_arr, q)) for q in (10, 90))
    low, high = max(low, float(current_step)), max(high, float(current_step))

    def to_seconds(step: float) -> float:
        return elapsed_s + (step - current_step) * pace

    miss = None
    if deadline_s is not None:
        miss = float(np.mean([not np.isfinite(s) or to_seconds(s) > deadline_s for s in crossings_arr]))
    return Forecast(
        True,
        "forecast from the fitted quality curve",
        steps_to_target=central,
        steps_band=(low, high),
        seconds_to_target=to_seconds(central) if np.isfinite(central) else None,
        seconds_band=(to_seconds(low), to_seconds(high)),
        reach_probability=reach,
        deadline_miss_probability=miss,
    )
