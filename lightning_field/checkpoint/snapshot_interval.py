"""How often step snapshots are taken: the user's ``N``, or ``"auto"`` (the default), chosen by the
cost model both tiers share (:func:`lightning_field.planning.intervals.choose_intervals`).

A snapshot every step redoes at most one step after a crash that it survives, and costs its write
on every step; persistent checkpoints alone redo half their interval. With
``SnapshotConfig(every_n_train_steps="auto")`` the first snapshots are taken every step and timed (the
training thread's wait for each, and the steps between them); then the interval that minimises the
predicted waste is kept, from the failure model (``FailureModel``: the MTBF, the share of failures a
snapshot survives) and the persistent interval in force:

    τₛ = formula(snapshot cost, MTBF / coverage),  N = round(τₛ / step time), at least 1

and never more than ``budget`` of the step time (1 % by default). Where snapshots at that interval
would cost more than the work they save (cheap persistent saves, frequent already), they are off,
and the choice is made again every :data:`RECHECK_EVERY` such intervals; where they are on, every
:data:`RECHECK_EVERY` snapshots, from the newest measurements (the step time changes with a
curriculum, the cost with the state), and said again only when it changes. Every rank takes part in
each choice (a snapshot's commit is collective: all ranks must take the same steps), and the slowest
rank's cost decides it. A user's integer is kept as it is; its cost is measured and said once all
the same. ``None`` turns snapshots off.

Nothing here knows Lightning or torch: :class:`SnapshotInterval` is fed times and answers which
steps are due, so a test drives it with numbers.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from lightning_field.planning.intervals import (
    DEFAULT_SNAPSHOT_BUDGET,
    FailureModel,
    TierIntervals,
    choose_intervals,
    snapshot_interval_s,
)

__all__ = ["AUTO", "DEFAULT_BUDGET", "IntervalChoice", "SnapshotInterval", "check_every_n_train_steps"]

AUTO: Literal["auto"] = "auto"
DEFAULT_BUDGET = DEFAULT_SNAPSHOT_BUDGET
PROBES = 5
"""Snapshots taken every step before the first choice; the first two write fresh files."""
COUNTED = 3
"""Of those, the newest ones whose cost counts (the first ones fault in new pages, warm caches)."""
RECHECK_EVERY = 20
"""Snapshots between two choices once the first is made (intervals, where they are off)."""
STEPS_KEPT = 50

Every = int | Literal["auto"] | None


def check_every_n_train_steps(every: Any, budget: Any) -> None:
    """The arguments as ``ManifestCheckpoint`` takes them.

    Raises:
        ValueError: ``every`` is not ``"auto"``, ``None`` or an integer >= 1, or ``budget`` is not a
            number in (0, 1).
    """
    if not (every is None or every == AUTO or (type(every) is int and every >= 1)):
        raise ValueError(
            f"snapshots.every_n_train_steps must be 'auto' (the default: chosen from their measured cost),"
            f" an integer >= 1, or None (off); got {every!r}"
        )
    if not (isinstance(budget, (int, float)) and not isinstance(budget, bool) and 0 < budget < 1):
        raise ValueError(
            f"snapshots.overhead_budget must be a share of the step time in (0, 1), e.g. 0.01; got {budget!r}"
        )


@dataclass(frozen=True)
class IntervalChoice:
    """The interval snapshots are taken at, and why (the log, the event log and every manifest say it).

    The cost model's figures (estimates) are None for a user's interval and while measuring."""

    every_n_train_steps: int
    chosen_by: str  # "auto", "auto (measuring)" or "user"
    budget: float
    snapshot_seconds: float | None  # median training-thread wait per snapshot, the slowest rank's
    step_seconds: float | None  # median step without one
    reason: str
    off: bool = False  # "auto" found they do not pay: none are taken until the next choice
    mtbf_hours: float | None = None
    coverage: float | None = None  # the share of failures a snapshot survives
    persistent_interval_s: float | None = None  # None: no persistent checkpoint is due before the end
    lost_per_failure_s: float | None = None  # expected work redone per failure with the snapshots
    lost_alone_s: float | None = None  # ... with the persistent checkpoints alone
    waste_change: float | None = None  # predicted waste with the snapshots minus without

    @property
    def overhead(self) -> float | None:
        """The share of step time snapshots take at this interval (measured figures)."""
        if self.off or self.snapshot_seconds is None or not self.step_seconds:
            return None
        return self.snapshot_seconds / (self.every_n_train_steps * self.step_seconds)

    def record(self) -> dict[str, Any]:
        record = {**asdict(self), "overhead": self.overhead}
        if self.off:
            record["every_n_train_steps"] = None
        return record


def _persistent_unknown(step_s: float) -> float | None:
    return None


class SnapshotInterval:
    """Which steps get a snapshot, from the user's choice and the measured costs.

    Args:
        every: ``"auto"`` or an integer >= 1 (``None`` is handled by the caller: no snapshots).
        budget: the largest share of step time that ``"auto"`` snapshots may take.
        failures: what ``"auto"`` weighs them against (an MTBF, a coverage); its defaults where None.

    The owner calls :meth:`step_ended` at every step's end (every rank), :meth:`due` to ask whether
    this step takes one, :meth:`snapshot_taken` with its training-thread cost, then, when
    :meth:`choice_due`, :meth:`choose` with a collective that gathers every rank's figures.
    """

    def __init__(
        self, every: int | Literal["auto"], budget: float = DEFAULT_BUDGET, failures: FailureModel | None = None
    ) -> None:
        check_every_n_train_steps(every, budget)
        self.auto = every == AUTO
        self.budget = float(budget)
        self.failures = failures if failures is not None else FailureModel()
        self.tiers: TierIntervals | None = None  # the cost model's last answer ("auto")
        self._every = 1 if every == AUTO else int(every)
        self._steps: deque[float] = deque(maxlen=STEPS_KEPT)
        self._costs: deque[float] = deque(maxlen=COUNTED)
        self._taken = 0
        self._steps_seen = 0
        self._last_choice_at = 0
        self._last_choice_step = 0
        self._adopted = False
        self.choice = IntervalChoice(
            self._every,
            "auto (measuring)" if self.auto else "user",
            self.budget,
            None,
            None,
            "a snapshot every step while their cost is measured" if self.auto else "set by the user",
        )

    @property
    def every_n_train_steps(self) -> int:
        """The interval in force (or, while :attr:`off`, the one the last choice priced)."""
        return self._every

    @property
    def off(self) -> bool:
        """``"auto"`` found snapshots do not pay: none are due until a choice finds they do."""
        return self.choice.off

    def step_ended(self, seconds_since_last: float | None) -> None:
        """The time since the previous step's end, the snapshot taken there excluded (None: none yet)."""
        self._steps_seen += 1
        if seconds_since_last is not None and seconds_since_last > 0:
            self._steps.append(seconds_since_last)

    def due(self, step: int) -> bool:
        return not self.off and step > 0 and step % self._every == 0

    def snapshot_taken(self, seconds: float) -> None:
        self._taken += 1
        self._costs.append(seconds)

    def choice_due(self) -> bool:
        """After the first :data:`PROBES` snapshots, then every :data:`RECHECK_EVERY` (user's N: once);
        while off, every :data:`RECHECK_EVERY` intervals of steps (every rank counts the same steps)."""
        if self._taken < PROBES or not self._steps:
            return False
        if self._last_choice_at == 0 and not self._adopted:
            return True
        if not self.auto or self._adopted:
            return False
        if self.off:
            return self._steps_seen - self._last_choice_step >= RECHECK_EVERY * self._every
        return self._taken - self._last_choice_at >= RECHECK_EVERY

    def adopt(self, choice: IntervalChoice) -> None:
        """Take an ``"auto"`` choice made outside (``CheckpointCadence``, which chooses both tiers' intervals
        together); no choice of its own is made from then on. Every rank adopts the same one at the same step."""
        if self.auto:
            self._adopted = True
            self._every, self.choice = choice.every_n_train_steps, choice

    def local_figures(self, commit_s: float = 0.0) -> tuple[float, float, float]:
        """This rank's median snapshot cost and step time, and its newest snapshot's commit time, for
        :meth:`choose`."""
        return statistics.median(self._costs), statistics.median(self._steps), commit_s

    def choose(
        self,
        gather: Callable[[tuple[float, float, float]], Sequence[tuple[float, float, float]]],
        persistent_s: Callable[[float], float | None] = _persistent_unknown,
        *,
        replicated: bool = False,
        commit_s: float = 0.0,
    ) -> IntervalChoice | None:
        """Make the choice from every rank's figures (``gather`` is a collective: every rank calls this
        at the same snapshot); the new choice, or None where it stays as it was.

        ``persistent_s`` gives the seconds between persistent checkpoints at a step time (None: none is
        due before the run's end); ``replicated``, whether snapshots are copied to a partner node;
        ``commit_s``, how long this rank's newest snapshot took to become resumable after its capture
        (0: in line). Every figure of the choice is agreed: the slowest rank's cost and commit, the
        median step, so that every rank makes the same choice."""
        figures = gather(self.local_figures(commit_s))
        cost = max(c for c, _, _ in figures)
        step = statistics.median(s for _, s, _ in figures)
        commit_s = max(c for _, _, c in figures)
        first = self._last_choice_at == 0
        self._last_choice_at, self._last_choice_step = self._taken, self._steps_seen
        if not self.auto:
            if not first:
                return None
            self.choice = IntervalChoice(self._every, "user", self.budget, cost, step, self._user_reason(cost, step))
            return self.choice
        choice = self._auto_choice(cost, step, persistent_s(step), replicated, commit_s)
        if not first and (choice.every_n_train_steps, choice.off) == (self._every, self.off):
            return None
        self._every = choice.every_n_train_steps
        self.choice = choice
        return choice

    def _auto_choice(
        self, cost: float, step: float, persistent: float | None, replicated: bool, commit_s: float
    ) -> IntervalChoice:
        failures = self.failures
        if persistent is None or not math.isfinite(persistent):
            tau = snapshot_interval_s(failures, cost, replicated=replicated, budget=self.budget)
            self.tiers = None
            every = max(1, round(tau / step)) if math.isfinite(tau) else self._every
            off = not math.isfinite(tau)  # a coverage of 0: snapshots survive no failure
            lost = alone = change = None
        else:
            tiers = choose_intervals(
                failures,
                None,
                cost,
                commit_s,
                replicated=replicated,
                persistent_s=persistent,
                snapshot_budget=self.budget,
            )
            self.tiers = tiers
            priced = tiers.snapshot_s
            if priced is None:  # they do not pay: price them at their own interval to say what they would cost
                priced = snapshot_interval_s(failures, cost, replicated=replicated, budget=self.budget)
            every = max(1, round(priced / step)) if math.isfinite(priced) else self._every
            off = not tiers.snapshots_pay
            lost, alone, change = tiers.lost_per_failure_s, tiers.lost_alone_s, tiers.waste_change
        coverage = failures.coverage(replicated)
        choice = IntervalChoice(
            every,
            "auto",
            self.budget,
            cost,
            step,
            "",
            off,
            failures.mtbf_hours,
            coverage,
            persistent,
            lost,
            alone,
            change,
        )
        return replace(choice, reason=_auto_reason(choice, failures.formula))

    def _user_reason(self, cost: float, step: float) -> str:
        share = cost / (self._every * step)
        redo = "a crash redoes at most 1 step" if self._every == 1 else f"a crash redoes at most {self._every} steps"
        return (
            f"set by the user; a snapshot costs {cost * 1e3:.1f} ms against a {step * 1e3:.0f} ms step:"
            f" {100 * share:.2f}% of the step time; {redo}"
        )


def _auto_reason(c: IntervalChoice, formula: str) -> str:
    """One sentence a user can check by hand: the figures, the interval they give, and whether it pays."""
    cost, step = c.snapshot_seconds or 0.0, c.step_seconds or 0.0
    every = c.every_n_train_steps
    steps = "every step" if every == 1 else f"every {every} steps"
    figures = (
        f"a snapshot costs {cost * 1e3:.1f} ms against a {step * 1e3:.0f} ms step; against failures every"
        f" {c.mtbf_hours or 0.0:.3g} h, {100 * (c.coverage or 0.0):.0f}% of which a snapshot survives,"
        f" {formula.capitalize()}'s interval gives {steps}"
    )
    if c.persistent_interval_s is None:
        if c.off:
            return f"{figures}; they survive no failure, so they are off"
        return f"{figures}, and no persistent checkpoint is due before the run's end"
    persistent = f"persistent checkpoints every {c.persistent_interval_s:.3g} s"
    change = 100 * (c.waste_change or 0.0)
    if c.off:
        return (
            f"{figures}, where they would cost more than they save beside {persistent} (predicted waste"
            f" {change:+.3f}% of the time with them), so they are off and the choice is made again every"
            f" {RECHECK_EVERY} such intervals"
        )
    return (
        f"{figures}: a failure redoes {c.lost_per_failure_s or 0.0:.3g} s of work on average instead of"
        f" {c.lost_alone_s or 0.0:.3g} s with {persistent} alone, a predicted waste {change:+.3f}% of the time"
        f" ({100 * (c.overhead or 0.0):.2f}% of the step time in snapshots)"
    )
