"""The run directory's append-only event log (``<run>/field/events.jsonl``): the single source of time
accounting.

Each line is one JSON object, appended and fsynced by global rank 0, so it survives SIGKILL. A crash
leaves no ``attempt_end``; the next process's ``attempt_start`` marks the interruption.

One log can hold several runs: scripts that share a run directory (the working directory, where no
``default_root_dir`` is given) are not one run. A *run* is a lineage of attempts. An attempt starts a
new run id, unless it is a restart of the same scheduler job (``SLURM_RESTART_COUNT``,
``TORCHELASTIC_RESTART_COUNT``), which continues that job's run. An attempt that resumes a checkpoint
joins the run that wrote it (``attempt_joined``; the run id travels in the manifest's provenance).
Readers account for one run: :func:`select_run`, by default the newest attempt's.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from lightning_field.core.launcher_env import job_identity, restart_of
from lightning_field.core.layout import EVENTS_RELPATH


def process_start_unix() -> float | None:
    """When this process started (Linux ``/proc``, to about 10 ms), so restart overhead includes
    interpreter start-up and imports, which happen before any of our code runs; None elsewhere."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, counted after the command name
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def _same_process(payload: dict[str, Any]) -> bool:
    if payload.get("pid") != os.getpid():
        return False
    # Read now, not at import: a process forked from one that imported this module (a fork server,
    # a warm worker pool) started when it was forked.
    started, own = payload.get("process_start_unix"), process_start_unix()
    return started is None or own is None or abs(started - own) < 1.0


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every complete line of an append-only JSON-lines file; a torn line (a crash mid-append) is skipped."""
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


class EventLogError(ValueError):
    """The event log holds a line that is JSON but not an event: it was written by something else."""


def read_events(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All complete events of the run, each checked for the shape :class:`EventLog` writes (a torn
    last line, from a crash mid-append, is skipped as :func:`read_jsonl` does).

    Raises:
        EventLogError: naming the file and line, for a line that parses but is not an event.
    """
    path = Path(run_dir) / EVENTS_RELPATH
    events = read_jsonl(path)
    for number, event in enumerate(events, start=1):
        if (problem := _event_problem(event)) is not None:
            raise EventLogError(f"{path}: event {number} is not an event this library writes ({problem})")
    return events


# Payload fields the accounting reads as numbers (quality/ledger.py): one of another type would
# otherwise surface as a TypeError deep inside the ledger, long after the log was read.
NUMERIC_PAYLOAD_KEYS = frozenset(
    {
        "attempt",
        "step",
        "commit_step",
        "batches",
        "devices",
        "world_size",
        "seconds",
        "blocking_s",
        "data_wait_s",
        "eval_s",
        "first_step_unix",
        "last_beat_unix",
        "process_start_unix",
    }
)


def _is_finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**53


def _event_problem(event: Any) -> str | None:
    """Why ``event`` is not of the shape :meth:`EventLog.emit` writes, or None."""
    if not isinstance(event, dict):
        return "not a JSON object"
    if not isinstance(event.get("event"), str):
        return "no event name"
    if not _is_finite_number(event.get("wall_time")):
        return "wall_time is not a finite number"
    if event.get("monotonic") is not None and not _is_finite_number(event["monotonic"]):
        return "monotonic is not a finite number"
    if not _is_count(event.get("attempt")):
        return "attempt is not a count"
    if event.get("step") is not None and not _is_count(event["step"]):
        return "step is not a count"
    payload = event.get("payload")
    if not isinstance(payload, dict):
        return "its payload is not an object"
    for key in NUMERIC_PAYLOAD_KEYS & set(payload):
        if payload[key] is not None and not _is_finite_number(payload[key]):
            return f"payload.{key} is not a finite number"
    if "status" in payload and not isinstance(payload["status"], str):
        return "payload.status is not text"
    return None


# ---------------------------------------------------------------------------------------------- runs
def run_of_attempts(events: Iterable[Mapping[str, Any]]) -> dict[int, str]:
    """Which run each attempt belongs to: the run it joined on resume (its last ``attempt_joined``),
    else the one its ``attempt_start`` names. A log written before runs were told apart names one run
    id throughout, so it reads as one run, as it was accounted then."""
    started: dict[int, str] = {}
    joined: dict[int, str] = {}
    for event in events:
        attempt, run_id = event.get("attempt"), event.get("run_id")
        if not isinstance(attempt, int):
            continue
        if event.get("event") == "attempt_joined" and isinstance(event["payload"].get("run_id"), str):
            joined[attempt] = event["payload"]["run_id"]
        elif event.get("event") == "attempt_start" and isinstance(run_id, str):
            started[attempt] = run_id
        elif isinstance(run_id, str):
            started.setdefault(attempt, run_id)
    return {**started, **joined}


def runs_in(events: Iterable[Mapping[str, Any]]) -> dict[str, list[int]]:
    """Each run id in the log with its attempts, in the order the runs began."""
    runs: dict[str, list[int]] = {}
    for attempt, run_id in sorted(run_of_attempts(events).items()):
        runs.setdefault(run_id, []).append(attempt)
    return runs


class UnknownRunError(ValueError):
    """A run id was asked for that the event log does not hold."""


def select_run(events: Iterable[dict[str, Any]], run_id: str | None = None) -> list[dict[str, Any]]:
    """The events of one run: ``run_id``'s, by default the run of the newest attempt (the one running,
    or the last to run). An event of an attempt the log names no run for (one still being written)
    belongs to no other run, so it is kept with the newest.

    Raises:
        UnknownRunError: ``run_id`` is not in the log; the message lists those that are.
    """
    listed = list(events)  # the events themselves, not copies: a long run's log holds one per step
    runs = run_of_attempts(listed)
    if not runs:
        if run_id is not None:
            raise UnknownRunError(f"run {run_id!r} is not in the event log, which names no run")
        return listed
    newest = runs[max(runs)]
    chosen = newest if run_id is None else run_id
    if chosen not in runs.values():
        raise UnknownRunError(f"run {run_id!r} is not in the event log; its runs: {', '.join(runs_in(listed))}")
    return [e for e in listed if runs.get(e["attempt"], newest) == chosen]


def read_run_events(run_dir: str | os.PathLike[str], run_id: str | None = None) -> list[dict[str, Any]]:
    """:func:`read_events` narrowed to one run (:func:`select_run`)."""
    return select_run(read_events(run_dir), run_id)


def _continued_run(previous: list[dict[str, Any]], environ: Mapping[str, str]) -> str | None:
    """The run a restart of the same scheduler job continues: the run of that job's newest attempt."""
    job = job_identity(environ)
    if job is None or restart_of(environ) is None:
        return None
    runs = run_of_attempts(previous)
    for event in reversed(previous):
        if event.get("event") == "attempt_start" and event["payload"].get("job") == job:
            return runs.get(event["attempt"])
    return None


def new_run_id() -> str:
    return os.urandom(6).hex()


class EventLog:
    """Appends events for one attempt of a run. Construct on global rank 0 only.

    Opening the log in a process without an open attempt appends ``attempt_start``; every later
    opener in the same process joins that attempt until ``end`` closes it, so several callbacks
    share one attempt and a second ``fit`` in the same process starts a new one. A new attempt's run
    id is ``run_id`` where given; else, for one that does not train (``trains=False``), the run of this
    process's previous attempt; else its scheduler job's run where it is a restart of that job; else a
    new one. :meth:`join` moves the attempt to the run of the checkpoint it resumed or evaluates.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        run_id: str | None = None,
        world_size: int | None = None,
        environ: Mapping[str, str] | None = None,
        trains: bool = True,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / EVENTS_RELPATH
        self.path.parent.mkdir(parents=True, exist_ok=True)
        previous = read_events(run_dir)
        environ = os.environ if environ is None else environ
        starts = [e for e in previous if e.get("event") == "attempt_start"]
        # A restarted job can get the dead one's PID (containers): the process start tells them apart.
        mine = [e for e in starts if _same_process(e.get("payload", {}))]
        ended = {e["attempt"] for e in previous if e.get("event") == "attempt_end"}
        if mine and mine[-1]["attempt"] not in ended:
            self.attempt = int(mine[-1]["attempt"])
            self.run_id = run_id or run_of_attempts(previous).get(self.attempt) or new_run_id()
        else:
            self.attempt = len(starts) + 1
            # An attempt that only evaluates (validate, test, predict) after this process trained belongs
            # to the run it evaluates, as a second fit that resumes would (join); a new fit starts a new run.
            evaluates = None if trains or not mine else run_of_attempts(previous).get(int(mine[-1]["attempt"]))
            self.run_id = run_id or evaluates or _continued_run(previous, environ) or new_run_id()
            payload = {
                "pid": os.getpid(),
                "process_start_unix": process_start_unix(),
                "world_size": world_size,
                "job": job_identity(environ),
            }
            self.emit("attempt_start", payload=payload)

    def join(self, run_id: str) -> None:
        """This attempt resumed a checkpoint that run ``run_id`` wrote: from now on it is that run's
        attempt, for this log and every reader of it (``attempt_joined``)."""
        if run_id == self.run_id:
            return
        was, self.run_id = self.run_id, run_id
        self.emit("attempt_joined", payload={"run_id": run_id, "instead_of": was})

    def follow(self) -> None:
        """Take up the run another opener in this process moved the attempt to (:meth:`join`)."""
        self.run_id = run_of_attempts(read_events(self.run_dir)).get(self.attempt, self.run_id)

    def emit(
        self, event: str, step: int | None = None, payload: dict[str, Any] | None = None, durable: bool = True
    ) -> None:
        """Append one event. ``durable=False`` skips the fsync, for events as frequent as steps (a
        snapshot's commit, every step): appended, it still outlives a killed process (the page
        cache does), just not the machine, as the snapshot it records does not either."""
        record = {
            "run_id": self.run_id,
            "attempt": self.attempt,
            "event": event,
            "wall_time": time.time(),
            "monotonic": time.monotonic(),
            "step": step,
            "payload": payload or {},
        }
        line = (json.dumps(record, default=str) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)

    def end(self, status: str, step: int | None = None) -> None:
        self.emit("attempt_end", step=step, payload={"status": status})
