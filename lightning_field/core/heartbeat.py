"""Heartbeats: where an attempt was (rank 0, for the ledger) and where each rank is (for the hang watchdog).

A SIGKILL leaves no last event, and fsyncing an event every step would put I/O on the hot path.
The heartbeat is a small file mapped into memory (``MAP_SHARED``): each step stores a few numbers
into it, which the kernel already holds in its page cache, so they survive the process being
killed. The next attempt reads the dead attempt's heartbeat and records it in the event log as
``attempt_crashed`` (last step, last step's wall time, counters), so the ledger knows exactly how
much work the kill destroyed.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
from enum import IntEnum
from pathlib import Path
from typing import Any

from lightning_field.core.layout import HEARTBEAT_RELPATH as HEARTBEAT_DIR


class Phase(IntEnum):
    """Where a rank's training thread is: each rank's heartbeat record names it (the hang watchdog's
    timeouts depend on it, profiling/hang_rule.py; the no-progress guard says where a crash loop died)."""

    STARTING = 0
    FORWARD = 1
    BACKWARD = 2
    OPTIMIZER = 3
    BETWEEN_STEPS = 4
    SAVING = 5
    EPOCH_EDGE = 6
    VALIDATION_EDGE = 7
    VALIDATING = 8
    FINISHING = 9

    @property
    def label(self) -> str:
        return _LABELS[self]


_LABELS = {
    Phase.STARTING: "starting (restore, sanity check, loaders, before the first batch)",
    Phase.FORWARD: "the training step (forward)",
    Phase.BACKWARD: "backward",
    Phase.OPTIMIZER: "the optimizer step",
    Phase.BETWEEN_STEPS: "between batches (callbacks, the next batch's fetch)",
    Phase.SAVING: "a checkpoint save",
    Phase.EPOCH_EDGE: "an epoch's end or start",
    Phase.VALIDATION_EDGE: "validation's start or end",
    Phase.VALIDATING: "validation",
    Phase.FINISHING: "the end of training",
}


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


# ---------------------------------------------------------------------- per-rank progress records
# The hang watchdog's heartbeats (profiling/watchdog.py): one small file per rank, published by that
# rank's watchdog thread (never by the training thread), read by the other ranks' watchdogs without a
# collective. Each is rewritten in place at a fixed size (JSON padded with spaces), opened and closed
# at every publication: NFS's close-to-open consistency then shows it to readers on other hosts, which
# also open it afresh. A reader may catch a write half done; that read is refused and the next is used.

RANK_RECORD_FORMAT = "lightning_field.rank_heartbeat/1"
RANK_RECORD_BYTES = 2048
_RECORD_FIELDS: dict[str, tuple[type, ...]] = {
    "format": (str,),
    "token": (str,),
    "rank": (int,),
    "host": (str,),
    "pid": (int,),
    "published": (int,),
    "marks": (int,),
    "step": (int,),
    "phase": (str,),
    "no_progress_s": (int, float),
    "timeout_s": (int, float),
    "declared": (int,),
    "stacks": (int,),
}


def rank_heartbeat_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(run_dir) / HEARTBEAT_DIR / f"rank-{rank:05d}.json"


def rank_stacks_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """Where a rank's watchdog writes its process's Python stacks (faulthandler) when it sees a hang."""
    return Path(run_dir) / HEARTBEAT_DIR / f"rank-{rank:05d}-stacks.txt"


def write_rank_record(path: str | os.PathLike[str], record: dict[str, Any]) -> None:
    """Publish ``record`` in place (fields of :data:`_RECORD_FIELDS`, ``format`` added).

    Raises:
        ValueError: the record does not fit in :data:`RANK_RECORD_BYTES`.
        OSError: the file could not be written.
    """
    data = json.dumps({"format": RANK_RECORD_FORMAT, **record}).encode()
    if len(data) >= RANK_RECORD_BYTES:
        raise ValueError(f"a rank heartbeat record must fit in {RANK_RECORD_BYTES} bytes, got {len(data)}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, data.ljust(RANK_RECORD_BYTES - 1) + b"\n", 0)
    finally:
        os.close(fd)


def read_rank_record(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """A rank's last published record, or None: absent, caught mid-write, or not a record of this
    format (the file lives in storage others can write, so every field is checked)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(RANK_RECORD_BYTES + 1)
    except OSError:
        return None
    if len(raw) > RANK_RECORD_BYTES:
        return None
    try:
        record = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(record, dict) or record.get("format") != RANK_RECORD_FORMAT:
        return None
    for name, types in _RECORD_FIELDS.items():
        value = record.get(name)
        if isinstance(value, bool) or not isinstance(value, types):
            return None
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, str) and len(value) > 256:
            return None
    return record
