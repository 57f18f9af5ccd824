"""The evidence bundle and its decision gate.

``build_evidence`` turns what the runs left on disk into one machine-readable record: the verdict,
the critical conditions (each pass/fail), the tested configuration and its identity hashes, the
population and denominators, recovery cost, and the limitations. ``write_bundle`` publishes it as
``evidence.json``, ``evidence.md`` and two plots beside the raw per-step logs and manifests.

The gate is the conjunction of the critical conditions and nothing else: no forecast, speed-up or
other figure in the bundle can pass a run whose checkpoint was untested, incomplete or divergent.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import signal
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from lightning_field.checkpoint.verify import verify_checkpoint
from lightning_field.core.fsio import atomic_write_bytes
from lightning_field.core.hashing import file_digest, file_matches, recorded_digest
from lightning_field.core.layout import EVENTS_RELPATH
from lightning_field.core.manifest import ManifestError, read_manifest
from lightning_field.evidence import compare, plots
from lightning_field.evidence.identity import identity_differences, identity_of
from lightning_field.evidence.protocol import EvidenceSettings, RunResult
from lightning_field.state.provenance import diff_provenance, stable_hash
from lightning_field.state.secrets import scrub_secrets

FORMAT = "lightning_field.evidence/2"
"""Format 2 records each manifest copy's labelled digest (``manifest_digest``, ``"blake3:<hex>"``)."""

READABLE_FORMATS = ("lightning_field.evidence/1", FORMAT)
"""Format 1 bundles (``manifest_sha256``, a bare SHA-256) are still checked."""
RECOVERY_PHASES = {
    "restart_gap": "kill to relaunch (the harness restarts at once; a scheduler adds its queueing time)",
    "process_start": "interpreter start and imports",
    "setup_and_restore": "model, data and trainer construction, checkpoint verification and load",
    "data_fast_forward": "restoring the loader position up to the first new batch",
}
EVIDENCE_JSON = "evidence.json"
EVIDENCE_MD = "evidence.md"
LOSS_PLOT = "loss.png"
DIVERGENCE_PLOT = "divergence.png"


@dataclass
class Condition:
    name: str
    passed: bool
    detail: str


def _versions() -> dict[str, str | None]:
    names = ["lightning-field", "torch", "lightning", "torchdata", "hydra-core", "numpy", "torchmetrics"]
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _hardware() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    with contextlib.suppress(OSError, ValueError):
        info["memory_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    if torch.cuda.is_available():
        info["cuda_devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["cuda"] = torch.version.cuda
    return info


def _effective(result: RunResult) -> dict[int, dict[compare.Key, dict[str, Any]]]:
    return {rank: compare.effective_records(records) for rank, records in result.raw_records.items()}


def _completed(result: RunResult, steps: int) -> bool:
    return bool(
        result.attempts
        and result.attempts[-1].returncode == 0
        and result.final_state is not None
        and int(result.final_state["step"]) == steps
    )


def _resumed_checkpoint(result: RunResult) -> dict[str, Any] | None:
    timeline = result.timelines.get(2, {})
    resumed_from = timeline.get("resumed_from")
    if not resumed_from:
        return None
    name = Path(resumed_from).name
    return next((c for c in result.checkpoints if c["name"] == name), {"name": name, "missing": True})


def _last_error(log: Path) -> str:
    """The last line of a log that names an error, for a condition's one-line detail."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return f"see {log}"
    errors = [line.strip() for line in lines if "Error" in line or "Exception" in line]
    return (errors[-1][:300] if errors else "no error line") + f" (see {log})"


def _recovery_cost(result: RunResult) -> dict[str, Any]:
    """Kill-to-first-new-step, by phase, and the work redone since the last commit."""
    kill = result.kill
    assert kill is not None
    cost: dict[str, Any] = {"run": result.name, "kill_step": kill.step, "kill_mode": kill.mode}
    resumed = _resumed_checkpoint(result)
    cost["resumed_from"] = resumed["name"] if resumed else None
    resume_step = int(resumed["step"]) if resumed and resumed.get("step") is not None else 0
    cost["resumed_step"] = resume_step
    t2 = result.timelines.get(2, {})
    killed_at = (result.kill_record or {}).get("wall_time")
    load_events = [e for e in result.events if e.get("event") == "ckpt_load" and e.get("attempt") == 2]
    if killed_at and t2.get("first_batch_unix"):
        cost["kill_to_first_new_step_s"] = t2["first_batch_unix"] - killed_at
        launched = t2.get("launched_unix", killed_at)
        cost["phases_s"] = {
            "restart_gap": launched - killed_at,
            "process_start": t2["worker_started_unix"] - launched,
            "setup_and_restore": t2["train_start_unix"] - t2["worker_started_unix"],
            "data_fast_forward": t2["first_batch_unix"] - t2["train_start_unix"],
        }
        cost["checkpoint_load_s"] = load_events[-1]["payload"].get("seconds") if load_events else None
    first_attempt = [r for r in result.raw_records.get(0, []) if r.get("attempt") == 1]
    by_step = {int(r["step"]): r for r in first_attempt}
    cost["steps_recomputed"] = kill.step - resume_step
    if kill.step in by_step:
        start = by_step[resume_step]["t_end"] if resume_step in by_step else first_attempt[0]["t_start"]
        cost["seconds_recomputed"] = by_step[kill.step]["t_end"] - start
    return cost


def _trace_problems(results: Sequence[RunResult], steps: int) -> list[str]:
    """Missing evidence must not look like agreement: every run needs a record of every step, per rank."""
    if not results:
        return ["no runs"]
    ranks = sorted(results[0].raw_records)
    problems = []
    for r in results:
        if sorted(r.raw_records) != ranks or not ranks:
            problems.append(f"{r.name}: traced ranks {sorted(r.raw_records)}, control-1 traced {ranks}")
            continue
        for rank, records in _effective(r).items():
            covered = {compare.step_of(rec) for rec in records.values()}
            absent = sorted(set(range(1, steps + 1)) - covered)
            if absent:
                problems.append(
                    f"{r.name} rank {rank}: no record of steps {absent[:5]}{'...' if len(absent) > 5 else ''}"
                )
    return problems


def _limitations(
    config: Mapping[str, Any], settings: EvidenceSettings, world_size: int, kills: Sequence[Any]
) -> list[str]:
    trainer = config.get("trainer", {})
    limits = []
    accelerator = str(trainer.get("accelerator", "auto"))
    if accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available()):
        limits.append("CPU only; GPU nondeterminism and CUDA RNG restore not exercised.")
    if world_size == 1:
        limits.append("Single process; multi-rank (DDP) restore and per-rank data positions not exercised.")
    if not any(k.mode == "save" for k in kills):
        limits.append("No kill landed inside a save (kill_mode=step); the commit protocol was not interrupted.")
    if len(kills) == 1:
        limits.append("One interruption: a single sample of kill points.")
    if settings.state_every_n_steps > 1:
        limits.append(f"Weights and optimizer digested every {settings.state_every_n_steps} steps only.")
    if int(config.get("data", {}).get("num_workers", 0) or 0) == 0:
        limits.append("Data loaded in the main process (num_workers=0); loader worker state not exercised.")
    limits.append("Whole-job SIGKILL only; losing one rank while others live is not exercised.")
    limits.append("The restart follows the kill at once; recovery cost excludes scheduler queueing time.")
    return limits


def build_evidence(
    results: Sequence[RunResult],
    settings: EvidenceSettings,
    config: Mapping[str, Any],
    bundle_dir: Path,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(evidence record, plot inputs). Pure of the runs' files: nothing is re-run here."""
    controls = [r for r in results if r.is_control]
    interrupted = [r for r in results if not r.is_control]
    conditions: list[Condition] = []
    # The composed config holds secrets in full (a logger's API key); the bundle is shared and copied.
    shared_config = scrub_secrets(config)

    done = [r.name for r in controls if _completed(r, settings.steps)]
    conditions.append(
        Condition(
            "controls_completed",
            len(done) == 2,
            f"{len(done)}/2 uninterrupted controls reached step {settings.steps}"
            + (
                ""
                if len(done) == 2
                else f"; see {', '.join(str(r.attempts[-1].log) for r in controls if r.name not in done)}"
            ),
        )
    )
    real = [
        r.name
        for r in interrupted
        if r.attempts[0].returncode == -signal.SIGKILL
        and r.kill_record is not None
        and r.kill is not None
        and int(r.kill_record["step"]) == r.kill.step
    ]
    # Counted against the plan, not against what ran: a protocol cut short passes nothing vacuously.
    planned = settings.interruptions
    conditions.append(
        Condition(
            "interruptions_were_real",
            planned > 0 and len(real) == planned,
            f"{len(real)}/{planned} interrupted runs died by SIGKILL at their planned step"
            + (f" ({planned - len(interrupted)} not run)" if len(interrupted) < planned else ""),
        )
    )
    restore_problems = []
    for r in interrupted:
        used = _resumed_checkpoint(r)
        restart = r.attempts[1] if len(r.attempts) > 1 else None
        if restart is None:
            restore_problems.append(f"{r.name}: never restarted (the first attempt was not killed)")
        elif used is None and restart.returncode != 0:
            restore_problems.append(
                f"{r.name}: the restart failed (exit {restart.returncode}): {_last_error(restart.log)}"
            )
        elif used is None:
            restore_problems.append(f"{r.name}: the restart found no checkpoint and trained from scratch")
        elif used.get("missing") or not used.get("recoverable") or not used.get("intact"):
            restore_problems.append(
                f"{r.name}: resumed from {used['name']}, which is not an intact recoverable checkpoint"
            )
        elif r.kill is not None and int(used["step"]) >= r.kill.step:
            restore_problems.append(f"{r.name}: resumed from step {used['step']}, not before the kill at {r.kill.step}")
    conditions.append(
        Condition(
            "restored_from_recoverable_checkpoint",
            not restore_problems and bool(interrupted),
            "; ".join(restore_problems) or "every restart loaded a committed, recoverable, intact checkpoint",
        )
    )
    damaged = [
        f"{r.name}/{c['name']}: {'; '.join(c['problems'])}" for r in results for c in r.checkpoints if not c["intact"]
    ]
    verified = sum(len(r.checkpoints) for r in results)
    conditions.append(
        Condition(
            "checkpoints_intact",
            not damaged and verified > 0,
            "; ".join(damaged)
            or (f"{verified} committed checkpoints verified intact" if verified else "none committed"),
        )
    )
    finished = [r.name for r in interrupted if _completed(r, settings.steps)]
    conditions.append(
        Condition(
            "interrupted_runs_completed",
            planned > 0 and len(finished) == planned,
            f"{len(finished)}/{planned} resumed runs reached step {settings.steps}",
        )
    )

    trace_problems = _trace_problems(results, settings.steps)
    conditions.append(
        Condition(
            "traces_complete",
            not trace_problems,
            "; ".join(trace_problems) or f"every run traced steps 1..{settings.steps} on the same ranks",
        )
    )

    # Identity: every checkpoint of every run must describe the same code, config, data and model.
    manifests = [(r.name, c) for r in results for c in r.checkpoints]
    identity = identity_of(manifests[0][1]["provenance"]) if manifests else {}
    inconsistent = [
        f"{name}/{c['name']}: {diff}"
        for name, c in manifests
        for diff in identity_differences(identity, identity_of(c["provenance"]))
    ]
    if not manifests:
        inconsistent.append("no checkpoint was committed by any run")
    if settings.claim_checkpoint:
        inconsistent += [f"claimed checkpoint: {p}" for p in claim_problems(identity, Path(settings.claim_checkpoint))]
    conditions.append(
        Condition(
            "evidence_current",
            not inconsistent,
            "; ".join(inconsistent)
            or "all manifests share one code/config/data/model identity"
            + (f", equal to the claimed checkpoint {settings.claim_checkpoint}" if settings.claim_checkpoint else ""),
        )
    )

    comparisons: list[compare.RunComparison] = []
    verdict: compare.Verdict
    plot_series: dict[str, list[tuple[int, float]]] = {}
    plot_deltas: dict[str, list[tuple[int, float]]] = {}
    plot_kills: dict[str, tuple[int, int]] = {}
    passed = {c.name: c.passed for c in conditions}
    complete = passed["controls_completed"] and passed["interrupted_runs_completed"]
    if complete:
        reference = _effective(controls[0])
        control_cmp = compare.compare_run(
            controls[1].name, reference, _effective(controls[1]), controls[0].final_state, controls[1].final_state
        )
        judged = []
        for r in interrupted:
            used = _resumed_checkpoint(r) or {}
            judged.append(
                compare.compare_run(
                    r.name, reference, _effective(r), controls[0].final_state, r.final_state, int(used.get("step") or 0)
                )
            )
        verdict = compare.decide(control_cmp, judged, settings.noise_tolerance)
        comparisons = [control_cmp, *judged]
        for r in results:
            plot_series[r.name] = plots.loss_series(_effective(r).get(0, {}))
        for c in comparisons:
            plot_deltas[f"{c.name} vs control-1"] = c.deltas
        for r in interrupted:
            used = _resumed_checkpoint(r) or {}
            if r.kill is not None:
                plot_kills[r.name] = (r.kill.step, int(used.get("step") or 0))
    else:
        verdict = compare.Verdict(
            compare.FAIL, False, "fail: evidence incomplete, the runs did not all finish", settings.noise_tolerance
        )
    conditions.append(
        Condition("verdict_not_fail", verdict.verdict != compare.FAIL, verdict.summary),
    )

    world_size = len(controls[0].raw_records) if controls and controls[0].raw_records else 1
    kills = [r.kill for r in interrupted if r.kill is not None]
    records_compared = sum(len(_effective(r).get(rank, {})) for r in results for rank in r.raw_records)
    created = dt.datetime.now(dt.timezone.utc)
    evidence = {
        "format": FORMAT,
        "id": bundle_dir.name,
        "created": created.isoformat(timespec="seconds"),
        "created_unix": created.timestamp(),
        "verdict": verdict.verdict,
        "summary": verdict.summary,
        "reproducible_without_interruption": verdict.reproducible,
        "gate": {
            "passed": all(c.passed for c in conditions),
            "failed": [c.name for c in conditions if not c.passed],
            "rule": "passes only when every critical condition passes; no other figure can override it",
        },
        "critical_conditions": [asdict(c) for c in conditions],
        "statistic": {"tolerance": verdict.tolerance, "description": verdict.statistic},
        "comparisons": [c.to_dict() for c in comparisons],
        "recovery": [_recovery_cost(r) for r in interrupted if len(r.attempts) > 1],
        "population": {
            "controls": len(controls),
            "interrupted_runs": len(interrupted),
            "kills": [{"run": r.name, **asdict(r.kill)} for r in interrupted if r.kill is not None],
            "steps_per_run": settings.steps,
            "world_size": world_size,
            "records_compared": records_compared,
            "denominator": (
                f"{len(interrupted)} interrupted run(s) judged against 2 uninterrupted controls, "
                f"{settings.steps} steps each, {world_size} rank(s)"
            ),
        },
        "tested_configuration": {
            "resolved": shared_config,
            "config_hash": stable_hash(shared_config),
            "identity": identity,
            "settings": asdict(settings),
            "manifests": [
                {
                    "run": name,
                    "checkpoint": c["name"],
                    "step": c["step"],
                    "recoverable": c["recoverable"],
                    "intact": c["intact"],
                    "manifest": os.path.relpath(c["manifest_copy"], bundle_dir),
                    "manifest_digest": file_digest(Path(c["manifest_copy"])),
                }
                for name, c in manifests
            ],
        },
        "versions": _versions(),
        "hardware": _hardware(),
        "limitations": _limitations(config, settings, world_size, kills),
        "artifacts": _artifacts(results, bundle_dir),
    }
    return evidence, {"series": plot_series, "deltas": plot_deltas, "kills": plot_kills}


def _artifacts(results: Sequence[RunResult], bundle_dir: Path) -> dict[str, Any]:
    runs = {}
    for r in results:
        files = sorted(p for p in r.run_dir.rglob("*") if p.is_file())
        runs[r.name] = {
            "traces": [os.path.relpath(p, bundle_dir) for p in files if p.parent.name == "trace"],
            "manifests": [os.path.relpath(c["manifest_copy"], bundle_dir) for c in r.checkpoints],
            "logs": [os.path.relpath(a.log, bundle_dir) for a in r.attempts],
            "events": os.path.relpath(r.run_dir / EVENTS_RELPATH, bundle_dir),
        }
    return {"runs": runs, "plots": [LOSS_PLOT, DIVERGENCE_PLOT]}


def _evidence_config(evidence: Mapping[str, Any], bundle_dir: Path) -> Mapping[str, Any] | None:
    """The config view the evidence runs recorded in their manifests (the bundle keeps copies)."""
    for entry in evidence["tested_configuration"].get("manifests", []):
        try:
            copy = json.loads((bundle_dir / entry["manifest"]).read_text())
        except (OSError, ValueError, KeyError):
            continue
        resolved = (copy.get("provenance", {}).get("config") or {}).get("resolved")
        if isinstance(resolved, Mapping):
            return resolved
    return None


def claim_problems(
    identity: Mapping[str, Any], checkpoint: Path, evidence_config: Mapping[str, Any] | None = None
) -> list[str]:
    """Why evidence with ``identity`` does not cover ``checkpoint`` (empty when it does). With the
    evidence's recorded config, a stale config names the keys that differ, not only the hash."""
    try:
        manifest = read_manifest(checkpoint)
    except ManifestError as err:
        return [str(err)]
    problems = []
    report = verify_checkpoint(checkpoint)
    if not report.intact:
        problems.append("the checkpoint is damaged: " + "; ".join(report.problems))
    elif not manifest.recoverable:
        problems.append("the checkpoint is not recoverable, it lacks: " + "; ".join(manifest.missing))
    actual = identity_of(manifest.provenance)
    problems += [f"stale, {d}" for d in identity_differences(identity, actual)]
    saved = (manifest.provenance.get("config") or {}).get("resolved")
    if (
        evidence_config is not None
        and isinstance(saved, Mapping)
        and identity.get("config.hash") != actual.get("config.hash")
    ):
        for key, (before, after) in sorted(diff_provenance(evidence_config, saved).items()):
            problems.append(f"stale, config {key}: {before!r} (evidence) -> {after!r} (checkpoint)")
    if identity.get("code.git_commit") is None or actual.get("code.git_commit") is None:
        problems.append(
            "code identity unknown: the evidence or the checkpoint was made from code outside git, so nothing shows"
            " the two ran the same code"
        )
    return problems


def write_bundle(evidence: dict[str, Any], plot_inputs: Mapping[str, Any], bundle_dir: Path) -> None:
    bundle_dir.mkdir(parents=True, exist_ok=True)
    plots.plot_losses(plot_inputs["series"], plot_inputs["kills"], bundle_dir / LOSS_PLOT)
    plots.plot_divergence(plot_inputs["deltas"], bundle_dir / DIVERGENCE_PLOT)
    atomic_write_bytes(bundle_dir / EVIDENCE_MD, render_markdown(evidence).encode())
    # evidence.json last: like a manifest, its presence says the bundle is complete.
    atomic_write_bytes(bundle_dir / EVIDENCE_JSON, json.dumps(evidence, indent=2, default=str).encode())


def _fmt_s(value: Any) -> str:
    return f"{value:.2f} s" if isinstance(value, (int, float)) else "n/a"


def render_markdown(ev: Mapping[str, Any]) -> str:
    gate = ev["gate"]
    lines = [
        f"# Resume evidence {ev['id']}",
        "",
        f"**Verdict: {ev['verdict'].upper().replace('_', ' ')}**, gate **{'PASSED' if gate['passed'] else 'FAILED'}**"
        f" ({ev['created']}).",
        "",
        ev["summary"],
        "",
        "## Critical conditions",
        "",
        "| condition | result | detail |",
        "| --- | --- | --- |",
    ]
    for c in ev["critical_conditions"]:
        lines.append(f"| {c['name']} | {'pass' if c['passed'] else '**FAIL**'} | {c['detail']} |")
    lines += ["", f"Gate rule: {gate['rule']}.", "", "## Comparison with control-1", ""]
    lines += [f"Statistic (tolerance {ev['statistic']['tolerance']:g}x): {ev['statistic']['description']}.", ""]
    lines += [
        "| run | verdict | first divergence | final weights max abs diff | findings |",
        "| --- | --- | --- | --- | --- |",
    ]
    for c in ev["comparisons"]:
        div = c["first_divergence"]
        where = f"step {div['step']}: {', '.join(div['components'])}" if div else "none"
        lines.append(
            f"| {c['name']} | {c['verdict']} | {where} | {c['final']['weights_max_abs_diff']:.3g} |"
            f" {' '.join(c['findings'])} |"
        )
    lines += ["", "## Recovery cost", ""]
    lines += [
        "| run | kill | resumed from | kill → first new step | steps redone | seconds redone | checkpoint load |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in ev["recovery"]:
        lines.append(
            f"| {r['run']} | step {r['kill_step']} ({r['kill_mode']}) | {r['resumed_from']} (step {r['resumed_step']})"
            f" | {_fmt_s(r.get('kill_to_first_new_step_s'))} | {r['steps_recomputed']}"
            f" | {_fmt_s(r.get('seconds_recomputed'))} | {_fmt_s(r.get('checkpoint_load_s'))} |"
        )
    for r in ev["recovery"]:
        if r.get("phases_s"):
            phases = "; ".join(f"{k} {_fmt_s(v)}" for k, v in r["phases_s"].items())
            lines.append(f"\n{r['run']} phases: {phases}.")
    lines += ["", "Phases: " + "; ".join(f"{k} = {v}" for k, v in RECOVERY_PHASES.items()) + "."]
    pop = ev["population"]
    lines += ["", "## Population", "", f"{pop['denominator']}; {pop['records_compared']} step records compared.", ""]
    lines += ["## Plots", "", f"![loss]({LOSS_PLOT})", "", f"![divergence]({DIVERGENCE_PLOT})", ""]
    lines += ["## Tested configuration", ""]
    tc = ev["tested_configuration"]
    lines.append(f"Config hash `{tc['config_hash'][:16]}`; identity of every checkpoint:")
    lines.append("")
    for key, value in tc["identity"].items():
        lines.append(f"- {key}: `{value}`")
    lines += ["", "Versions: " + ", ".join(f"{k} {v}" for k, v in ev["versions"].items() if v), ""]
    hw = ev["hardware"]
    lines += [
        f"Hardware: {hw.get('platform')}, {hw.get('cpu_count')} CPUs, {hw.get('memory_gib', '?')} GiB"
        + (f", {', '.join(hw['cuda_devices'])}" if hw.get("cuda_devices") else ""),
        "",
    ]
    lines += ["## Limitations", ""] + [f"- {item}" for item in ev["limitations"]] + [""]
    lines += ["## Raw artifacts", ""]
    for name, art in ev["artifacts"]["runs"].items():
        links = [f"[{Path(p).name}]({p})" for p in art["traces"] + art["logs"]]
        links.append(f"[events]({art['events']})")
        manifests = ", ".join(f"[{Path(p).stem}]({p})" for p in art["manifests"]) or "none"
        lines.append(f"- **{name}**: {', '.join(links)}; manifests: {manifests}")
    lines.append("")
    return "\n".join(lines)


def check_bundle(bundle_dir: Path, checkpoint: Path | None) -> tuple[bool, list[str]]:
    """Does the bundle support a recovery claim (for ``checkpoint``, when given)? (ok, reasons)."""
    path = bundle_dir / EVIDENCE_JSON
    try:
        evidence = json.loads(path.read_text())
    except FileNotFoundError:
        return False, [f"evidence missing: {path} does not exist"]
    except json.JSONDecodeError as err:
        return False, [f"evidence unreadable: {path}: {err}"]
    if evidence.get("format") not in READABLE_FORMATS:
        readable = " and ".join(repr(f) for f in READABLE_FORMATS)
        return False, [f"unsupported evidence format {evidence.get('format')!r}; this version reads {readable}"]
    problems = []
    if not evidence["gate"]["passed"]:
        problems.append(
            f"the evidence's own gate failed ({', '.join(evidence['gate']['failed'])}): {evidence['summary']}"
        )
    for entry in evidence["tested_configuration"]["manifests"]:
        copy = bundle_dir / entry["manifest"]
        if not copy.is_file():
            problems.append(f"evidence incomplete: {entry['manifest']} is missing")
        elif not file_matches(copy, recorded_digest(entry, "manifest_digest", "manifest_sha256")):
            problems.append(f"evidence altered: {entry['manifest']} does not match its recorded hash")
    for run in evidence["artifacts"]["runs"].values():
        for rel in run["traces"]:
            if not (bundle_dir / rel).is_file():
                problems.append(f"evidence incomplete: {rel} is missing")
    if checkpoint is not None:
        problems += claim_problems(
            evidence["tested_configuration"]["identity"], checkpoint, _evidence_config(evidence, bundle_dir)
        )
    return not problems, problems
