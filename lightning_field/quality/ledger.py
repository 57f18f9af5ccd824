"""The goodput ledger: where every second of a run's wall time went, across all its attempts.

A pure function of the event log (``core.events``). The buckets partition the elapsed time from the
first ``run_start`` to the end of the last attempt; ``idle_other`` is the explicit remainder and is
itself broken down (start-up of the first attempt, downtime between attempts, tails after the last
step, and whatever is left unattributed), so nothing hides in a gap.

Lost progress is measured from the last *committed* checkpoint the next attempt actually resumed
from (its ``ckpt_load``), not inferred from repeated step numbers: every second an interrupted
attempt spent after that commit, and every step it trained beyond it, is lost. A step snapshot
(``snapshot_committed``) is such a commit too; what its capture held training up is its own bucket,
``snapshot_overhead``, apart from ``checkpoint_save``, and the steps redone are counted by the tier
the next attempt resumed from (``redone_steps``).
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
    "snapshot_overhead",
    "checkpoint_load",
    "data_wait",
    "evaluation",
    "idle_other",
)
INTERRUPTED = ("crashed", "preempted", "failed")
TIERS = ("persistent", "snapshot", "replica")
"""Where a resume came from (a ``ckpt_load`` event's ``tier``; logs written before tiers say none: persistent)."""
REDONE_FROM = (*TIERS, "none")
"""Keys of ``Ledger.redone_steps``: the tier resumed from, or "none" where a later attempt started from scratch."""
COMMITS = ("ckpt_committed", "snapshot_committed")
"""Events that make a step a point a later attempt can resume from."""
AT_STEP = (
    *COMMITS,
    "fit_start",
    "ckpt_load",
    "ckpt_save_start",
    "ckpt_save_failed",
    "eval",
    "hang",
    "attempt_failed",
    "attempt_end",
    "preempted",
    "interrupted",
)
"""An attempt's own events whose ``step`` is one it had reached (a progress report may be older)."""


@dataclass
class AttemptAccount:
    attempt: int
    status: str  # finished | running | crashed | preempted | failed | refused (the no-progress guard's)
    start_unix: float
    end_unix: float
    first_step_unix: float | None
    last_step: int | None  # the step it reached: the newest of its reports, commits and its end
    resumed_from_step: int | None
    devices: int = 1
    resumed_from_tier: str | None = None  # "persistent", "snapshot" or "replica" where it loaded one
    lost_steps: int = 0  # steps redone: the step it reached minus the step the next attempt resumed from
    # The tier the next attempt resumed from where this one lost steps ("none": it started over); None
    # where no later attempt cut it back (none came yet: its steps past its newest commit are at risk).
    cut_back_to: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    # Trainer settings this attempt changed from its checkpoint's, as allow_changed allowed (a
    # ``settings_changed`` event): name -> [checkpoint's, this attempt's]. From here on the run is not
    # exact against an uninterrupted one.
    changed_settings: dict[str, list[Any]] = field(default_factory=dict)


@dataclass
class Ledger:
    run_start_unix: float
    end_unix: float
    elapsed_s: float
    buckets: dict[str, float]
    idle_breakdown: dict[str, float]
    goodput: float
    interruptions: int
    mean_time_between_interruptions_s: float | None  # training exposure (downtime excluded) per interruption
    mean_restart_s: float | None  # process start to first step (restore included) after an interruption
    lost_steps: int
    attempts: list[AttemptAccount]
    redone_steps: dict[str, int] = field(default_factory=dict)
    """Steps trained again after an interruption, by the tier the next attempt resumed from (``REDONE_FROM``):
    what step snapshots save shows as steps redone after a "snapshot" (or "replica") resume."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def device_hours(self, until: float | None = None) -> float:
        """Σ over attempts of the time it held its devices (up to ``until``) x its device count;
        downtime between attempts holds no devices."""
        limit = self.end_unix if until is None else until
        total = 0.0
        for a in self.attempts:
            held = min(a.end_unix, limit) - max(a.start_unix, self.run_start_unix)
            total += max(held, 0.0) * a.devices
        return total / 3600.0


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


def _status(own: list[Mapping[str, Any]], crashed: bool, is_last: bool, live: bool) -> str:
    ends = [e for e in own if e["event"] == "attempt_end"]
    if ends:
        status = str(ends[-1]["payload"].get("status", "finished"))
        return next((kind for kind in ("failed", "refused") if status.startswith(kind)), status)
    # No end record: it died, unless it is the attempt still running as we speak.
    return "running" if is_last and live and not crashed else "crashed"


def _accounts(
    grouped: Mapping[int, list[Mapping[str, Any]]], crashes: Mapping[int, Mapping[str, Any]], now: float | None
) -> list[AttemptAccount]:
    accounts: list[AttemptAccount] = []
    numbers = sorted(grouped)
    for index, number in enumerate(numbers):
        own = grouped[number]
        starts = [e for e in own if e["event"] == "attempt_start"]
        start = (starts[0]["payload"].get("process_start_unix") if starts else None) or own[0]["wall_time"]
        if accounts:
            # A second fit() in the same process starts when the previous one ended, not at process start.
            start = max(start, accounts[-1].end_unix)
        progress = _progress(number, own, crashes)
        status = _status(own, number in crashes, index == len(numbers) - 1, now is not None)
        ends = [e["wall_time"] for e in own if e["event"] == "attempt_end"]
        latest_seen = max([e["wall_time"] for e in own] + [progress.get("last_beat_unix") or 0.0])
        end = ends[-1] if ends else (max(now, latest_seen) if status == "running" and now is not None else latest_seen)
        loads = [e for e in own if e["event"] == "ckpt_load"]
        devices = [
            int(count)
            for e in own
            if e["event"] in ("attempt_start", "progress")
            and (count := e["payload"].get("world_size") or e["payload"].get("devices"))
        ]
        accounts.append(
            AttemptAccount(
                attempt=number,
                status=status,
                start_unix=float(start),
                end_unix=float(end),
                first_step_unix=progress.get("first_step_unix"),
                last_step=_reached(own, progress),
                resumed_from_step=int(loads[-1]["step"]) if loads and loads[-1].get("step") is not None else None,
                devices=devices[-1] if devices else 1,
                resumed_from_tier=_tier(loads[-1]["payload"].get("tier")) if loads else None,
                seconds={"load": sum(float(e["payload"].get("seconds") or 0.0) for e in loads)},
                changed_settings=_changed_settings(own),
            )
        )
    return accounts


def _reached(own: list[Mapping[str, Any]], progress: Mapping[str, Any]) -> int | None:
    """The newest step the attempt is known to have reached: its latest progress report or heartbeat,
    and the steps of its own commits, load, failure and end (a report can be older than all of them)."""
    steps = [int(e["step"]) for e in own if e["event"] in AT_STEP and e.get("step") is not None]
    if progress.get("step") is not None:
        steps.append(int(progress["step"]))
    return max(steps, default=None)


def _changed_settings(own: list[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """The attempt's ``settings_changed`` events, merged (a malformed payload contributes nothing)."""
    changes = [e["payload"].get("changes") for e in own if e["event"] == "settings_changed"]
    return {str(k): list(v) for c in changes if isinstance(c, dict) for k, v in c.items() if isinstance(v, list)}


def _tier(value: object) -> str:
    return value if isinstance(value, str) and value in TIERS else "persistent"


def _kept_step(
    account: AttemptAccount, later: list[AttemptAccount], own_commits: list[Mapping[str, Any]]
) -> tuple[int | None, str | None, bool]:
    """The step of this attempt's work that survives, the tier that kept it, and whether a later
    attempt decided it: what the next attempt to load a checkpoint resumed from; 0 if a later attempt
    trained from scratch; for an interrupted attempt no later one cut back yet, its newest commit (or
    the step it resumed from); None if nothing cuts it back."""
    for other in later:
        if other.resumed_from_step is not None:
            return other.resumed_from_step, other.resumed_from_tier or "persistent", True
        if other.first_step_unix is not None:
            return 0, "none", True  # trained without loading anything: everything before it was thrown away
    if account.status in INTERRUPTED:
        steps = [int(e["step"]) for e in own_commits if e.get("step") is not None]
        return max([*steps, account.resumed_from_step or 0]), None, False  # at risk, pending a restart
    return None, None, False


def goodput_ledger(events: Iterable[Mapping[str, Any]], now: float | None = None) -> Ledger:
    """Account for the run's elapsed time.

    ``now`` says the last attempt is still running (it is closed at ``now``); without it, an attempt
    with no end record is taken to have died.
    """
    events = sorted(events, key=lambda e: (e.get("attempt", 1), e.get("wall_time", 0.0)))
    if not events:
        raise ValueError("the event log is empty: nothing to account for")
    grouped = _by_attempt(events)
    crashes = {
        int(e["payload"]["attempt"]): e["payload"]
        for e in events
        if e["event"] == "attempt_crashed" and e["payload"].get("attempt") is not None
    }
    accounts = _accounts(grouped, crashes, now)
    run_starts = [e["wall_time"] for e in events if e["event"] == "run_start"]
    run_start = float(run_starts[0]) if run_starts else accounts[0].start_unix
    # The clock starts at run_start: attempts entirely before it are not part of this run's account.
    accounts = [a for a in accounts if a.end_unix > run_start]
    if not accounts:
        raise ValueError("the event log holds no attempt that ends after the run started: nothing to account for")
    for a in accounts:
        a.start_unix = max(a.start_unix, run_start)
        if a.first_step_unix is not None:
            a.first_step_unix = max(a.first_step_unix, a.start_unix)

    totals = dict.fromkeys(BUCKETS, 0.0)
    idle = {"startup": 0.0, "downtime_between_attempts": 0.0, "tail_after_last_step": 0.0, "unattributed": 0.0}
    restarts: list[float] = []
    for index, account in enumerate(accounts):
        own = grouped[account.attempt]
        later = accounts[index + 1 :]
        totals["checkpoint_load"] += account.seconds["load"]
        getting_going_end = account.first_step_unix if account.first_step_unix is not None else account.end_unix
        overhead = getting_going_end - account.start_unix - account.seconds["load"]
        if index == 0:
            idle["startup"] += overhead
        else:
            totals["restart_overhead"] += overhead
            if accounts[index - 1].status in INTERRUPTED and account.first_step_unix is not None:
                restarts.append(account.first_step_unix - account.start_unix)
        kept = _kept_step(account, later, [e for e in own if e["event"] in COMMITS])
        if kept[2] and kept[0] is not None and account.last_step is not None and account.last_step > kept[0]:
            # Steps are redone only once a later attempt resumed from before them (with or without time reports).
            account.lost_steps, account.cut_back_to = account.last_step - kept[0], kept[1]
        if account.first_step_unix is not None:
            _split_training(account, own, kept[:2], totals, idle)
        if later:
            idle["downtime_between_attempts"] += later[0].start_unix - account.end_unix

    end = accounts[-1].end_unix
    elapsed = end - run_start
    attributed = sum(v for k, v in totals.items() if k != "idle_other") + sum(idle.values())
    idle["unattributed"] = elapsed - attributed
    totals["idle_other"] = sum(idle.values())
    interrupted = [a for a in accounts if a.status in INTERRUPTED]
    exposure = elapsed - idle["downtime_between_attempts"]
    return Ledger(
        run_start_unix=run_start,
        end_unix=end,
        elapsed_s=elapsed,
        buckets=totals,
        idle_breakdown=idle,
        goodput=totals["productive"] / elapsed if elapsed > 0 else 0.0,
        interruptions=len(interrupted),
        mean_time_between_interruptions_s=exposure / len(interrupted) if interrupted else None,
        mean_restart_s=sum(restarts) / len(restarts) if restarts else None,
        lost_steps=sum(a.lost_steps for a in accounts),
        attempts=accounts,
        redone_steps={tier: sum(a.lost_steps for a in accounts if a.cut_back_to == tier) for tier in REDONE_FROM},
    )


def _split_training(
    account: AttemptAccount,
    own: list[Mapping[str, Any]],
    kept_at: tuple[int | None, str | None],
    totals: dict[str, float],
    idle: dict[str, float],
) -> None:
    """Divide one attempt's time from its first step to its end into useful, lost and tail."""
    assert account.first_step_unix is not None
    first = account.first_step_unix
    own_commits = [e for e in own if e["event"] in COMMITS]
    last_activity = max(
        [e["wall_time"] for e in own if e["event"] not in ("attempt_end", "attempt_crashed")]
        + [_last_beat(own) or first]
    )
    last_activity = min(max(last_activity, first), account.end_unix)
    kept_step = kept_at[0]
    last_step = account.last_step if account.last_step is not None else kept_step
    if kept_step is None or (last_step is not None and last_step <= kept_step):
        # Nothing it trained was thrown away.
        useful_end = last_activity
        waits = _data_wait(own, None)
        tail = account.end_unix - useful_end
        idle["tail_after_last_step"] += tail
    else:
        kept = [e for e in own_commits if e.get("step") == kept_step]
        # Nothing this attempt did survives unless the kept checkpoint was committed by it.
        useful_end = min(kept[-1]["wall_time"], account.end_unix) if kept else first
        waits = _data_wait(own, kept_step) if kept else 0.0
        lost = account.end_unix - useful_end
        totals["lost_progress"] += lost
        account.seconds["lost_progress"] = lost
        tail = 0.0

    def blocking(event: str) -> float:
        return sum(
            float(e["payload"].get("blocking_s") or 0.0)
            for e in own_commits
            if e["event"] == event and first <= e["wall_time"] <= useful_end
        )

    saves, snapshots = blocking("ckpt_committed"), blocking("snapshot_committed")
    evals = sum(
        float(e["payload"].get("seconds") or 0.0)
        for e in own
        if e["event"] == "eval" and first <= e["wall_time"] <= useful_end
    )
    productive = (useful_end - first) - saves - snapshots - evals - waits
    totals["checkpoint_save"] += saves
    totals["snapshot_overhead"] += snapshots
    totals["evaluation"] += evals
    totals["data_wait"] += waits
    totals["productive"] += productive
    account.seconds.update(
        productive=productive,
        checkpoint_save=saves,
        snapshot_overhead=snapshots,
        evaluation=evals,
        data_wait=waits,
        tail=tail,
    )


def _last_beat(own: list[Mapping[str, Any]]) -> float | None:
    beats = [e["payload"].get("last_beat_unix") for e in own if e["event"] == "progress"]
    return max((b for b in beats if b), default=None)


def _data_wait(own: list[Mapping[str, Any]], kept_step: int | None) -> float:
    """The attempt's data wait up to the kept commit (interrupted attempts), or in total."""
    reports = [e["payload"] for e in own if e["event"] == "progress"]
    if kept_step is not None:
        # Reported at the first batch after that commit, with the counters as they stood at the commit.
        at_commit = [r for r in reports if r.get("commit_step") == kept_step]
        # A step snapshot has no report of its own (one per snapshot would be I/O on the hot path): the
        # newest report from before it is the data wait known by then, a lower bound.
        reports = at_commit or [r for r in reports if r.get("step") is not None and int(r["step"]) <= kept_step]
    if not reports:
        return 0.0
    return float(max(reports, key=lambda r: r.get("batches", 0)).get("data_wait_s") or 0.0)
