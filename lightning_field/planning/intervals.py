"""Checkpoint intervals from save cost and failure rate (Young 1974; Daly 2006).

With a blocking save cost δ and a mean time between failures M:

* Young's first-order optimum: τ = √(2δM).
* Daly's higher-order optimum: τ = √(2δM)·[1 + ⅓·√(δ/2M) + (1/9)·(δ/2M)] − δ for δ < 2M, else τ = M.

τ is compute time between the end of one save and the start of the next.

Expected work redone per failure (estimates: failures fall uniformly in time, first order in τ/M):

* persistent checkpoints alone: τ/2;
* with step snapshots every n steps of s seconds (τₛ = n·s) that take c seconds after their capture
  to become resumable (c = 0 for one committed in line, before training goes on): τₛ/2 + c.

Expected waste (the share of wall time not spent on training; R the restart time):

* persistent checkpoints alone: δ/τ + (τ/2 + R)/M;
* with step snapshots, σ what each holds training up: δ/τ + σ/τₛ + (τₛ/2 + c + R)/M, every failure
  taken to be one the snapshots cover (a killed process; a lost machine whose partner holds its replica).

E.g. a 60 s save and a 6 h MTBF: τ = 1570 s (Daly), 785 s lost per failure, a waste of 7.6 % with
R = 30 s; a 16 ms snapshot every 15.4 s (100 steps of 154 ms) loses 7.7 s per failure and adds
0.1 % of snapshot overhead: 4.1 % in all.
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


def _check_nonnegative(name: str, value: float) -> None:
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a non-negative number of seconds, got {value}")


def _check_positive(name: str, value: float) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive number of seconds, got {value}")


def lost_work_per_failure(interval_s: float) -> float:
    """Expected work redone after a failure with persistent checkpoints alone (an estimate): τ/2, half
    an interval, failures falling uniformly between two saves.

    Raises:
        ValueError: ``interval_s`` is negative or not finite (named "the checkpoint interval").
    """
    _check_nonnegative("the checkpoint interval", interval_s)
    return interval_s / 2.0


def snapshot_lost_work_per_failure(snapshot_interval_s: float, commit_s: float = 0.0) -> float:
    """Expected work redone after a failure that step snapshots cover (a killed process; a lost machine
    whose partner holds its replica), an estimate: τₛ/2 + c, half a snapshot interval plus ``commit_s``,
    the time a snapshot committed beside training takes to become resumable (0 for one committed in
    line): a failure in that time goes back to the snapshot before.

    Raises:
        ValueError: naming the snapshot interval or the snapshot commit, negative or not finite.
    """
    _check_nonnegative("the snapshot interval", snapshot_interval_s)
    _check_nonnegative("the snapshot commit", commit_s)
    return snapshot_interval_s / 2.0 + commit_s


def expected_waste_with_snapshots(
    interval_s: float,
    save_s: float,
    mtbf_s: float,
    restart_s: float,
    snapshot_interval_s: float,
    snapshot_s: float,
    commit_s: float = 0.0,
) -> float:
    """First-order share of wall time lost with step snapshots beside persistent checkpoints (an
    estimate): δ/τ for the persistent saves, σ/τₛ for the snapshots (σ: what each holds training up),
    and per failure (one every M) the snapshot's lost work and the restart:
    δ/τ + σ/τₛ + (τₛ/2 + c + R)/M. It takes every failure to be one the snapshots cover; a machine
    lost with its partner still costs (τ/2 + R), which is what the persistent interval covers.

    Raises:
        ValueError: naming the figure (save cost, MTBF, checkpoint or snapshot interval, snapshot cost,
            snapshot commit, restart) that is negative, not finite, or zero where it divides.
    """
    _check(save_s, mtbf_s)
    _check_positive("the checkpoint interval", interval_s)
    _check_positive("the snapshot interval", snapshot_interval_s)
    _check_nonnegative("the snapshot cost", snapshot_s)
    _check_nonnegative("the restart", restart_s)
    lost = snapshot_lost_work_per_failure(snapshot_interval_s, commit_s)
    return save_s / interval_s + snapshot_s / snapshot_interval_s + (lost + restart_s) / mtbf_s
