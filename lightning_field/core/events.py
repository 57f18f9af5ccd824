"""The run's append-only event log (``<run>/field/events.jsonl``): the single source of time accounting.

Each line is one JSON object, appended and fsynced by global rank 0, so it survives SIGKILL. A crash
leaves no ``attempt_end``; the next process's ``attempt_start`` marks the interruption.
"""

from __future__ import annotations

import json
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


def read_events(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All complete events of the run."""
    return read_jsonl(Path(run_dir) / EVENTS_RELPATH)


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

    def emit(self, event: str, step: int | None = None, payload: dict[str, Any] | None = None) -> None:
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
            os.fsync(fd)
        finally:
            os.close(fd)

    def end(self, status: str, step: int | None = None) -> None:
        self.emit("attempt_end", step=step, payload={"status": status})
