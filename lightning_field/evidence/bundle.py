"""The evidence bundle: what the runs left on disk, turned into one record and published.

``build_evidence`` turns the runs' files into one machine-readable record: the verdict, the
critical conditions (each pass/fail, ``gate.py``), the tested configuration and its identity
hashes, the population and denominators, recovery cost, and the limitations. ``write_bundle``
publishes it as ``evidence.json``, ``evidence.md`` (``markdown.py``) and two plots beside the raw
per-step logs and manifests. Checking a bundle is ``check.py``'s; the file names and format are
``bundle_format.py``'s, and are importable from here as before.

The gate is the conjunction of the critical conditions and nothing else: no forecast, speed-up or
other figure in the bundle can pass a run whose checkpoint was untested, incomplete or divergent.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from lightning_field.core.fsio import atomic_write_bytes
from lightning_field.core.hashing import file_digest
from lightning_field.core.layout import EVENTS_RELPATH
from lightning_field.evidence import compare, plots
from lightning_field.evidence.bundle_format import (
    DIVERGENCE_PLOT,
    EVIDENCE_JSON,
    EVIDENCE_MD,
    FORMAT,
    LOSS_PLOT,
)
from lightning_field.evidence.gate import Condition, critical_conditions, effective_records, resumed_checkpoint
from lightning_field.evidence.markdown import render_markdown
from lightning_field.evidence.protocol import EvidenceSettings, RunResult
from lightning_field.state.provenance_compare import stable_hash
from lightning_field.state.secrets import scrub_secrets

__all__ = ["build_evidence", "write_bundle"]


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


def _recovery_cost(result: RunResult) -> dict[str, Any]:
    """Kill-to-first-new-step, by phase, and the work redone since the last commit."""
    kill = result.kill
    assert kill is not None
    cost: dict[str, Any] = {"run": result.name, "kill_step": kill.step, "kill_mode": kill.mode}
    resumed = resumed_checkpoint(result)
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
    # The composed config holds secrets in full (a logger's API key); the bundle is shared and copied.
    shared_config = scrub_secrets(config)
    conditions, identity = critical_conditions(results, settings)
    manifests = [(r.name, c) for r in results for c in r.checkpoints]

    comparisons: list[compare.RunComparison] = []
    verdict: compare.Verdict
    plot_series: dict[str, list[tuple[int, float]]] = {}
    plot_deltas: dict[str, list[tuple[int, float]]] = {}
    plot_kills: dict[str, tuple[int, int]] = {}
    passed = {c.name: c.passed for c in conditions}
    complete = passed["controls_completed"] and passed["interrupted_runs_completed"]
    if complete:
        reference = effective_records(controls[0])
        control_cmp = compare.compare_run(
            controls[1].name,
            reference,
            effective_records(controls[1]),
            _final(controls[0]),
            _final(controls[1]),
        )
        judged = []
        for r in interrupted:
            used = resumed_checkpoint(r) or {}
            judged.append(
                compare.compare_run(
                    r.name,
                    reference,
                    effective_records(r),
                    _final(controls[0]),
                    _final(r),
                    int(used.get("step") or 0),
                )
            )
        verdict = compare.decide(control_cmp, judged, settings.noise_tolerance)
        comparisons = [control_cmp, *judged]
        for r in results:
            plot_series[r.name] = plots.loss_series(effective_records(r).get(0, {}))
        for c in comparisons:
            plot_deltas[f"{c.name} vs control-1"] = c.deltas
        for r in interrupted:
            used = resumed_checkpoint(r) or {}
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
    records_compared = sum(len(effective_records(r).get(rank, {})) for r in results for rank in r.raw_records)
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


def write_bundle(evidence: dict[str, Any], plot_inputs: Mapping[str, Any], bundle_dir: Path) -> None:
    bundle_dir.mkdir(parents=True, exist_ok=True)
    plots.plot_losses(plot_inputs["series"], plot_inputs["kills"], bundle_dir / LOSS_PLOT)
    plots.plot_divergence(plot_inputs["deltas"], bundle_dir / DIVERGENCE_PLOT)
    atomic_write_bytes(bundle_dir / EVIDENCE_MD, render_markdown(evidence).encode())
    # evidence.json last: like a manifest, its presence says the bundle is complete.
    atomic_write_bytes(bundle_dir / EVIDENCE_JSON, json.dumps(evidence, indent=2, default=str).encode())


def _final(run: Any) -> Mapping[str, Any]:
    """A completed run's final weights and optimizer state (every completed run saved them)."""
    assert run.final_state is not None, f"{run.name} completed without its final state"
    return run.final_state
