"""Sources a training run writes into its own directory: checkpoints, the profile, the event log, time to quality.

Each collector adds the sources it finds to the ``Collection`` and the figures read from them, or
says in ``not_found`` what it looked for. These sources record no identity of their own, so each
takes the identity of the run directory it sits in (``run_identity``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning_field.checkpoint.resolver import committed_checkpoints, latest_recoverable
from lightning_field.checkpoint.verify import verify_checkpoint
from lightning_field.core.events import read_jsonl, read_run_events
from lightning_field.core.layout import EVENTS_RELPATH, PROFILE_RELPATH, SUMMARY_RELPATH
from lightning_field.core.storage import basename
from lightning_field.quality.ledger import goodput_ledger
from lightning_field.record.identity import identity_from_provenance
from lightning_field.record.sources import Collection, Source, modified


def collect_checkpoints(col: Collection, run_dir: Path, keys: Sequence[str], verify_all: bool) -> None:
    root = run_dir / "checkpoints"
    # A local root: every entry's path is a Path; only entries with a readable manifest count.
    entries = [(Path(e.path), e.manifest) for e in committed_checkpoints(root) if e.manifest is not None]
    if not entries:
        col.not_found.append(f"{root}: no committed checkpoint")
        return
    resume_point = latest_recoverable(root)
    tested = [m for _, m in entries if m.restore_tested]
    failed = [m for _, m in entries if (m.restore_drill or {}).get("outcome") == "mismatch"]
    population = f"{len(entries)} committed checkpoint(s) of {run_dir}"
    newest_source: Source | None = None
    for index, (path, m) in enumerate(entries):
        identity, projection = identity_from_provenance(m.provenance, keys)
        source = col.add_source(
            "checkpoint", path / "manifest.json", m.created_unix, "manifest created_unix", identity, projection
        )
        newest = index == 0
        newest_source = newest_source or source
        if newest or verify_all:
            report = verify_checkpoint(path)
            col.add_figure(
                source,
                "checkpoint_intact",
                f"checkpoint {path.name}: every file matches its manifest",
                report.intact,
                None,
                f"{len(m.files)} file(s), {sum(f.size for f in m.files.values())} bytes",
                "files listed in the manifest",
                [] if report.intact else report.problems,
            )
        if newest:
            col.add_figure(
                source,
                "newest_checkpoint",
                "newest committed checkpoint",
                {
                    "name": path.name,
                    "step": m.step,
                    "world_size": m.world_size,
                    "recoverable": m.recoverable,
                    "missing": list(m.missing),
                    "restore_tested": m.restore_tested,
                    "resume_point": basename(resume_point) if resume_point else None,
                },
                None,
                population,
                "the newest by step",
            )
        if m.restore_drill:
            drill = m.restore_drill
            col.add_figure(
                source,
                "restore_drill",
                f"restore drill of {path.name}",
                {
                    "checkpoint": path.name,
                    "step": m.step,
                    "outcome": drill.get("outcome"),
                    "passed": bool(drill.get("passed")),
                    "seconds": drill.get("seconds"),
                },
                None,
                "one replay of the step after the checkpoint, in a fresh process",
                f"{len(tested)} of {len(entries)} committed checkpoints restore-tested, {len(failed)} failed",
                ["A drill replays one step in one process."],
                date_unix=drill.get("finished_unix"),
            )
    saves = [float(m.save_seconds) for _, m in entries if m.save_seconds is not None]
    if saves and newest_source is not None:
        col.add_figure(
            newest_source,
            "median_save_seconds",
            "blocking checkpoint save (median)",
            statistics.median(saves),
            "s",
            population,
            f"{len(saves)} saves",
        )


def collect_profile(col: Collection, run_dir: Path, identity: dict[str, Any], projection: Any, basis: str) -> None:
    path = run_dir / PROFILE_RELPATH / "reports.jsonl"
    reports = read_jsonl(path)
    if not reports:
        col.not_found.append(f"{path}: no straggler/throughput reports")
        return
    source = col.add_source(
        "profile",
        path,
        modified(path),
        "file modification time (reports carry steps, not dates)",
        identity,
        projection,
        [f"Identity taken from the run directory: {basis}."],
    )
    ranks = sorted({int(r["rank"]) for rep in reports for r in rep.get("ranks", [])})
    steps = [int(rep["step"]) for rep in reports]
    population = f"{len(reports)} report(s), steps {min(steps)}..{max(steps)}, {len(ranks)} rank(s)"
    flagged = [
        {"index": i, "step": rep["step"], "flags": rep.get("flagged") or []}
        for i, rep in enumerate(reports)
        if rep.get("flagged")
    ]
    col.add_figure(
        source,
        "straggler_reports",
        "straggler flags per report",
        {"reports": len(reports), "flagged": flagged},
        None,
        population,
        "reports",
    )
    throughput = [
        sum(r.get("samples_per_s") or 0.0 for r in (rep.get("throughput") or {}).get("per_rank", [])) for rep in reports
    ]
    col.add_figure(
        source,
        "samples_per_s",
        "throughput, all ranks (median over reports)",
        statistics.median(throughput),
        "samples/s",
        population,
        "reports",
        ["Report intervals include checkpoint saves and evaluation."],
    )
    mfus = [
        r["mfu"]
        for rep in reports
        for r in (rep.get("throughput") or {}).get("per_rank", [])
        if r.get("mfu") is not None
    ]
    peak_source = next(((rep.get("throughput") or {}).get("peak_source") for rep in reports), None)
    col.add_figure(
        source,
        "mfu",
        "model FLOP utilisation (median over ranks and reports)",
        statistics.median(mfus) if mfus else None,
        "fraction",
        population,
        "rank-reports",
        [] if mfus else [f"MFU not reported: {peak_source}"],
    )
    shares = [
        r["exposed_comm_s"] / r["step_s"]
        for rep in reports
        for r in rep.get("ranks", [])
        if r.get("step_s") and r.get("exposed_comm_s") is not None
    ]
    col.add_figure(
        source,
        "exposed_comm_share",
        "exposed communication, share of step time (median)",
        statistics.median(shares) if shares else None,
        "fraction",
        population,
        "rank-reports",
        [] if len(ranks) > 1 else ["One rank: no collective to expose."],
    )
    peaks = [r.get("peak_memory_bytes") for rep in reports for r in rep.get("ranks", []) if r.get("peak_memory_bytes")]
    if peaks:
        col.add_figure(
            source, "peak_memory_bytes", "peak memory (max over ranks)", max(peaks), "bytes", population, "rank-reports"
        )
    col.plots["throughput"] = [
        (int(rep["step"]), t, bool(rep.get("flagged"))) for rep, t in zip(reports, throughput, strict=True)
    ]


def collect_quality(col: Collection, run_dir: Path, identity: dict[str, Any], projection: Any, basis: str) -> None:
    events_path = run_dir / EVENTS_RELPATH
    events = read_run_events(run_dir)
    limits = [f"Identity taken from the run directory: {basis}."]
    if events:
        last = max(float(e.get("wall_time") or 0.0) for e in events)
        source = col.add_source("events", events_path, last, "last event", identity, projection, limits)
        ledger = goodput_ledger(events)
        attempts = len(ledger.attempts)
        pop = f"{attempts} attempt(s), {ledger.interruptions} interruption(s), {ledger.elapsed_s:.1f} s elapsed"
        col.add_figure(
            source,
            "goodput",
            "goodput (productive share of wall time)",
            ledger.goodput,
            "fraction",
            pop,
            "wall time from the first run_start to the end of the last attempt",
        )
        col.add_figure(
            source,
            "goodput_buckets",
            "where the wall time went",
            dict(ledger.buckets),
            "s",
            pop,
            "wall time, buckets sum to it",
        )
        col.add_figure(source, "interruptions", "interruptions", ledger.interruptions, None, pop, "attempts")
        col.plots["goodput"] = dict(ledger.buckets)
        col.plots["quality_events"] = [
            (int(e["step"]), e["payload"].get("metrics", {})) for e in events if e.get("event") == "eval"
        ]
    else:
        col.not_found.append(f"{events_path}: no event log")
    path = run_dir / SUMMARY_RELPATH
    if not path.is_file():
        col.not_found.append(f"{path}: no time-to-quality summary")
        return
    summary = col.read_json(path)
    if not isinstance(summary, dict):
        return
    source = col.add_source(
        "time_to_quality", path, modified(path), "file modification time", identity, projection, limits
    )
    reached = summary.get("reached")
    pop = f"{summary.get('evaluations')} evaluation(s) of {summary.get('monitor')}"
    denom = "wall time from the run's first start, every attempt and the downtime between them"
    forecast = summary.get("forecast") or {}
    col.add_figure(
        source,
        "time_to_quality",
        f"time to {summary.get('monitor')} {'<=' if summary.get('mode') == 'min' else '>='} {summary.get('target')}",
        {
            "monitor": summary.get("monitor"),
            "target": summary.get("target"),
            "mode": summary.get("mode"),
            "reached": bool(reached),
            "step": (reached or {}).get("step"),
            "wall_s": (reached or {}).get("wall_s"),
            "device_hours": (reached or {}).get("device_hours"),
            "cost": (reached or {}).get("cost"),
            "deadline_s": summary.get("deadline_s"),
            "deadline_met": summary.get("deadline_met"),
            "forecast_available": forecast.get("available"),
            "forecast_reason": forecast.get("reason"),
            "forecast_seconds": forecast.get("seconds_to_target"),
            "deadline_miss_probability": forecast.get("deadline_miss_probability"),
        },
        None,
        pop,
        denom,
        [] if reached else ["Not reached: the figure is a forecast."],
        estimate=not reached,
    )
    so_far = summary.get("so_far") or {}
    col.add_figure(
        source,
        "cost_so_far",
        "device-hours and cost so far",
        {
            "device_hours": so_far.get("device_hours"),
            "cost": so_far.get("cost"),
            "price_per_device_hour": summary.get("price_per_device_hour"),
        },
        None,
        pop,
        denom,
    )
    col.plots["target"] = (summary.get("monitor"), summary.get("target"))
