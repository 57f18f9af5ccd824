"""Checkpoint intervals from save cost and failure rate (Young 1974; Daly 2006), for one tier or two.

With a blocking save cost δ and a mean time between failures M:

* Young's first-order optimum: τ = √(2δM).
* Daly's higher-order optimum: τ = √(2δM)·[1 + ⅓·√(δ/2M) + (1/9)·(δ/2M)] − δ for δ < 2M, else τ = M.

τ is compute time between the end of one save and the start of the next.

**Two tiers** (:func:`choose_intervals`, the one cost model every tool uses: ``CheckpointCadence``,
the ``"auto"`` step snapshots and ``field plan``). Step snapshots of cost σ (what each holds training
up), resumable c seconds after their capture (0 when committed in line), survive a share p of the
failures (the *coverage*: a process killed or crashed leaves node-local memory; a lost machine does
too only where a partner node holds its replica); the other failures go back to the persistent
checkpoint. Each tier is then a one-tier problem of its own failure rate, the multi-level form of
Young/Daly (Moody et al., SC'10; Di et al., 2014):

* snapshots every τₛ = formula(σ, M/p) (never below σ/budget where a budget caps their overhead);
* persistent saves every τₚ = formula(δ, M/(1 − p));
* expected work redone per failure, ℓ(τ) = M − τ/(e^{τ/M} − 1) the mean time since the last save when
  failures come at random (τ/2 to first order, as Young and Daly take it; M at most):
  L = p·(ℓ(τₛ) + c) + (1 − p)·ℓ(τₚ); persistent checkpoints alone: ℓ(τ) at τ = formula(δ, M);
* expected waste, R the restart: δ/τₚ + σ/τₛ + (L + R)/M; alone: δ/τ + (ℓ(τ) + R)/M.

Snapshots are kept only where they pay: where the waste with them is lower than without. A
persistent interval the user fixed (``every_n_train_steps``) is taken as given for both tiers.

E.g. (``field plan``'s seed scenario, docs/plan.md) a 60 s save and a 6 h MTBF: τ = 1570 s (Daly), 776 s
lost per failure, a waste of 7.55 % with R = 30 s.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

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
    """Share of wall time lost to saving and to failures: δ/τ for the saves, plus, per failure (one
    every M), the work lost (:func:`lost_work_per_failure`, about half an interval) and the restart."""
    return save_s / interval_s + (lost_work_per_failure(interval_s, mtbf_s) + restart_s) / mtbf_s


def _check_nonnegative(name: str, value: float) -> None:
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a non-negative number of seconds, got {value}")


def _check_positive(name: str, value: float) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive number of seconds, got {value}")


def lost_work_per_failure(interval_s: float, mtbf_s: float | None = None) -> float:
    """Expected work redone after a failure, with a checkpoint every ``interval_s`` (an estimate): the
    mean time since the last checkpoint when a failure comes at random (exponential, mean ``mtbf_s``),
    M − τ/(e^{τ/M} − 1). That is τ/2 to first order (Young's and Daly's assumption, failures falling
    uniformly between two saves), and tends to M, never beyond, for intervals far longer than the
    MTBF (a run that hardly checkpoints). Without ``mtbf_s``: τ/2.

    Raises:
        ValueError: ``interval_s`` is negative or NaN (named "the checkpoint interval"); an infinite
            interval is taken with an MTBF only (then the loss is M).
    """
    if not (interval_s >= 0) or (math.isinf(interval_s) and mtbf_s is None):
        _check_nonnegative("the checkpoint interval", interval_s)
    if mtbf_s is None:
        return interval_s / 2.0
    x = interval_s / mtbf_s
    if x == 0:
        return 0.0
    if x > 700:  # e^x overflows: the loss is M to double precision
        return mtbf_s
    return mtbf_s - interval_s / math.expm1(x)


# The share of failures a step snapshot survives (its coverage), where the user does not say. On one
# node, snapshots in its memory outlive a process that crashed or was killed, not the machine: in
# Llama 3's 54-day pretraining run (Dubey et al. 2024, table 5), 78 % of the 419 unexpected
# interruptions were hardware faults, which take the machine out of the job, so 0.22 is left. With
# each node's files replicated to a partner node, a single lost machine is covered too; what is left
# is two machines lost together (a switch, a power feed), taken as 5 %.
COVERAGE_ONE_NODE = 0.22
COVERAGE_REPLICATED = 0.95
DEFAULT_MTBF_HOURS = 6.0  # the method's scenario; where nothing measured or configured says otherwise
DEFAULT_SNAPSHOT_BUDGET = 0.01  # the largest share of step time "auto" snapshots may take


@dataclass(frozen=True)
class FailureModel:
    """What the intervals are chosen against: how often a failure comes, what a restart costs, and the
    share of failures step snapshots survive.

    Args:
        mtbf_hours: mean time between failures (interruptions) of the job, an assumption (a prior,
            which ``CheckpointCadence`` updates with the interruptions it sees).
        restart_seconds: from a failure to training again (requeue, start, restore).
        snapshot_coverage: the share of failures a step snapshot survives, in [0, 1); None: 0.22 on one
            node, 0.95 where each node's snapshots are replicated to a partner (see the module).
        formula: "daly" (default) or "young".

    Raises:
        ValueError: naming the setting that is out of range.
    """

    mtbf_hours: float = DEFAULT_MTBF_HOURS
    restart_seconds: float = DEFAULT_RESTART_SECONDS
    snapshot_coverage: float | None = None
    formula: str = "daly"

    def __post_init__(self) -> None:
        if not (isinstance(self.mtbf_hours, (int, float)) and self.mtbf_hours > 0 and math.isfinite(self.mtbf_hours)):
            raise ValueError(f"FailureModel mtbf_hours must be a positive number of hours, got {self.mtbf_hours!r}")
        if not (isinstance(self.restart_seconds, (int, float)) and 0 <= self.restart_seconds < math.inf):
            raise ValueError(
                f"FailureModel restart_seconds must be a non-negative number of seconds, got {self.restart_seconds!r}"
            )
        coverage = self.snapshot_coverage
        if coverage is not None and not (isinstance(coverage, (int, float)) and 0 <= coverage < 1):
            raise ValueError(
                f"FailureModel snapshot_coverage must be a share in [0, 1) (some failures, two machines lost"
                f" together, always need the persistent tier), or None; got {coverage!r}"
            )
        if self.formula not in FORMULAS:
            raise ValueError(f"FailureModel formula must be one of {', '.join(FORMULAS)}, got {self.formula!r}")

    @property
    def mtbf_s(self) -> float:
        return self.mtbf_hours * 3600.0

    def coverage(self, replicated: bool) -> float:
        """The share of failures snapshots survive: the user's, else the default for where they are kept."""
        if self.snapshot_coverage is not None:
            return float(self.snapshot_coverage)
        return COVERAGE_REPLICATED if replicated else COVERAGE_ONE_NODE


@dataclass(frozen=True)
class TierIntervals:
    """The intervals the cost model chose, and what it predicts (estimates, every one).

    ``snapshot_s`` is None where snapshots are off: none measured, or chosen here and they do not pay
    (a user's interval is always on, paying or not: :attr:`snapshots_pay` says which). The ``*_alone``
    figures are those of persistent checkpoints alone, at their own best interval (or the user's).
    ``waste`` figures are None where no persistent save cost is known (an interval fixed by the user);
    ``waste_change`` (with snapshots minus without) never needs one: the persistent saves cost the same
    with and without snapshots there.
    """

    persistent_s: float
    snapshot_s: float | None
    coverage: float
    lost_per_failure_s: float
    waste: float | None
    persistent_alone_s: float
    lost_alone_s: float
    waste_alone: float | None
    waste_change: float | None  # with the snapshots minus without (None: no snapshots measured)

    @property
    def snapshots_on(self) -> bool:
        return self.snapshot_s is not None

    @property
    def snapshots_pay(self) -> bool:
        """Whether the snapshots lower the predicted waste."""
        return self.waste_change is not None and self.waste_change < 0


def _optimum(cost_s: float, mtbf_s: float, formula: str) -> float:
    """The one-tier interval for a cost against failures every ``mtbf_s`` (infinite: none ever)."""
    if not math.isfinite(mtbf_s):
        return math.inf
    if cost_s <= 0:
        return 0.0  # a free save is taken as often as it can be
    return interval(cost_s, mtbf_s, formula)


def snapshot_interval_s(
    failures: FailureModel, snapshot_s: float, *, replicated: bool = False, budget: float | None = None
) -> float:
    """The snapshot tier's own interval, τₛ = formula(σ, M/p), never below σ/budget (infinite: p = 0)."""
    _check_nonnegative("the snapshot cost", snapshot_s)
    p = failures.coverage(replicated)
    tau = _optimum(snapshot_s, failures.mtbf_s / p if p > 0 else math.inf, failures.formula)
    if budget is not None and snapshot_s > 0:
        tau = max(tau, snapshot_s / budget)
    return tau


def choose_intervals(
    failures: FailureModel,
    save_s: float | None,
    snapshot_s: float | None = None,
    snapshot_commit_s: float = 0.0,
    *,
    replicated: bool = False,
    persistent_s: float | None = None,
    snapshot_budget: float | None = None,
    snapshot_every_s: float | None = None,
) -> TierIntervals:
    """The persistent and snapshot intervals that minimise the predicted waste, chosen together.

    Args:
        failures: the MTBF, restart cost, coverage and formula.
        save_s: the persistent save's blocking cost δ (None only with ``persistent_s``).
        snapshot_s: what one step snapshot holds training up, σ (None: no snapshots to price).
        snapshot_commit_s: from a snapshot's capture until it is resumable, c (0: committed in line).
        replicated: snapshots are replicated to a partner node (their default coverage is higher).
        persistent_s: a persistent interval the user fixed, in seconds; None: chosen here.
        snapshot_budget: the largest share of step time snapshots may take (None: no cap).
        snapshot_every_s: a snapshot interval the user fixed, in seconds: priced, kept even where it
            does not pay (the user asked for it); None: chosen here.

    Raises:
        ValueError: naming the figure that is negative, not finite, or missing.
    """
    if save_s is not None:
        _check_positive("the save cost", save_s)
    elif persistent_s is None:
        raise ValueError("a persistent save cost is needed to choose the persistent interval")
    if persistent_s is not None:
        _check_positive("the checkpoint interval", persistent_s)
    _check_nonnegative("the snapshot commit", snapshot_commit_s)
    mtbf, restart, p = failures.mtbf_s, failures.restart_seconds, failures.coverage(replicated)
    alone = persistent_s if persistent_s is not None else _optimum(save_s or 0.0, mtbf, failures.formula)
    lost_alone = lost_work_per_failure(alone, mtbf)
    waste_alone = None if save_s is None else save_s / alone + (lost_alone + restart) / mtbf
    result = TierIntervals(
        persistent_s=alone,
        snapshot_s=None,
        coverage=p,
        lost_per_failure_s=lost_alone,
        waste=waste_alone,
        persistent_alone_s=alone,
        lost_alone_s=lost_alone,
        waste_alone=waste_alone,
        waste_change=None,
    )
    if snapshot_s is None:
        return result
    _check_nonnegative("the snapshot cost", snapshot_s)
    if p <= 0 and snapshot_every_s is None:
        # Snapshots that survive no failure only cost: they are off, and what they would cost is the change.
        return replace(result, waste_change=0.0)
    if snapshot_every_s is not None:
        _check_positive("the snapshot interval", snapshot_every_s)
        tau_s = snapshot_every_s
    else:
        tau_s = snapshot_interval_s(failures, snapshot_s, replicated=replicated, budget=snapshot_budget)
    tau_p = persistent_s if persistent_s is not None else _optimum(save_s or 0.0, mtbf / (1 - p), failures.formula)
    lost = p * (lost_work_per_failure(tau_s, mtbf) + snapshot_commit_s) + (1 - p) * lost_work_per_failure(tau_p, mtbf)
    snapshot_overhead = snapshot_s / tau_s if tau_s > 0 else 0.0
    # δ/τₚ - δ/τ is 0 where the user fixed the interval: the change needs no save cost there.
    persistent_change = 0.0 if persistent_s is not None else (save_s or 0.0) * (1 / tau_p - 1 / alone)
    change = persistent_change + snapshot_overhead + (lost - lost_alone) / mtbf
    if change >= 0 and snapshot_every_s is None:
        return replace(result, waste_change=change)
    waste = None if save_s is None else save_s / tau_p + snapshot_overhead + (lost + restart) / mtbf
    return replace(
        result, persistent_s=tau_p, snapshot_s=tau_s, lost_per_failure_s=lost, waste=waste, waste_change=change
    )


def priced_in_steps(
    failures: FailureModel,
    save_s: float,
    snapshot_s: float | None,
    snapshot_commit_s: float,
    step_s: float,
    persistent_steps: int,
    *,
    replicated: bool = False,
    snapshot_budget: float | None = None,
    snapshot_steps: int | None = None,
) -> tuple[TierIntervals, int | None]:
    """The figures a run has at whole-step intervals: persistent saves every ``persistent_steps``; snapshots
    every ``snapshot_steps`` where the user fixed it, else at their own interval in whole steps where
    they pay there. Returns the figures and the snapshot steps (None: off, or no snapshots priced).

    ``CheckpointCadence`` and ``field plan --step-seconds`` both call this, so a run's log and the plan
    made from it print the same numbers."""
    _check_positive("the step time", step_s)

    def price(snapshot_every_s: float | None) -> TierIntervals:
        return choose_intervals(
            failures,
            save_s,
            snapshot_s,
            snapshot_commit_s,
            replicated=replicated,
            persistent_s=persistent_steps * step_s,
            snapshot_budget=snapshot_budget,
            snapshot_every_s=snapshot_every_s,
        )

    if snapshot_steps is not None:
        return price(snapshot_steps * step_s), snapshot_steps
    at = price(None)
    if at.snapshot_s is None:
        return at, None
    every = max(1, round(at.snapshot_s / step_s))
    return price(every * step_s), every


def choose_in_steps(
    failures: FailureModel,
    save_s: float,
    snapshot_s: float | None,
    snapshot_commit_s: float,
    step_s: float,
    to_steps: Callable[[float], int],
    *,
    replicated: bool = False,
    snapshot_budget: float | None = None,
    snapshot_steps: int | None = None,
) -> tuple[float, int, TierIntervals, int | None]:
    """Both tiers' intervals chosen together, then taken in whole steps as a run takes them.

    ``to_steps`` turns the persistent interval in seconds into steps (``CheckpointCadence`` clamps it
    and keeps it within its hysteresis). Where the snapshots pay at the best intervals but not at the
    persistent steps taken (held shorter by the user), the persistent interval is that of persistent
    checkpoints alone. Returns (the persistent interval in seconds, its steps, the figures there, the
    snapshot steps or None)."""
    fixed = snapshot_steps * step_s if snapshot_steps is not None else None
    best = choose_intervals(
        failures,
        save_s,
        snapshot_s,
        snapshot_commit_s,
        replicated=replicated,
        snapshot_budget=snapshot_budget,
        snapshot_every_s=fixed,
    )

    def at(tau: float) -> tuple[float, int, TierIntervals, int | None]:
        steps = to_steps(tau)
        figures, every = priced_in_steps(
            failures,
            save_s,
            snapshot_s,
            snapshot_commit_s,
            step_s,
            steps,
            replicated=replicated,
            snapshot_budget=snapshot_budget,
            snapshot_steps=snapshot_steps,
        )
        return tau, steps, figures, every

    chosen = at(best.persistent_s)
    if best.snapshots_on and not chosen[2].snapshots_on:
        chosen = at(best.persistent_alone_s)
    return chosen
