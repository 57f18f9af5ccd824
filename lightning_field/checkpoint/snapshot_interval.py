"""How often step snapshots are taken: the user's ``N``, or ``"auto"`` (the default), chosen from
what they are measured to cost.

A snapshot every step redoes at most one step after a crash, and costs its write on every step. With
``snapshot_every_n_train_steps="auto"`` the first snapshots are taken every step and timed (the
training thread's wait for each, and the steps between them); then the smallest ``N`` whose cost
stays within the budget, a share of the step time (1 % by default), is kept:

    N = ceil(snapshot cost / (budget x step time))

so a crash redoes at most ``N`` steps for at most ``budget`` of the run's time. The choice is
re-made every :data:`RECHECK_EVERY` snapshots from the newest measurements (the step time changes
with a curriculum, the cost with the state), and said again only when ``N`` changes. Every rank
takes part in each choice (a snapshot's commit is collective: all ranks must take the same steps),
and the slowest rank's cost decides it. A user's integer is kept as it is; its cost is measured and
said once all the same. ``None`` turns snapshots off.

Nothing here knows Lightning or torch: :class:`SnapshotInterval` is fed times and answers which
steps are due, so a test drives it with numbers.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

__all__ = ["AUTO", "DEFAULT_BUDGET", "IntervalChoice", "SnapshotInterval", "check_every_n_train_steps"]

AUTO: Literal["auto"] = "auto"
DEFAULT_BUDGET = 0.01
PROBES = 5
"""Snapshots taken every step before the first choice; the first two write fresh files."""
COUNTED = 3
"""Of those, the newest ones whose cost counts (the first ones fault in new pages, warm caches)."""
RECHECK_EVERY = 20
"""Snapshots between two choices once the first is made."""
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
            f"snapshot_every_n_train_steps must be 'auto' (the default: chosen from their measured cost),"
            f" an integer >= 1, or None (off); got {every!r}"
        )
    if not (isinstance(budget, (int, float)) and not isinstance(budget, bool) and 0 < budget < 1):
        raise ValueError(
            f"snapshot_overhead_budget must be a share of the step time in (0, 1), e.g. 0.01; got {budget!r}"
        )


@dataclass(frozen=True)
class IntervalChoice:
    """The interval snapshots are taken at, and why (the log, the event log and every manifest say it)."""

    every_n_train_steps: int
    chosen_by: str  # "auto", "auto (measuring)" or "user"
    budget: float
    snapshot_seconds: float | None  # median training-thread wait per snapshot, the slowest rank's
    step_seconds: float | None  # median step without one
    reason: str

    @property
    def overhead(self) -> float | None:
        """The share of step time snapshots take at this interval (measured figures)."""
        if self.snapshot_seconds is None or not self.step_seconds:
            return None
        return self.snapshot_seconds / (self.every_n_train_steps * self.step_seconds)

    def record(self) -> dict[str, Any]:
        return {**asdict(self), "overhead": self.overhead}


class SnapshotInterval:
    """Which steps get a snapshot, from the user's choice and the measured costs.

    Args:
        every: ``"auto"`` or an integer >= 1 (``None`` is handled by the caller: no snapshots).
        budget: the share of step time that snapshots may take, for ``"auto"``.

    The owner calls :meth:`step_ended` at every step's end (every rank), :meth:`due` to ask whether
    this step takes one, :meth:`snapshot_taken` with its training-thread cost, then, when
    :meth:`choice_due`, :meth:`choose` with a collective that gathers every rank's figures.
    """

    def __init__(self, every: int | Literal["auto"], budget: float = DEFAULT_BUDGET) -> None:
        check_every_n_train_steps(every, budget)
        self.auto = every == AUTO
        self.budget = float(budget)
        self._every = 1 if every == AUTO else int(every)
        self._steps: deque[float] = deque(maxlen=STEPS_KEPT)
        self._costs: deque[float] = deque(maxlen=COUNTED)
        self._taken = 0
        self._last_choice_at = 0
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
        return self._every

    def step_ended(self, seconds_since_last: float | None) -> None:
        """The time since the previous step's end, the snapshot taken there excluded (None: none yet)."""
        if seconds_since_last is not None and seconds_since_last > 0:
            self._steps.append(seconds_since_last)

    def due(self, step: int) -> bool:
        return step > 0 and step % self._every == 0

    def snapshot_taken(self, seconds: float) -> None:
        self._taken += 1
        self._costs.append(seconds)

    def choice_due(self) -> bool:
        """After the first :data:`PROBES` snapshots, then every :data:`RECHECK_EVERY` (user's N: once)."""
        if self._taken < PROBES or not self._steps:
            return False
        if self._last_choice_at == 0:
            return True
        return self.auto and self._taken - self._last_choice_at >= RECHECK_EVERY

    def local_figures(self) -> tuple[float, float]:
        """This rank's median snapshot cost and step time, for :meth:`choose`."""
        return statistics.median(self._costs), statistics.median(self._steps)

    def choose(self, gather: Callable[[tuple[float, float]], Sequence[tuple[float, float]]]) -> IntervalChoice | None:
        """Make the choice from every rank's figures (``gather`` is a collective: every rank calls this
        at the same snapshot); the new choice, or None where the interval stays as it was."""
        figures = gather(self.local_figures())
        cost = max(c for c, _ in figures)
        step = statistics.median(s for _, s in figures)
        first = self._last_choice_at == 0
        self._last_choice_at = self._taken
        every = self._every
        if self.auto:
            every = max(1, math.ceil(cost / (self.budget * step)))
        if not first and every == self._every:
            return None
        self._every = every
        self.choice = IntervalChoice(
            every, "auto" if self.auto else "user", self.budget, cost, step, self._reason(every, cost, step)
        )
        return self.choice

    def _reason(self, every: int, cost: float, step: float) -> str:
        share = cost / (every * step)
        figures = f"a snapshot costs {cost * 1e3:.1f} ms against a {step * 1e3:.0f} ms step"
        redo = "a crash redoes at most 1 step" if every == 1 else f"a crash redoes at most {every} steps"
        if not self.auto:
            return f"set by the user; {figures}: {100 * share:.2f}% of the step time; {redo}"
        if every == 1:
            return f"{figures}: {100 * share:.2f}% of the step time, within the {100 * self.budget:g}% budget; {redo}"
        return (
            f"{figures} ({100 * cost / step:.1f}% of a step), so every {every} steps keeps them within the"
            f" {100 * self.budget:g}% budget ({100 * share:.2f}%); {redo}"
        )
