"""Sources the other commands write: resume evidence bundles, preflight reports, scaling records, plans.

Found anywhere under the run directories given to ``field record build`` (``collect``); each carries,
or is given, the identity the staleness rules compare.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

from lightning_field.evidence.check import check_bundle
from lightning_field.record.identity import comparable_identity, project_config
from lightning_field.record.run_identity import run_identity, unknown_identity
from lightning_field.record.sources import Collection, modified


def collect_evidence(col: Collection, path: Path, keys: Sequence[str]) -> None:
    evidence = col.read_json(path)
    if not isinstance(evidence, dict) or "tested_configuration" not in evidence:
        col.not_found.append(f"{path}: not a resume evidence bundle")
        return
    tested = evidence["tested_configuration"]
    projection = project_config(tested.get("resolved"), keys)
    identity = comparable_identity(tested.get("identity") or {}, projection)
    source = col.add_source(
        "evidence",
        path,
        evidence.get("created_unix"),
        "evidence created",
        identity,
        projection,
        evidence.get("limitations") or [],
    )
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
        source,
        "resume_evidence",
        f"resume evidence {evidence.get('id')}",
        {
            "id": evidence.get("id"),
            "verdict": evidence.get("verdict"),
            "summary": evidence.get("summary"),
            "gate_passed": bool(gate.get("passed")),
            "gate_failed": list(gate.get("failed") or []),
            "bundle_check_passed": not problems,
            "bundle_problems": problems,
            "world_size": population.get("world_size"),
        },
        None,
        pop,
        denominator,
    )
    recovery = evidence.get("recovery") or []
    seconds = [r["kill_to_first_new_step_s"] for r in recovery if r.get("kill_to_first_new_step_s") is not None]
    if seconds:
        col.add_figure(
            source,
            "recovery_seconds",
            "kill to first new step (mean)",
            statistics.mean(seconds),
            "s",
            f"{len(seconds)} restart(s) after SIGKILL",
            denominator,
            ["The restart follows the kill at once; scheduler queueing time is excluded."],
        )
        redone = [r.get("steps_recomputed") for r in recovery if r.get("steps_recomputed") is not None]
        col.add_figure(
            source,
            "steps_redone",
            "steps redone after a kill (mean)",
            statistics.mean(redone),
            "steps",
            f"{len(redone)} restart(s)",
            denominator,
        )
    col.plots.setdefault("evidence", []).extend(
        str(path.parent / p) for p in (evidence.get("artifacts") or {}).get("plots", []) if (path.parent / p).is_file()
    )


def collect_preflight(col: Collection, path: Path, keys: Sequence[str]) -> None:
    report = col.read_json(path)
    if not isinstance(report, dict):
        return
    run_root = path.parents[2] if len(path.parents) > 2 else path.parent
    identity, projection, basis = run_identity(run_root, keys)
    source = col.add_source(
        "preflight",
        path,
        modified(path),
        "file modification time (preflight.json has no date)",
        identity,
        projection,
        [f"Identity taken from {basis}."],
    )
    base = report.get("baseline") or {}
    col.add_figure(
        source,
        "preflight",
        "preflight: data and labels, tiny overfit, baseline, fit",
        {
            "passed": bool(report.get("passed")),
            "failed": list(report.get("failed") or []),
            "step_s_median": base.get("step_s_median"),
            "samples_per_s": base.get("samples_per_s"),
        },
        None,
        f"{base.get('steps_measured')} timed baseline step(s) on {base.get('device')}",
        "a sample of batches of each split",
    )


def collect_scale(col: Collection, path: Path) -> None:
    record = col.read_json(path)
    if not isinstance(record, dict):
        return
    runs = record.get("runs") or []
    if not runs:
        col.not_found.append(f"{path}: a scaling record without runs")
        return
    source = col.add_source(
        "scale",
        path,
        modified(path),
        "file modification time",
        unknown_identity(None),
        None,
        ["The scaling study trains the built-in regression model, not the released workload."],
    )
    top = max(runs, key=lambda r: r["ranks"])
    verdict = record.get("verdict") or {}
    col.add_figure(
        source,
        "scaling",
        "scaling study verdict",
        {
            "decision": verdict.get("decision"),
            "message": verdict.get("message"),
            "max_ranks": top["ranks"],
            "efficiency": top.get("efficiency"),
            "throughput_samples_s": {str(r["ranks"]): r.get("throughput_samples_s") for r in runs},
            "gradients_equivalent": all((r.get("gradient") or {"passed": True}).get("passed") for r in runs),
        },
        None,
        f"rank counts {[r['ranks'] for r in runs]}, {record.get('config', {}).get('steps')} steps each",
        f"effective batch {record.get('config', {}).get('effective_batch')} held constant",
    )


def collect_plan(col: Collection, path: Path) -> None:
    plan = col.read_json(path)
    figures = plan.get("figures") if isinstance(plan, dict) else None
    if not isinstance(figures, dict):
        col.not_found.append(f"{path}: not a `field plan --json` output")
        return
    source = col.add_source(
        "plan",
        path,
        modified(path),
        "file modification time",
        unknown_identity(None),
        None,
        ["Estimates from stated inputs, not measurements."],
    )
    inputs = plan.get("inputs") or {}
    value = {
        name: {"value": f.get("value"), "unit": f.get("unit"), "from": f.get("from")} for name, f in figures.items()
    }
    # Assumed inputs that a run measures too (save and restart cost) stand beside the derived figures.
    for name, unit in (("save_seconds", "s"), ("restart_seconds", "s"), ("mtbf_hours", "h")):
        if inputs.get(name) is not None and name not in value:
            value[name] = {"value": inputs[name], "unit": unit, "from": ["input"]}
    col.add_figure(
        source,
        "plan",
        "plan (estimates)",
        value,
        None,
        "the plan's inputs: " + ", ".join(f"{k}={v}" for k, v in inputs.items() if k != "sources"),
        "estimates",
        estimate=True,
    )
