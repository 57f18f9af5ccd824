"""What a straggler report is, and how every rank computes the same one from the gathered summaries.

Pure functions of numbers, with no collectives and no I/O, so that ``StragglerMonitor`` (the hooks,
the timing, the one ``all_gather``, the files) can be read apart from the scoring it applies, and
the scoring can be tested on made-up rows.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "FLAGGED_SECTIONS",
    "SUMMARY_FIELDS",
    "Flag",
    "ScoringRules",
    "StragglerReport",
    "interval_summary",
    "median",
    "report_metrics",
    "score_report",
]

# The fixed-size summary each rank contributes to a report, in this order.
SUMMARY_FIELDS = (
    "steps",
    "step_s",
    "data_s",
    "forward_s",
    "backward_s",
    "optimizer_s",
    "compute_s",
    "exposed_comm_s",
    "first_wait_s",
    "checkpoint_s",
    "interval_s",
    "samples",
    "tokens",
    "flops",
    "peak_memory_bytes",
)
FLAGGED_SECTIONS = ("data", "compute")


@dataclass
class Flag:
    rank: int
    host: str
    section: str
    score: float
    reports_below: int
    own_s: float
    reference_s: float


@dataclass
class StragglerReport:
    step: int
    interval_steps: int
    ranks: list[dict[str, Any]]
    scores: dict[str, list[float]]
    arrival: dict[str, Any]
    flagged: list[Flag] = field(default_factory=list)
    input_pipeline: list[str] = field(default_factory=list)
    throughput: dict[str, Any] = field(default_factory=dict)
    collectives: dict[str, Any] | None = None  # this rank's latest step: bytes, time, algbw, busbw per bucket

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


@dataclass(frozen=True)
class ScoringRules:
    """When a section counts as slow: its score below ``threshold`` by an excess of at least
    ``min_share`` of the step, in ``k`` of the last ``n`` reports; and when data wait is worth a warning."""

    threshold: float
    min_share: float
    k: int
    n: int
    data_wait_warn_share: float


def interval_summary(
    steps: Sequence[Any],
    comm_steps: Sequence[dict[str, Any]],
    *,
    elapsed_s: float,
    flops: float | None,
    samples: int,
    tokens: int | None,
    peak_memory: float,
) -> list[float]:
    """This rank's fixed-size contribution to a report (:data:`SUMMARY_FIELDS`, in order): section
    medians over the interval's steps, with "compute" net of time spent waiting on communication."""
    comm = {s["step"]: s for s in comm_steps}
    exposed = [comm[t.step]["exposed_s"] or 0.0 for t in steps if t.step in comm]
    first_wait = [comm[t.step]["first_wait_s"] or 0.0 for t in steps if t.step in comm]
    compute = []
    for t in steps:
        sec = t.seconds
        waited = (comm[t.step]["exposed_s"] or 0.0) if t.step in comm else 0.0
        compute.append(
            sec.get("forward", 0.0) + max(sec.get("backward", 0.0) - waited, 0.0) + sec.get("optimizer", 0.0)
        )
    values = {
        "steps": float(len(steps)),
        "step_s": median([t.wall_s for t in steps]),
        "data_s": median([t.seconds.get("data", 0.0) for t in steps]),
        "forward_s": median([t.seconds.get("forward", 0.0) for t in steps]),
        "backward_s": median([t.seconds.get("backward", 0.0) for t in steps]),
        "optimizer_s": median([t.seconds.get("optimizer", 0.0) for t in steps]),
        "compute_s": median(compute),
        "exposed_comm_s": median(exposed),
        "first_wait_s": median(first_wait),
        "checkpoint_s": sum(t.seconds.get("checkpoint", 0.0) for t in steps),
        "interval_s": elapsed_s,
        "samples": float(samples),
        "tokens": float(tokens if tokens is not None else -1),
        "flops": float(flops) if flops is not None else -1.0,
        "peak_memory_bytes": float(peak_memory),
    }
    return [values[name] for name in SUMMARY_FIELDS]


def score_report(
    rows: list[dict[str, Any]],
    step: int,
    interval_steps: int,
    *,
    rules: ScoringRules,
    history: dict[tuple[int, str], deque[bool]],
    hosts: list[str],
    global_ranks: list[int],
    comm_measured: bool,
    loaders: str,
    peak_flops: tuple[float | None, str],
) -> StragglerReport:
    """The report every rank computes alike from the gathered ``rows``: scores, flags (``history``
    keeps each rank and section's last ``n`` verdicts), arrival order, input-pipeline warnings, throughput."""
    step_ref = median([r["step_s"] for r in rows])
    scores: dict[str, list[float]] = {}
    flagged = []
    for section in FLAGGED_SECTIONS:
        own = [r[f"{section}_s"] for r in rows]
        reference = median(own)
        scores[section] = [reference / o if o > 0 else 1.0 for o in own]
        for rank, (o, score) in enumerate(zip(own, scores[section], strict=True)):
            slow = score < rules.threshold and (o - reference) > rules.min_share * step_ref
            verdicts = history.setdefault((rank, section), deque(maxlen=rules.n))
            verdicts.append(slow)
            if sum(verdicts) >= rules.k:
                flagged.append(Flag(global_ranks[rank], hosts[rank], section, score, sum(verdicts), o, reference))
    waits = [r["first_wait_s"] for r in rows]
    arrival: dict[str, Any] = {"measured": comm_measured}
    measured = [i for i, r in enumerate(rows) if r["steps"] > 0 and r["first_wait_s"] > 0]
    if comm_measured and len(measured) > 1:
        last = min(measured, key=lambda i: waits[i])
        skew = max(waits[i] for i in measured) - waits[last]
        arrival.update({"last_to_arrive": global_ranks[last], "skew_s": skew, "first_wait_s": waits})
        for flag in flagged:
            flag_note = "arrives last at the all-reduce" if flag.rank == last else "not the last to arrive"
            arrival.setdefault("confirmation", {})[str(flag.rank)] = flag_note
    warnings = []
    for rank, r in enumerate(rows):
        share = r["data_s"] / r["step_s"] if r["step_s"] > 0 else 0.0
        if share > rules.data_wait_warn_share:
            warnings.append(
                f"rank {rank} ({hosts[rank]}) waits on data {share:.0%} of each step; loader settings: {loaders}."
                " Raise num_workers, enable pin_memory, raise prefetch_factor, or make __getitem__ cheaper."
            )
    peak, peak_source = peak_flops
    per_rank = []
    for rank, r in enumerate(rows):
        seconds = r["interval_s"] or 1e-9
        flops_s = r["flops"] / seconds if r["flops"] >= 0 else None
        per_rank.append(
            {
                "rank": global_ranks[rank],
                "samples_per_s": r["samples"] / seconds,
                "tokens_per_s": r["tokens"] / seconds if r["tokens"] >= 0 else None,
                "flops_per_s": flops_s,
                "mfu": flops_s / peak if flops_s is not None and peak else None,
                "peak_memory_bytes": r["peak_memory_bytes"],
            }
        )
    throughput = {"per_rank": per_rank, "peak_flops": peak, "peak_source": peak_source}
    ranks = [{"rank": global_ranks[i], "host": hosts[i], **r} for i, r in enumerate(rows)]
    return StragglerReport(step, interval_steps, ranks, scores, arrival, flagged, warnings, throughput)


def report_metrics(report: StragglerReport) -> dict[str, float]:
    """The scalars a report logs: min, median and max of each section over ranks (with who), flags, MFU."""
    metrics: dict[str, float] = {}
    for name in ("step_s", "data_s", "compute_s", "exposed_comm_s"):
        values = [r[name] for r in report.ranks]
        order = sorted(range(len(values)), key=lambda i: values[i])
        metrics[f"profile/{name}/min"] = values[order[0]]
        metrics[f"profile/{name}/min_rank"] = float(order[0])
        metrics[f"profile/{name}/median"] = median(values)
        metrics[f"profile/{name}/max"] = values[order[-1]]
        metrics[f"profile/{name}/max_rank"] = float(order[-1])
    metrics["profile/flagged"] = float(len(report.flagged))
    mfus = [r["mfu"] for r in report.throughput["per_rank"] if r["mfu"] is not None]
    if mfus:
        metrics["profile/mfu/median"] = median(mfus)
    return metrics
