"""When a rank counts as hung, and which rank the others are waiting for: the hang watchdog's rules.

Pure values and functions, with no threads, files or Lightning, so the rule can be tested on made-up
times and the verdict on made-up heartbeats (``profiling/watchdog.py`` is the callback that feeds them).

**The timeout.** A rank's training thread marks its progress at every hook it passes (a batch's start,
backward, the optimizer step, the batch's end, each validation batch, a save, an epoch's edges). A rank
is hung when it has passed no mark for longer than the timeout of the phase it is in:

* inside a training batch or between two: ``max(floor_s, factor x the longest of the last `window`
  batches)``, a batch timed from one batch end to the next (the next fetch and every callback
  included), or from its start where a long phase came before it (the attempt's first batch is left
  out: it had the long-phase allowance, and compilation or warming caches can make it many times the
  others);
* inside validation, once a validation batch has been seen: the same, over the training and
  validation batches;
* in a phase that is legitimately long, or in work of a kind this attempt has not timed yet (the first
  batch, the first validation batch): ``max(floor_s, long_phase_s, factor x the longest such phase seen)``.
  The long phases are the attempt's start (restore, sanity check, loaders' start), a checkpoint save,
  an epoch's end and start (epoch-end hooks, the next epoch's loader), validation's start and end
  (its loader, epoch-end metrics, the saves that follow it) and the end of training.

**The verdict.** In synchronous data-parallel training every rank passes the same marks in the same
order, so the number of marks a rank has passed (saves left out: they may differ between ranks) says
how far it got. When every rank has stalled, the ranks with the fewest marks are the ones the others
wait for; a rank with no heartbeat, or whose heartbeat stopped being published, is named as well.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from lightning_field.core.heartbeat import Phase

__all__ = ["LONG_PHASES", "HangRule", "Phase", "RankView", "StepHistory", "Verdict", "judge"]


LONG_PHASES = frozenset({Phase.STARTING, Phase.SAVING, Phase.EPOCH_EDGE, Phase.VALIDATION_EDGE, Phase.FINISHING})


@dataclass
class StepHistory:
    """What a rank has timed in this attempt: its recent batches, validation batches and long phases.

    Written by the training thread only; the watchdog thread reads :attr:`longest` (one tuple, replaced
    whole, so never seen half-updated) and :attr:`long_phases` (a dict replaced whole on each change).
    """

    window: int = 100
    longest: tuple[float | None, float | None, int] = (None, None, 0)
    """(longest recent training batch, longest recent validation batch, training batches timed)."""
    long_phases: dict[Phase, float] = field(default_factory=dict)
    _batches: deque[float] = field(init=False, repr=False)
    _val_batches: deque[float] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._batches = deque(maxlen=self.window)
        self._val_batches = deque(maxlen=self.window)

    def add_batch(self, seconds: float) -> None:
        self._batches.append(seconds)
        self.longest = (max(self._batches), self.longest[1], len(self._batches))

    def add_val_batch(self, seconds: float) -> None:
        self._val_batches.append(seconds)
        self.longest = (self.longest[0], max(self._val_batches), self.longest[2])

    def add_long_phase(self, phase: Phase, seconds: float) -> None:
        if seconds > self.long_phases.get(phase, 0.0):
            self.long_phases = {**self.long_phases, phase: seconds}


@dataclass(frozen=True)
class HangRule:
    """The timeout of each phase (module docstring).

    Args:
        floor_s: no timeout is shorter than this (the user's choice: above the longest pause a healthy
            step can take, a recompilation, a slow fetch).
        factor: how many times its longest recent batch a rank may go without progress.
        long_phase_s: the allowance of a long phase, and of work of a kind not timed yet.
        window: how many recent batches the longest is taken over.

    Raises:
        ValueError: a value is not a positive finite number, or ``factor`` is below 1.
    """

    floor_s: float
    factor: float = 10.0
    long_phase_s: float = 900.0
    window: int = 100

    def __post_init__(self) -> None:
        for name in ("floor_s", "factor", "long_phase_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"hang watchdog: {name} must be a positive number of seconds, got {value!r}")
        if self.factor < 1:
            raise ValueError(f"hang watchdog: factor must be at least 1, got {self.factor!r}")
        if self.window < 1:
            raise ValueError(f"hang watchdog: window must be at least 1, got {self.window!r}")

    def timeout(self, phase: Phase, history: StepHistory) -> tuple[float, str]:
        """The seconds without progress after which a rank in ``phase`` is hung, and why that many."""
        longest_batch, longest_val, timed = history.longest
        if phase in LONG_PHASES:
            seen = history.long_phases.get(phase)
            return self._long(f"the allowance for {phase.label}", seen)
        if phase is Phase.VALIDATING:
            if longest_val is None:
                return self._long("the allowance for a first validation batch", None)
            reference = max(longest_val, longest_batch or 0.0)
            return self._step(reference, f"the longest recent training or validation batch ({reference:.3g} s)")
        if longest_batch is None:
            return self._long("the allowance for a first training batch", None)
        return self._step(longest_batch, f"the longest of the last {timed} batches ({longest_batch:.3g} s)")

    def step_timeout(self, history: StepHistory) -> float | None:
        """The in-step timeout alone (None before a batch was timed): what a long phase would have had
        without its allowance."""
        longest_batch = history.longest[0]
        return None if longest_batch is None else max(self.floor_s, self.factor * longest_batch)

    def _step(self, reference: float, what: str) -> tuple[float, str]:
        learned = self.factor * reference
        if learned >= self.floor_s:
            return learned, f"{self.factor:g} x {what}"
        return self.floor_s, f"the floor, above {self.factor:g} x {what}"

    def _long(self, allowance: str, seen: float | None) -> tuple[float, str]:
        learned = self.factor * seen if seen is not None else 0.0
        if learned > max(self.floor_s, self.long_phase_s):
            return learned, f"{self.factor:g} x the longest such phase seen ({seen:.3g} s)"
        if self.long_phase_s >= self.floor_s:
            return self.long_phase_s, f"{allowance} (long_phase_s)"
        return self.floor_s, f"the floor, above {allowance}"


@dataclass(frozen=True)
class RankView:
    """One rank's heartbeat as another rank read it."""

    rank: int
    host: str
    step: int
    marks: int
    phase: str
    no_progress_s: float
    frozen: bool = False
    """Its watchdog stopped publishing: the process is stopped, gone, or holds the GIL in C code."""

    def describe(self) -> str:
        return f"rank {self.rank} on {self.host} ({self.where()})"

    def where(self) -> str:
        phase = Phase[self.phase].label if self.phase in Phase.__members__ else self.phase
        return f"step {self.step}, in {phase}, no progress for {self.no_progress_s:.0f} s"

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "host": self.host,
            "step": self.step,
            "phase": self.phase,
            "no_progress_s": round(self.no_progress_s, 3),
            "frozen": self.frozen,
        }


@dataclass(frozen=True)
class Verdict:
    """Who the stalled job is waiting for."""

    culprits: list[RankView]
    """The ranks furthest behind (or frozen): empty when every rank stopped at the same mark."""
    missing: list[int]
    """Ranks with no heartbeat of this job where this rank looked (another host's unshared disk?)."""
    views: list[RankView]

    @property
    def named(self) -> str:
        parts = [v.describe() + (" - its heartbeat stopped being published" if v.frozen else "") for v in self.culprits]
        parts += [f"rank {r} (no heartbeat of this job found)" for r in self.missing]
        if parts:
            return "; ".join(parts)
        where = f" ({self.views[0].where()})" if self.views else ""
        return f"no rank is behind: every rank stopped at the same point{where}"


def _position(view: RankView) -> tuple[int, bool]:
    # A save passes no counted mark (ranks may differ in how often they are asked for state), so of two
    # ranks with as many marks, the one in a save got further.
    return view.marks, view.phase == Phase.SAVING.name


def judge(views: list[RankView], world_size: int) -> Verdict:
    """The ranks the others wait for: the least advanced (unless all are alike), frozen ones, missing ones."""
    seen = {v.rank for v in views}
    missing = [r for r in range(world_size) if r not in seen]
    frozen = [v for v in views if v.frozen]
    least = min((_position(v) for v in views), default=(0, False))
    behind = [v for v in views if _position(v) == least] if any(_position(v) != least for v in views) else []
    culprits = sorted({v.rank: v for v in [*behind, *frozen]}.values(), key=lambda v: v.rank)
    return Verdict(culprits, missing, sorted(views, key=lambda v: v.rank))
