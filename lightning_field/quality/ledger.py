"""The goodput ledger: where every second of a run's wall time went, across all its attempts.

A pure function of the event log (``core.events``). The buckets partition the elapsed time from the
first ``run_start`` to the end of the last attempt; ``idle_other`` is the explicit remainder and is
itself broken down (start-up of the first attempt, downtime between attempts, tails after the last
step, and whatever is left unattributed), so nothing hides in a gap.

Lost progress is measured from the last *committed* checkpoint the next attempt actually resumed
from (its ``ckpt_load``), not inferred from repeated step numbers: every second an interrupted
attempt spent after that commit, and every step it trained beyond it, is lost.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

BUCKETS = (
    "productive",
    "lost_progress",
    "restart_overhead",
    "checkpoint_save",
    "checkpoint_load",
    "data_wait",
    "evaluation",
    "idle_other",
)
INTERRUPTED = ("crashed", "preempted", "failed")


@dataclass
class AttemptAccount:
    attempt: int
    status: str  # finished | running | crashed | preempted | failed
    start_unix: float
    end_unix: float
    first_step_unix: float | None
    last_step: int | None
    resumed_from_step: int | None
    lost_steps: int = 0
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class Ledger:
    run_start_unix: float
    end_unix: float
    elapsed_s: float
    buckets: dict[str, float]
    idle_breakdown: dict[str, float]
    goodput: float
    interruptions: int
    mean_time_between_interruptions_s: float | None
    lost_steps: int
    attempts: list[AttemptAccount]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _by_attempt(events: Iterable[Mapping[str, Any]]) -> dict[int, list[Mapping[str, Any]]]:
    grouped: dict[int, list[Mapping[str, Any]]] = {}
    for event in events:
        grouped.setdefault(int(event.get("attempt", 1)), []).append(event)
    return grouped


def _progress(attempt: int, own: list[Mapping[str, Any]], crashes: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """The attempt's latest counters: from its own ``progress`` events or, if it died, its heartbeat."""
    candidates = [dict(e["payload"]) for e in own if e["event"] == "progress"]
    if attempt in crashes:
        candidates.append(dict(crashes[attempt]))
    candidates = [c for c in candidates if c.get("last_beat_unix")]
    return max(candidates, key=lambda c: (c["last_beat_unix"], c.get("batches", 0)), default={})


def _status(own: list[Mapping[str, Any]], crashed: bool, is_last: bool) -> str:
    ends = [e for e in own if e["event"] == "attempt_end"]
    if ends:
        status = str(ends[-1]["payload"].get("status", "finished"))
        return "failed" if status.startswith("failed") else status
    return "crashed" if crashed or not is_last else "running"


def goodput_ledger(events: Iterable[Mapping[str, Any]], now: float | None = None) -> Ledger:
    """Account for the run's elapsed time. ``now`` closes an attempt that is still running."""
    events = sorted(events, key=lambda e: (e.get("attempt", 1), e.get("wall_time", 0.0)))
    if not events:
        raise ValueError("the event log is empty: nothing to account for")
    grouped = _by_attempt(events)
    crashes = {
        int(e["payload"]["attempt"]): e["payload"]
        for e in events
        if e["event"] == "attempt_crashed" and e["payload"].get("attempt") is not None
    }
    numbers = sorted(grouped)
    commits = [e for e in events if e["event"] == "ckpt_committed"]
    run_starts = [e["wall_time"] for e in events if e["event"] == "run_start"]

    accounts: list[AttemptAccount] = []
    for index, number in enumerate(numbers):
        own = grouped[number]
        is_last = index == len(numbers) - 1
        starts = [e for e in own if e["event"] == "attempt_start"]
        start = (starts[0]["payload"].get("process_start_unix") if starts else None) or own[0]["wall_time"]
        progress = _progress(number, own, crashes)
        status = _status(own, number in crashes, is_last)
        ends = [e["wall_time"] for e in own if e["event"] == "attempt_end"]
        latest_seen = max([e["wall_time"] for e in own] + [progress.get("last_beat_unix") or 0.0])
        end = ends[-1] if ends else (now if status == "running" and now is not None else latest_seen)
        loads = [e for e in own if e["event"] == "ckpt_load"]
        accounts.append(
            AttemptAccount(
                attempt=number,
                status=status,
                start_unix=float(start),
                end_unix=float(end),
                first_step_unix=progress.get("first_step_unix"),
                last_step=progress.get("step"),
                resumed_from_step=int(loads[-1]["step"]) if loads else None,
                seconds={"load": sum(float(e["payload"].get("seconds") or 0.0) for e in loads)},
            )
        )

    run_start = float(run_starts[0]) if run_starts else accounts[0].start_unix
    totals = dict.fromkeys(BUCKETS, 0.0)
    idle = {"startup": 0.0, "downtime_between_attempts": 0.0, "tail_after_last_step": 0.0, "unattributed": 0.0}
    lost_steps_total = 0
    for index, account in enumerate(accounts):
        own = grouped[account.attempt]
        successor = accounts[index + 1] if index + 1 < len(accounts) else None
        start = max(account.start_unix, run_start)
        totals["checkpoint_load"] += account.seconds["load"]
        if account.first_step_unix is None:
            # Died (or is still) before its first step: all of it was spent getting going.
            span = account.end_unix - start
            if index == 0:
                idle["startup"] += span - account.seconds["load"]
            else:
                totals["restart_overhead"] += span - account.seconds["load"]
        else:
            overhead = account.first_step_unix - start - account.seconds["load"]
            if index == 0:
                idle["startup"] += overhead
            else:
                totals["restart_overhead"] += overhead
            _split_training(account, own, commits, successor, totals, idle)
            lost_steps_total += account.lost_steps
        if successor is not None:
            idle["downtime_between_attempts"] += max(successor.start_unix, run_start) - account.end_unix

    end = accounts[-1].end_unix
    elapsed = end - run_start
    attributed = sum(v for k, v in totals.items() if k != "idle_other") + sum(idle.values())
    idle["unattributed"] = elapsed - attributed
    totals["idle_other"] = sum(idle.values())
    interrupted = [a for a in accounts[:-1] if a.status in INTERRUPTED] + (
        [accounts[-1]] if accounts[-1].status in INTERRUPTED else []
    )
    return Ledger(
        run_start_unix=run_start,
        end_unix=end,
        elapsed_s=elapsed,
        buckets=totals,
        idle_breakdown=idle,
        goodput=totals["productive"] / elapsed if elapsed > 0 else 0.0,
        interruptions=len(interrupted),
        mean_time_between_interruptions_s=elapsed / len(interrupted) if interrupted else None,
        lost_steps=lost_steps_total,
        attempts=accounts,
    )


def _split_training(
    account: AttemptAccount,
    own: list[Mapping[str, Any]],
    commits: list[Mapping[str, Any]],
    successor: AttemptAccount | None,
    totals: dict[str, float],
    idle: dict[str, float],
) -> None:
    """Divide one attempt's time from its first step to its end into useful, lost and tail."""
    assert account.first_step_unix is not None
    first = account.first_step_unix
    own_commits = [e for e in own if e["event"] == "ckpt_committed"]
    interrupted = account.status in INTERRUPTED or (successor is not None and account.status != "finished")
    tail = 0.0
    if interrupted:
        # Kept = the checkpoint the next attempt resumed from; without a next attempt, the last commit.
        if successor is not None:
            kept_step = successor.resumed_from_step or 0
        else:
            kept_step = max((int(e["step"]) for e in own_commits), default=0)
        kept = [e for e in own_commits if int(e["step"]) == kept_step]
        # Nothing this attempt did survives unless the kept checkpoint was committed by it.
        useful_end = kept[-1]["wall_time"] if kept else first
        waits = _data_wait(own, kept_step) if kept else 0.0
        if account.last_step is not None:
            account.lost_steps = max(account.last_step - kept_step, 0)
        lost = account.end_unix - useful_end
        totals["lost_progress"] += lost
        account.seconds["lost_progress"] = lost
    else:
        last_activity = max([e["wall_time"] for e in own_commits] + [_last_beat(own) or first])
        useful_end = min(last_activity, account.end_unix)
        waits = _data_wait(own, None)
        tail = account.end_unix - useful_end
        idle["tail_after_last_step"] += tail
    saves = sum(
        float(e["payload"].get("blocking_s") or 0.0) for e in own_commits if first <= e["wall_time"] <= useful_end
    )
    evals = sum(
        float(e["payload"].get("seconds") or 0.0)
        for e in own
        if e["event"] == "eval" and first <= e["wall_time"] <= useful_end
    )
    productive = (useful_end - first) - saves - evals - waits
    totals["checkpoint_save"] += saves
    totals["evaluation"] += evals
    totals["data_wait"] += waits
    totals["productive"] += productive
    account.seconds.update(
        {"productive": productive, "checkpoint_save": saves, "evaluation": evals, "data_wait": waits, "tail": tail}
    )


def _last_beat(own: list[Mapping[str, Any]]) -> float | None:
    beats = [e["payload"].get("last_beat_unix") for e in own if e["event"] == "progress"]
    return max((b for b in beats if b), default=None)


def _data_wait(own: list[Mapping[str, Any]], kept_step: int | None) -> float:
    """The attempt's data wait up to the kept commit (interrupted attempts), or in total."""
    reports = [e["payload"] for e in own if e["event"] == "progress"]
    if kept_step is not None:
        # Reported at the first batch after that commit, with the counters as they stood at the commit.
        reports = [r for r in reports if r.get("commit_step") == kept_step]
    if not reports:
        return 0.0
    return float(max(reports, key=lambda r: r.get("batches", 0)).get("data_wait_s") or 0.0)
