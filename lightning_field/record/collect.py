"""Gathering what the other commands wrote into sources and figures.

A *source* is one artifact on disk (a manifest, an evidence bundle, a profile, ...) with its path,
SHA-256, date and identity. A *figure* is one number or finding read from a source, and carries
everything a reader needs to judge it without opening anything else: the source's path and hash,
the configuration hash, the code version, the date, the population and denominator it was measured
on, and its limitations. Figures are plain data so the conditions can be re-evaluated from the
record alone (``field record check``), long after the run directories have moved.
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_field.checkpoint.resolver import committed_checkpoints, latest_recoverable
from lightning_field.checkpoint.verify import verify_checkpoint
from lightning_field.core.events import read_events, read_jsonl
from lightning_field.core.hashing import file_digest, recorded_digest
from lightning_field.core.layout import EVENTS_RELPATH, PLAN_RELPATH, PROFILE_RELPATH, SUMMARY_RELPATH
from lightning_field.evidence.bundle import EVIDENCE_JSON, check_bundle
from lightning_field.quality.ledger import goodput_ledger
from lightning_field.record.identity import (
    code_version,
    comparable_identity,
    identity_from_provenance,
    project_config,
)
from lightning_field.state.secrets import scrub_secrets

RECORD_JSON = "record.json"


class NoSourcesError(ValueError):
    """Nothing the record could be built from was found; the message names every place looked in."""


def iso(unix: float | None) -> str | None:
    if unix is None:
        return None
    return dt.datetime.fromtimestamp(unix, dt.timezone.utc).isoformat(timespec="seconds")


def cited_digest(entry: Mapping[str, Any]) -> str:
    """A cited source's or plot's digest: labelled in format 2 (``digest``), a bare SHA-256 in format 1."""
    return recorded_digest(entry, "digest", "sha256")


@dataclass
class Source:
    """One artifact the record cites. ``identity``: the comparable identity (``record.identity``)."""

    id: str
    kind: str
    path: Path
    digest: str
    size: int
    date_unix: float | None
    date_basis: str
    identity: dict[str, Any]
    config_projection: dict[str, Any] | None
    limitations: list[str] = field(default_factory=list)
    copied_to: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "path": str(self.path),
            "digest": self.digest,
            "size": self.size,
            "date": iso(self.date_unix),
            "date_unix": self.date_unix,
            "date_basis": self.date_basis,
            "identity": self.identity,
            "config_projection": self.config_projection,
            "code_version": code_version(self.identity),
            "limitations": self.limitations,
            "copied_to": self.copied_to,
        }


@dataclass
class Collection:
    """Everything gathered: the released run, the sources, the figures and what was not found."""

    release: dict[str, Any]
    sources: list[Source] = field(default_factory=list)
    figures: list[dict[str, Any]] = field(default_factory=list)
    not_found: list[str] = field(default_factory=list)
    plots: dict[str, Any] = field(default_factory=dict)

    def add_source(
        self,
        kind: str,
        path: Path,
        date_unix: float | None,
        date_basis: str,
        identity: dict[str, Any],
        projection: dict[str, Any] | None,
        limitations: Sequence[str] = (),
    ) -> Source:
        size, digest = path.stat().st_size, file_digest(path)
        source = Source(
            f"S{len(self.sources) + 1}", kind, path.resolve(), digest, size, date_unix, date_basis, identity,
            projection, list(limitations),
        )  # fmt: skip
        self.sources.append(source)
        return source

    def add_figure(
        self,
        source: Source,
        name: str,
        label: str,
        value: Any,
        unit: str | None,
        population: str,
        denominator: str,
        limitations: Sequence[str] = (),
        estimate: bool = False,
        date_unix: float | None = None,
    ) -> dict[str, Any]:
        when = date_unix if date_unix is not None else source.date_unix
        figure = {
            "id": f"{source.id}.{name}",
            "name": name,
            "kind": source.kind,
            "label": label,
            "value": value,
            "unit": unit,
            "estimate": estimate,
            "source": {"id": source.id, "path": str(source.path), "digest": source.digest},
            "config_hash": source.identity.get("config.hash"),
            "code_version": code_version(source.identity),
            "date": iso(when),
            "date_unix": when,
            "population": population,
            "denominator": denominator,
            "limitations": [*source.limitations, *limitations],
        }
        self.figures.append(figure)
        return figure


def _mtime(path: Path) -> float:
    return path.stat().st_mtime


def _read_json(col: Collection, path: Path) -> Any:
    """The file's JSON, or None with the reason listed: unreadable evidence is missing evidence, which
    the conditions then report, rather than a reason to write no record at all."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        col.not_found.append(f"{path}: unreadable ({err})")
        return None


def _hydra_config(run_dir: Path, keys: Sequence[str]) -> dict[str, Any] | None:
    """The projected sections of a Hydra app's composed config (``.hydra/config.yaml``), resolved
    where they can be outside the app (``${hydra:...}`` cannot; such a value stays as written)."""
    path = run_dir / ".hydra" / "config.yaml"
    if not path.is_file():
        return None
    from omegaconf import OmegaConf

    try:
        cfg = OmegaConf.load(path)
    except Exception:  # an unreadable config is an unknown one, which staleness then reports
        return None
    projected: dict[str, Any] = {}
    for key in keys:
        try:
            node = cfg.get(key)
            projected[key] = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
        except Exception:  # unresolvable here: compared as written, which names it if it differs
            projected[key] = OmegaConf.to_container(cfg[key], resolve=False) if OmegaConf.is_config(cfg[key]) else None
    # A Hydra config holds secrets in full; the record gets them as the manifests do (project_config).
    return scrub_secrets(projected)


def _unknown_identity(projection: dict[str, Any] | None) -> dict[str, Any]:
    return comparable_identity({}, projection)


def run_identity(run_dir: Path, keys: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any] | None, str]:
    """(identity, projection, basis) of a run directory: its newest manifest, else its Hydra config."""
    for entry in committed_checkpoints(run_dir / "checkpoints"):
        if entry.manifest is not None:
            identity, projection = identity_from_provenance(entry.manifest.provenance, keys)
            return identity, projection, f"its newest checkpoint manifest ({entry.path.name})"
    projection = _hydra_config(run_dir, keys)
    if projection is not None:
        return _unknown_identity(projection), projection, "its Hydra config (.hydra/config.yaml; no code identity)"
    return _unknown_identity(None), None, "nothing (no manifest, no Hydra config)"


# ---------------------------------------------------------------------------------------------- checkpoints
def collect_checkpoints(col: Collection, run_dir: Path, keys: Sequence[str], verify_all: bool) -> None:
    root = run_dir / "checkpoints"
    entries = [e for e in committed_checkpoints(root) if e.manifest is not None]
    if not entries:
        col.not_found.append(f"{root}: no committed checkpoint")
        return
    resume_point = latest_recoverable(root)
    tested = [e for e in entries if e.manifest.restore_tested]
    failed = [e for e in entries if (e.manifest.restore_drill or {}).get("outcome") == "mismatch"]
    population = f"{len(entries)} committed checkpoint(s) of {run_dir}"
    newest_source: Source | None = None
    for index, entry in enumerate(entries):
        m = entry.manifest
        identity, projection = identity_from_provenance(m.provenance, keys)
        source = col.add_source("checkpoint", entry.path / "manifest.json", m.created_unix, "manifest created_unix",
                                identity, projection)  # fmt: skip
        newest = index == 0
        newest_source = newest_source or source
        if newest or verify_all:
            report = verify_checkpoint(entry.path)
            col.add_figure(
                source, "checkpoint_intact", f"checkpoint {entry.path.name}: every file matches its manifest",
                report.intact, None, f"{len(m.files)} file(s), {sum(f.size for f in m.files.values())} bytes",
                "files listed in the manifest", [] if report.intact else report.problems,
            )  # fmt: skip
        if newest:
            col.add_figure(source, "newest_checkpoint", "newest committed checkpoint",
                           {"name": entry.path.name, "step": m.step, "world_size": m.world_size,
                            "recoverable": m.recoverable, "missing": list(m.missing),
                            "restore_tested": m.restore_tested,
                            "resume_point": resume_point.name if resume_point else None},
                           None, population, "the newest by step")  # fmt: skip
        if m.restore_drill:
            drill = m.restore_drill
            col.add_figure(
                source, "restore_drill", f"restore drill of {entry.path.name}",
                {"checkpoint": entry.path.name, "step": m.step, "outcome": drill.get("outcome"),
                 "passed": bool(drill.get("passed")), "seconds": drill.get("seconds")},
                None, "one replay of the step after the checkpoint, in a fresh process",
                f"{len(tested)} of {len(entries)} committed checkpoints restore-tested, {len(failed)} failed",
                ["A drill replays one step in one process."],
                date_unix=drill.get("finished_unix"),
            )  # fmt: skip
    saves = [float(e.manifest.save_seconds) for e in entries if e.manifest.save_seconds is not None]
    if saves and newest_source is not None:
        col.add_figure(newest_source, "median_save_seconds", "blocking checkpoint save (median)",
                       statistics.median(saves), "s", population, f"{len(saves)} saves")  # fmt: skip


# ---------------------------------------------------------------------------------------------- evidence
def collect_evidence(col: Collection, path: Path, keys: Sequence[str]) -> None:
    evidence = _read_json(col, path)
    if not isinstance(evidence, dict) or "tested_configuration" not in evidence:
        col.not_found.append(f"{path}: not a resume evidence bundle")
        return
    tested = evidence["tested_configuration"]
    projection = project_config(tested.get("resolved"), keys)
    identity = comparable_identity(tested.get("identity") or {}, projection)
    source = col.add_source("evidence", path, evidence.get("created_unix"), "evidence created", identity, projection,
                            evidence.get("limitations") or [])  # fmt: skip
    # The bundle's own integrity check (manifest copies, traces): the same rule as `field evidence check`.
    _, problems = check_bundle(path.parent, None)
    # Its gate is a figure of its own below; what is left is damage (missing or altered files).
    problems = [p for p in problems if not p.startswith("the evidence's own gate failed")]
    population = evidence.get("population") or {}
    denominator = population.get("denominator", "unknown")
    pop = (
        f"{population.get('controls')} control(s), {population.get('interrupted_runs')} interrupted run(s),"
        f" {population.get('steps_per_run')} steps, {population.get('world_size')} rank(s),"
        f" {population.get('records_compared')} step records compared"
    )
    gate = evidence.get("gate") or {}
    col.add_figure(
        source, "resume_evidence", f"resume evidence {evidence.get('id')}",
        {"id": evidence.get("id"), "verdict": evidence.get("verdict"), "summary": evidence.get("summary"),
         "gate_passed": bool(gate.get("passed")), "gate_failed": list(gate.get("failed") or []),
         "bundle_check_passed": not problems, "bundle_problems": problems,
         "world_size": population.get("world_size")},
        None, pop, denominator,
    )  # fmt: skip
    recovery = evidence.get("recovery") or []
    seconds = [r["kill_to_first_new_step_s"] for r in recovery if r.get("kill_to_first_new_step_s") is not None]
    if seconds:
        col.add_figure(source, "recovery_seconds", "kill to first new step (mean)", statistics.mean(seconds), "s",
                       f"{len(seconds)} restart(s) after SIGKILL", denominator,
                       ["The restart follows the kill at once; scheduler queueing time is excluded."])  # fmt: skip
        redone = [r.get("steps_recomputed") for r in recovery if r.get("steps_recomputed") is not None]
        col.add_figure(source, "steps_redone", "steps redone after a kill (mean)", statistics.mean(redone), "steps",
                       f"{len(redone)} restart(s)", denominator)  # fmt: skip
    col.plots.setdefault("evidence", []).extend(
        str(path.parent / p) for p in (evidence.get("artifacts") or {}).get("plots", []) if (path.parent / p).is_file()
    )


# ---------------------------------------------------------------------------------------------- profile
def collect_profile(col: Collection, run_dir: Path, identity: dict[str, Any], projection: Any, basis: str) -> None:
    path = run_dir / PROFILE_RELPATH / "reports.jsonl"
    reports = read_jsonl(path)
    if not reports:
        col.not_found.append(f"{path}: no straggler/throughput reports")
        return
    source = col.add_source("profile", path, _mtime(path), "file modification time (reports carry steps, not dates)",
                            identity, projection, [f"Identity taken from the run directory: {basis}."])  # fmt: skip
    ranks = sorted({int(r["rank"]) for rep in reports for r in rep.get("ranks", [])})
    steps = [int(rep["step"]) for rep in reports]
    population = f"{len(reports)} report(s), steps {min(steps)}..{max(steps)}, {len(ranks)} rank(s)"
    flagged = [
        {"index": i, "step": rep["step"], "flags": rep.get("flagged") or []}
        for i, rep in enumerate(reports)
        if rep.get("flagged")
    ]
    col.add_figure(source, "straggler_reports", "straggler flags per report",
                   {"reports": len(reports), "flagged": flagged}, None, population, "reports")  # fmt: skip
    throughput = [sum(r.get("samples_per_s") or 0.0 for r in (rep.get("throughput") or {}).get("per_rank", []))
                  for rep in reports]  # fmt: skip
    col.add_figure(source, "samples_per_s", "throughput, all ranks (median over reports)",
                   statistics.median(throughput), "samples/s", population, "reports",
                   ["Report intervals include checkpoint saves and evaluation."])  # fmt: skip
    mfus = [r["mfu"] for rep in reports for r in (rep.get("throughput") or {}).get("per_rank", [])
            if r.get("mfu") is not None]  # fmt: skip
    peak_source = next(((rep.get("throughput") or {}).get("peak_source") for rep in reports), None)
    col.add_figure(source, "mfu", "model FLOP utilisation (median over ranks and reports)",
                   statistics.median(mfus) if mfus else None, "fraction", population, "rank-reports",
                   [] if mfus else [f"MFU not reported: {peak_source}"])  # fmt: skip
    shares = [
        r["exposed_comm_s"] / r["step_s"]
        for rep in reports
        for r in rep.get("ranks", [])
        if r.get("step_s") and r.get("exposed_comm_s") is not None
    ]
    col.add_figure(source, "exposed_comm_share", "exposed communication, share of step time (median)",
                   statistics.median(shares) if shares else None, "fraction", population, "rank-reports",
                   [] if len(ranks) > 1 else ["One rank: no collective to expose."])  # fmt: skip
    peaks = [r.get("peak_memory_bytes") for rep in reports for r in rep.get("ranks", []) if r.get("peak_memory_bytes")]
    if peaks:
        col.add_figure(source, "peak_memory_bytes", "peak memory (max over ranks)", max(peaks), "bytes",
                       population, "rank-reports")  # fmt: skip
    col.plots["throughput"] = [
        (int(rep["step"]), t, bool(rep.get("flagged"))) for rep, t in zip(reports, throughput, strict=True)
    ]


# ---------------------------------------------------------------------------------------------- quality and goodput
def collect_quality(col: Collection, run_dir: Path, identity: dict[str, Any], projection: Any, basis: str) -> None:
    events_path = run_dir / EVENTS_RELPATH
    events = read_events(run_dir)
    limits = [f"Identity taken from the run directory: {basis}."]
    if events:
        last = max(float(e.get("wall_time") or 0.0) for e in events)
        source = col.add_source("events", events_path, last, "last event", identity, projection, limits)
        ledger = goodput_ledger(events)
        attempts = len(ledger.attempts)
        pop = f"{attempts} attempt(s), {ledger.interruptions} interruption(s), {ledger.elapsed_s:.1f} s elapsed"
        col.add_figure(source, "goodput", "goodput (productive share of wall time)", ledger.goodput, "fraction",
                       pop, "wall time from the first run_start to the end of the last attempt")  # fmt: skip
        col.add_figure(source, "goodput_buckets", "where the wall time went", dict(ledger.buckets), "s", pop,
                       "wall time, buckets sum to it")  # fmt: skip
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
    summary = _read_json(col, path)
    if not isinstance(summary, dict):
        return
    source = col.add_source("time_to_quality", path, _mtime(path), "file modification time", identity, projection,
                            limits)  # fmt: skip
    reached = summary.get("reached")
    pop = f"{summary.get('evaluations')} evaluation(s) of {summary.get('monitor')}"
    denom = "wall time from the run's first start, every attempt and the downtime between them"
    forecast = summary.get("forecast") or {}
    col.add_figure(
        source, "time_to_quality", f"time to {summary.get('monitor')} {'<=' if summary.get('mode') == 'min' else '>='}"
        f" {summary.get('target')}",
        {"monitor": summary.get("monitor"), "target": summary.get("target"), "mode": summary.get("mode"),
         "reached": bool(reached), "step": (reached or {}).get("step"), "wall_s": (reached or {}).get("wall_s"),
         "device_hours": (reached or {}).get("device_hours"), "cost": (reached or {}).get("cost"),
         "deadline_s": summary.get("deadline_s"), "deadline_met": summary.get("deadline_met"),
         "forecast_available": forecast.get("available"), "forecast_reason": forecast.get("reason"),
         "forecast_seconds": forecast.get("seconds_to_target"),
         "deadline_miss_probability": forecast.get("deadline_miss_probability")},
        None, pop, denom, [] if reached else ["Not reached: the figure is a forecast."], estimate=not reached,
    )  # fmt: skip
    so_far = summary.get("so_far") or {}
    col.add_figure(source, "cost_so_far", "device-hours and cost so far",
                   {"device_hours": so_far.get("device_hours"), "cost": so_far.get("cost"),
                    "price_per_device_hour": summary.get("price_per_device_hour")},
                   None, pop, denom)  # fmt: skip
    col.plots["target"] = (summary.get("monitor"), summary.get("target"))


# ---------------------------------------------------------------------------------------------- preflight, scale, plan
def collect_preflight(col: Collection, path: Path, keys: Sequence[str]) -> None:
    report = _read_json(col, path)
    if not isinstance(report, dict):
        return
    run_root = path.parents[2] if len(path.parents) > 2 else path.parent
    identity, projection, basis = run_identity(run_root, keys)
    source = col.add_source("preflight", path, _mtime(path), "file modification time (preflight.json has no date)",
                            identity, projection, [f"Identity taken from {basis}."])  # fmt: skip
    base = report.get("baseline") or {}
    col.add_figure(
        source, "preflight", "preflight: data and labels, tiny overfit, baseline, fit",
        {"passed": bool(report.get("passed")), "failed": list(report.get("failed") or []),
         "step_s_median": base.get("step_s_median"), "samples_per_s": base.get("samples_per_s")},
        None, f"{base.get('steps_measured')} timed baseline step(s) on {base.get('device')}",
        "a sample of batches of each split",
    )  # fmt: skip


def collect_scale(col: Collection, path: Path) -> None:
    record = _read_json(col, path)
    if not isinstance(record, dict):
        return
    runs = record.get("runs") or []
    if not runs:
        col.not_found.append(f"{path}: a scaling record without runs")
        return
    source = col.add_source(
        "scale", path, _mtime(path), "file modification time", _unknown_identity(None), None,
        ["The scaling study trains the built-in regression model, not the released workload."],
    )  # fmt: skip
    top = max(runs, key=lambda r: r["ranks"])
    verdict = record.get("verdict") or {}
    col.add_figure(
        source, "scaling", "scaling study verdict",
        {"decision": verdict.get("decision"), "message": verdict.get("message"), "max_ranks": top["ranks"],
         "efficiency": top.get("efficiency"),
         "throughput_samples_s": {str(r["ranks"]): r.get("throughput_samples_s") for r in runs},
         "gradients_equivalent": all((r.get("gradient") or {"passed": True}).get("passed") for r in runs)},
        None, f"rank counts {[r['ranks'] for r in runs]}, {record.get('config', {}).get('steps')} steps each",
        f"effective batch {record.get('config', {}).get('effective_batch')} held constant",
    )  # fmt: skip


def collect_plan(col: Collection, path: Path) -> None:
    plan = _read_json(col, path)
    figures = plan.get("figures") if isinstance(plan, dict) else None
    if not isinstance(figures, dict):
        col.not_found.append(f"{path}: not a `field plan --json` output")
        return
    source = col.add_source("plan", path, _mtime(path), "file modification time", _unknown_identity(None), None,
                            ["Estimates from stated inputs, not measurements."])  # fmt: skip
    inputs = plan.get("inputs") or {}
    value = {
        name: {"value": f.get("value"), "unit": f.get("unit"), "from": f.get("from")} for name, f in figures.items()
    }
    # Assumed inputs that a run measures too (save and restart cost) stand beside the derived figures.
    for name, unit in (("save_seconds", "s"), ("restart_seconds", "s"), ("mtbf_hours", "h")):
        if inputs.get(name) is not None and name not in value:
            value[name] = {"value": inputs[name], "unit": unit, "from": ["input"]}
    col.add_figure(
        source, "plan", "plan (estimates)", value,
        None, "the plan's inputs: " + ", ".join(f"{k}={v}" for k, v in inputs.items() if k != "sources"),
        "estimates", estimate=True,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------- discovery
def _under(path: Path, roots: Iterable[Path]) -> bool:
    return any(root == path or root in path.parents for root in roots)


def _found(run_dir: Path, name: str, exclude: Sequence[Path]) -> list[Path]:
    return sorted(p for p in run_dir.rglob(name) if p.is_file() and not _under(p.resolve(), exclude))


def _record_dirs(run_dir: Path) -> list[Path]:
    """Earlier records (and their --copy sources) are outputs, never inputs."""
    return [p.parent.resolve() for p in run_dir.rglob(RECORD_JSON)]


def collect(
    run_dirs: Sequence[Path], keys: Sequence[str], verify_all: bool = False, plan: Path | None = None,
    exclude: Sequence[Path] = (),
) -> Collection:  # fmt: skip
    """Every source under ``run_dirs``; the first directory holding checkpoints is the released run."""
    missing = [str(d) for d in run_dirs if not d.is_dir()]
    if missing:
        raise NoSourcesError(f"not a directory: {', '.join(missing)}")
    run_dirs = [d.resolve() for d in run_dirs]
    released = next((d for d in run_dirs if any(e.manifest for e in committed_checkpoints(d / "checkpoints"))), None)
    release: dict[str, Any] = {"run_dir": str(released) if released else None}
    if released is not None:
        identity, projection, basis = run_identity(released, keys)
        newest = next(e for e in committed_checkpoints(released / "checkpoints") if e.manifest is not None)
        release.update(
            checkpoint=newest.path.name, step=newest.manifest.step, identity=identity, config_projection=projection,
            code_version=code_version(identity), basis=basis,
        )  # fmt: skip
    else:
        release.update(identity=_unknown_identity(None), config_projection=None, code_version="unknown",
                       basis="no run directory holds a committed checkpoint")  # fmt: skip
    col = Collection(release)
    for run_dir in run_dirs:
        skip = [*exclude, *_record_dirs(run_dir)]
        identity, projection, basis = run_identity(run_dir, keys)
        if (run_dir / "checkpoints").is_dir():
            collect_checkpoints(col, run_dir, keys, verify_all)
        collect_profile(col, run_dir, identity, projection, basis)
        collect_quality(col, run_dir, identity, projection, basis)
        for path in _found(run_dir, EVIDENCE_JSON, skip):
            collect_evidence(col, path, keys)
        for path in _found(run_dir, "preflight.json", skip):
            collect_preflight(col, path, keys)
        for path in _found(run_dir, "scale.json", skip):
            collect_scale(col, path)
        if (run_dir / PLAN_RELPATH).is_file():
            collect_plan(col, run_dir / PLAN_RELPATH)
    if plan is not None:
        if not plan.is_file():
            raise NoSourcesError(f"--plan {plan}: no such file")
        collect_plan(col, plan)
    if not col.sources:
        raise NoSourcesError(
            "no sources found: none of " + ", ".join(map(str, run_dirs)) + " holds checkpoints, an evidence bundle,"
            " a profile, time to quality, an event log, a preflight, a scaling record or a plan"
        )
    return col


def json_default(value: Any) -> Any:
    """Figures are plain data; paths and tuples from the collectors become strings and lists."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, Mapping):
        return dict(value)
    return repr(value)
