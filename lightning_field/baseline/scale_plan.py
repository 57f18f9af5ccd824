"""Planning a scaling study: the rank counts to run and how each reaches the same effective batch.

A module of its own because the plan is checked before any process starts: ``field scale`` refuses
bad input (an effective batch that does not divide, more ranks than the machine can run) with a
message naming the numbers, and every function here is pure, so that is testable without processes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ACCELERATORS = ("cpu", "gpu")
RANKS_PER_CPU = 2  # the most processes per CPU core a study may start: beyond, it measures the scheduler


class ScaleInputError(ValueError):
    """The study cannot be run as asked; the message names the numbers. Raised before any process starts."""


@dataclass(frozen=True)
class RankPlan:
    """How one rank count reaches the effective batch: ``ranks x per_rank_batch x accumulation``."""

    ranks: int
    per_rank_batch: int
    accumulation: int

    @property
    def effective_batch(self) -> int:
        return self.ranks * self.per_rank_batch * self.accumulation


def parse_ranks(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``; refuses anything that is not a positive integer."""
    counts = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise ScaleInputError(f"--ranks: {part!r} is not a positive integer (expected e.g. 1,2,4)")
        counts.append(int(part))
    return sorted(set(counts))


def max_ranks(cpu_count: int | None = None) -> int:
    """The largest rank count this machine may run: ``RANKS_PER_CPU`` processes per CPU core."""
    return RANKS_PER_CPU * (cpu_count or os.cpu_count() or 1)


def plan_batches(effective_batch: int, ranks: int, max_rank_batch: int | None = None) -> RankPlan:
    """Per-rank batch ``effective_batch / ranks``; when that exceeds ``max_rank_batch`` (what one rank's
    memory holds), the smallest gradient accumulation that divides it evenly. Refuses uneven splits,
    because an effective batch that differs between rank counts makes the comparison meaningless."""
    if effective_batch % ranks:
        raise ScaleInputError(
            f"--effective-batch {effective_batch} is not divisible by {ranks} ranks "
            f"({effective_batch} / {ranks} = {effective_batch / ranks:g}): the effective batch could not stay constant"
        )
    per_rank = effective_batch // ranks
    if max_rank_batch is None or per_rank <= max_rank_batch:
        return RankPlan(ranks, per_rank, 1)
    for accumulation in range(2, per_rank + 1):
        if per_rank % accumulation == 0 and per_rank // accumulation <= max_rank_batch:
            return RankPlan(ranks, per_rank // accumulation, accumulation)
    raise ScaleInputError(f"no accumulation splits {per_rank} samples per rank into batches <= {max_rank_batch}")


def plan_study(
    ranks: list[int],
    steps: int,
    effective_batch: int,
    max_rank_batch: int | None = None,
    cpu_count: int | None = None,
    warmup_steps: int = 2,
) -> list[RankPlan]:
    """Validate every input and plan every rank count, so that a bad study fails before any process starts."""
    if steps <= 0:
        raise ScaleInputError(f"--steps {steps}: the step budget must be >= 1 (zero steps measure nothing)")
    if warmup_steps < 0:
        raise ScaleInputError(f"--warmup {warmup_steps} must be >= 0")
    if effective_batch <= 0:
        raise ScaleInputError(f"--effective-batch {effective_batch} must be >= 1")
    if max_rank_batch is not None and max_rank_batch <= 0:
        raise ScaleInputError(f"--max-rank-batch {max_rank_batch} must be >= 1")
    if not ranks or any(n < 1 for n in ranks):
        raise ScaleInputError(f"--ranks {ranks}: rank counts must be positive integers")
    if 1 not in ranks or len(ranks) < 2:
        raise ScaleInputError(
            f"--ranks {','.join(map(str, ranks))}: needs 1 and at least one more count "
            "(efficiency is throughput(N) / (N x throughput(1)))"
        )
    limit = max_ranks(cpu_count)
    too_many = [n for n in ranks if n > limit]
    if too_many:
        cpus = cpu_count or os.cpu_count() or 1
        raise ScaleInputError(
            f"--ranks {max(too_many)} exceeds what this machine can run: at most {RANKS_PER_CPU} ranks per CPU core, "
            f"{cpus} cores -> {limit} ranks"
        )
    return [plan_batches(effective_batch, n, max_rank_batch) for n in ranks]
