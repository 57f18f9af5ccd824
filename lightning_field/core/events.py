"""The run's append-only event log (``<run>/field/events.jsonl``): the single source of time accounting.

Each line is one JSON object, appended and fsynced by global rank 0, so it survives SIGKILL. A crash
leaves no ``attempt_end``; the next process's ``attempt_start`` marks the interruption.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

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


class EventLog:
    """Appends events for one attempt of a run. Construct on global rank 0 only.

    Opening the log in a process without an open attempt appends ``attempt_start``; every later
    opener in the same process joins that attempt until ``end`` closes it, so several callbacks
    share one attempt and a second ``fit`` in the same process starts a new one.
    """

    def __init__(
        self, run_dir: str | os.PathLike[str], run_id: str | None = None, world_size: int | None = None
    ) -> None:
        self.path = Path(run_dir) / EVENTS_RELPATH
        self.path.parent.mkdir(parents=True, exist_ok=True)
        previous = read_events(run_dir)
        self.run_id = run_id or next((e["run_id"] for e in previous if "run_id" in e), None) or os.urandom(6).hex()
        starts = [e for e in previous if e.get("event") == "attempt_start"]
        # A restarted job can get the dead one's PID (containers): the process start tells them apart.
        mine = [e for e in starts if _same_process(e.get("payload", {}))]
        ended = {e["attempt"] for e in previous if e.get("event") == "attempt_end"}
        if mine and mine[-1]["attempt"] not in ended:
            self.attempt = int(mine[-1]["attempt"])
        else:
            self.attempt = len(starts) + 1
            self.emit(
                "attempt_start",
                payload={"pid": os.getpid(), "process_start_unix": process_start_unix(), "world_size": world_size},
            )

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
