"""The run's summary across attempts, independent of W&B: time to quality, goodput, interruptions
and stragglers, from the event log and the callbacks' files. ``WandbReview`` writes it into the W&B
summary; anything else can read it the same way.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning_field.core.events import read_jsonl, read_run_events
from lightning_field.core.layout import PROFILE_RELPATH
from lightning_field.profiling.straggler import StragglerMonitor
from lightning_field.quality.ledger import BUCKETS, goodput_ledger
from lightning_field.quality.target import quality_summary

log = logging.getLogger(__name__)


def field_summary(
    run_dir: str | os.PathLike[str],
    quality: Mapping[str, Any] | None = None,
    straggler: StragglerMonitor | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """The ``field/`` summary of a run, from what it left on disk (all attempts) and live callbacks.

    * Time to quality, whenever ``TimeToQuality`` ran in any attempt (its ``run_start`` event): the
      ``field/time_to_target_*`` keys are always present and null until the target is reached, so a
      missing target reads as "not reached", never as "not measured". ``quality``: a final
      ``TimeToQuality.summary`` to reuse, so W&B and ``time_to_quality.json`` agree to the digit.
    * Goodput, interruptions and lost steps, whenever the run has an event log.
    * Straggler flags (every attempt's ``straggler`` events) and MFU, whenever ``StragglerMonitor`` ran;
      ``field/mfu`` is null where the device's peak FLOP/s is unknown (CPUs).
    """
    run_dir = Path(run_dir)
    now = time.time() if now is None else now
    events = read_run_events(run_dir)
    out: dict[str, Any] = {"field/run_dir": os.fspath(run_dir)}
    if events:
        ledger = goodput_ledger(events, now=now)
        run_start = next((e for e in events if e.get("event") == "run_start"), None)
        if quality is None and run_start is not None:
            p = run_start.get("payload", {})
            quality = quality_summary(
                events,
                p["monitor"],
                float(p["target"]),
                p.get("mode", "min"),
                p.get("price_per_device_hour"),
                p.get("deadline_s"),
                now,
                ledger,
            )
        goodput = (quality or {}).get("goodput") or {
            "goodput": ledger.goodput,
            "elapsed_s": ledger.elapsed_s,
            "buckets_s": ledger.buckets,
            "interruptions": ledger.interruptions,
            "lost_steps": ledger.lost_steps,
            "redone_steps": ledger.redone_steps,
            "attempts": ledger.attempts,
        }
        out["field/goodput"] = goodput["goodput"]
        out["field/elapsed_s"] = goodput["elapsed_s"]
        for bucket in BUCKETS:
            out[f"field/goodput/{bucket}_s"] = goodput["buckets_s"].get(bucket)
        out["field/interruptions"] = goodput["interruptions"]
        out["field/lost_steps"] = goodput["lost_steps"]
        for tier, steps in (goodput.get("redone_steps") or {}).items():  # absent from summaries of earlier versions
            out[f"field/redone_steps/{tier}"] = steps
        out["field/attempts"] = len(goodput["attempts"])
    if quality:
        reached = quality.get("reached") or {}
        so_far = quality.get("so_far") or {}
        out.update(
            {
                "field/monitor": quality.get("monitor"),
                "field/target": quality.get("target"),
                "field/target_reached": bool(reached),
                "field/target_step": reached.get("step"),
                "field/time_to_target_s": reached.get("wall_s"),
                "field/time_to_target_device_hours": reached.get("device_hours"),
                "field/time_to_target_cost": reached.get("cost"),
                "field/device_hours": so_far.get("device_hours"),
                "field/cost": so_far.get("cost"),
            }
        )
        deadline = quality.get("deadline_s")
        if deadline is not None:
            # Reached: whether in time. Not reached: missed once the clock is past it, else still open (null).
            passed = (so_far.get("wall_s") or 0.0) > deadline
            out["field/deadline_met"] = quality.get("deadline_met") if reached else (False if passed else None)
    out.update(_straggler_summary(run_dir, events, straggler))
    return out


def _straggler_summary(run_dir: Path, events: list[dict[str, Any]], monitor: StragglerMonitor | None) -> dict[str, Any]:
    reports_file = run_dir / PROFILE_RELPATH / "reports.jsonl"
    flagged_events = [e for e in events if e.get("event") == "straggler"]
    if monitor is None and not flagged_events and not reports_file.is_file():
        return {}
    flags = [f for e in flagged_events for f in e.get("payload", {}).get("flagged", [])]
    if monitor is not None:
        flags += [vars(f) for report in monitor.reports for f in report.flagged]
    named = sorted({(int(f["rank"]), str(f.get("host")), str(f["section"])) for f in flags})
    latest: Mapping[str, Any] | None = monitor.report.to_dict() if monitor is not None and monitor.report else None
    if latest is None and reports_file.is_file():
        reports = read_jsonl(reports_file)
        latest = reports[-1] if reports else None
    mfus = [r["mfu"] for r in ((latest or {}).get("throughput") or {}).get("per_rank", []) if r.get("mfu") is not None]
    mfus.sort()
    median = None
    if mfus:
        mid = len(mfus) // 2
        median = mfus[mid] if len(mfus) % 2 else (mfus[mid - 1] + mfus[mid]) / 2
    return {
        "field/straggler_flags": len(named),
        "field/straggler_flagged": [f"rank {r} ({host}): {section}" for r, host, section in named],
        "field/mfu": median,
    }
