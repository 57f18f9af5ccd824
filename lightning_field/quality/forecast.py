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
    steps_band: tuple[float, float | None] | None = None  # None: beyond any horizon (never, in >10%)
    seconds_to_target: float | None = None  # from the run's start, at the run's measured pace
    seconds_band: tuple[float | None, float | None] | None = None
    reach_probability: float | None = None
    deadline_miss_probability: float | None = None
    model: str = MODEL

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fit_many(steps: np.ndarray, series: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Best (a, b, c) per column of ``series`` (n points x k series) with b > 0; NaN where none is.

    The design matrix depends only on ``c``, so each exponent costs one pseudo-inverse for every
    resample at once: the bootstrap stays a few milliseconds on the rank that writes the summary.
    """
    k = series.shape[1]
    best_sse = np.full(k, np.inf)
    best = np.full((3, k), np.nan)
    for c in EXPONENTS:
        design = np.stack([np.ones_like(steps), steps ** (-c)], axis=1)
        coef = np.linalg.pinv(design) @ series  # 2 x k
        sse = np.sum((design @ coef - series) ** 2, axis=0)
        better = (coef[1] > 0) & (sse < best_sse)
        best_sse = np.where(better, sse, best_sse)
        best[0] = np.where(better, coef[0], best[0])
        best[1] = np.where(better, coef[1], best[1])
        best[2] = np.where(better, c, best[2])
    return best[0], best[1], best[2]


def _crossings(a: np.ndarray, b: np.ndarray, c: np.ndarray, target: float) -> np.ndarray:
    """The step where ``a + b * s**-c`` falls to ``target``; inf where it never does."""
    with np.errstate(divide="ignore", invalid="ignore"):
        steps = (b / (target - a)) ** (1.0 / c)
    reachable = np.isfinite(a) & (target > a) & (b > 0)
    return np.where(reachable, steps, np.inf)


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
    a, b, c = (x[0] for x in _fit_many(steps, values[:, None]))
    if not np.isfinite(a):
        return Forecast(False, "no forecast: the metric is not improving with steps")
    fitted = a + b * steps ** (-c)
    residuals = values - fitted
    rng = np.random.default_rng(seed)
    resampled = fitted[:, None] + rng.choice(residuals, size=(len(residuals), RESAMPLES), replace=True)
    # Not before now: a curve that "crossed" in the past has not been observed to.
    crossings = np.maximum(_crossings(*_fit_many(steps, resampled), goal), float(current_step))
    reach = float(np.mean(np.isfinite(crossings)))
    pace = elapsed_s / max(current_step, 1)  # wall seconds per step so far, every overhead included
    seconds = elapsed_s + (crossings - current_step) * pace
    miss = float(np.mean(seconds > deadline_s)) if deadline_s is not None else None
    central = max(float(_crossings(np.array([a]), np.array([b]), np.array([c]), goal)[0]), float(current_step))
    if reach < 0.5 or not np.isfinite(central):
        return Forecast(
            False,
            f"no forecast: the fitted curve levels off before the target in {100 * (1 - reach):.0f}% of resamples",
            reach_probability=reach,
            deadline_miss_probability=miss,
        )
    # Percentiles without interpolation: a never-crossing resample ranks last instead of making NaN.
    low, high = (float(np.percentile(crossings, q, method="nearest")) for q in (10, 90))

    def to_seconds(step: float) -> float | None:
        return elapsed_s + (step - current_step) * pace if np.isfinite(step) else None

    return Forecast(
        True,
        "forecast from the fitted quality curve",
        steps_to_target=central,
        steps_band=(low, high if np.isfinite(high) else None),
        seconds_to_target=to_seconds(central),
        seconds_band=(to_seconds(low), to_seconds(high)),
        reach_probability=reach,
        deadline_miss_probability=miss,
    )
