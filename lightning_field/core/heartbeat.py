"""A per-attempt heartbeat: where the attempt was, updated every step without a system call.

A SIGKILL leaves no last event, and fsyncing an event every step would put I/O on the hot path.
The heartbeat is a small file mapped into memory (``MAP_SHARED``): each step stores a few numbers
into it, which the kernel already holds in its page cache, so they survive the process being
killed. The next attempt reads the dead attempt's heartbeat and records it in the event log as
``attempt_crashed`` (last step, last step's wall time, counters), so the ledger knows exactly how
much work the kill destroyed.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path
from typing import Any

from lightning_field.core.layout import HEARTBEAT_RELPATH as HEARTBEAT_DIR

_MAGIC = b"LFHB0001"
# magic, attempt, step, first_step_unix, last_beat_unix, data_wait_s, eval_s, batches
_LAYOUT = struct.Struct("<8sqqddddq")
FIELDS = ("attempt", "step", "first_step_unix", "last_beat_unix", "data_wait_s", "eval_s", "batches")


def heartbeat_path(run_dir: str | os.PathLike[str], attempt: int) -> Path:
    return Path(run_dir) / HEARTBEAT_DIR / f"attempt-{attempt}.bin"


class Heartbeat:
    """Written by global rank 0 only; ``beat`` is a memory store (about a microsecond)."""

    def __init__(self, run_dir: str | os.PathLike[str], attempt: int) -> None:
        path = heartbeat_path(run_dir, attempt)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, mmap.PAGESIZE)
            self._map = mmap.mmap(fd, mmap.PAGESIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.attempt = attempt

    def beat(
        self, step: int, first_step_unix: float, last_beat_unix: float, data_wait_s: float, eval_s: float, batches: int
    ) -> None:
        _LAYOUT.pack_into(
            self._map, 0, _MAGIC, self.attempt, step, first_step_unix, last_beat_unix, data_wait_s, eval_s, batches
        )

    def close(self) -> None:
        if not self._map.closed:
            self._map.close()


def read_heartbeat(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The last beat, or None if the attempt never beat (died before its first step)."""
    try:
        raw = Path(path).read_bytes()[: _LAYOUT.size]
    except OSError:
        return None
    if len(raw) < _LAYOUT.size or not raw.startswith(_MAGIC):
        return None
    values = _LAYOUT.unpack(raw)[1:]
    return dict(zip(FIELDS, values, strict=True))
