"""The critical conditions of an evidence bundle, whose conjunction is its gate.

Each condition is a yes/no question about what the runs left on disk (did the controls finish, was
each kill real, did each restart load an intact committed checkpoint, ...) with a one-line detail
that names what failed. They are kept apart from the rest of the bundle (figures, costs,
limitations) because the gate is the conjunction of these and nothing else: no forecast, speed-up
or other figure can pass a run whose checkpoint was untested, incomplete or divergent.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_field.evidence import compare
from lightning_field.evidence.check import claim_problems
from lightning_field.evidence.identity import identity_differences, identity_of
from lightning_field.evidence.protocol import EvidenceSettings, RunResult
from lightning_field.state.provenance_compare import inexact_lineage

__all__ = ["Condition", "critical_conditions", "effective_records", "resumed_checkpoint"]


@dataclass
class Condition:
    """One critical condition: its name, whether it held, and a line saying why (or what failed)."""

    name: str
    passed: bool
    detail: str


def effective_records(result: RunResult) -> dict[int, dict[compare.Key, dict[str, Any]]]:
    """Per rank, the step records that count: a step redone after the resume replaces the killed attempt's."""
    return {rank: compare.effective_records(records) for rank, records in result.raw_records.items()}


def completed(result: RunResult, steps: int) -> bool:
    """The run's last attempt exited cleanly at the planned final step."""
    return bool(
        result.attempts
        and result.attempts[-1].returncode == 0
        and result.final_state is not None
        and int(result.final_state["step"]) == steps
    )


def resumed_checkpoint(result: RunResult) -> dict[str, Any] | None:
    """The checkpoint the restart loaded (marked ``missing`` when the run kept no record of it), or None."""
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
        for rank, records in effective_records(r).items():
            covered = {compare.step_of(rec) for rec in records.values()}
            absent = sorted(set(range(1, steps + 1)) - covered)
            if absent:
                problems.append(
                    f"{r.name} rank {rank}: no record of steps {absent[:5]}{'...' if len(absent) > 5 else ''}"
                )
    return problems


def _restore_problems(interrupted: Sequence[RunResult]) -> list[str]:
    """Why a restart did not continue from a committed, recoverable, intact checkpoint before its kill."""
    problems = []
    for r in interrupted:
        used = resumed_checkpoint(r)
        restart = r.attempts[1] if len(r.attempts) > 1 else None
        if restart is None:
            problems.append(f"{r.name}: never restarted (the first attempt was not killed)")
        elif used is None and restart.returncode != 0:
            problems.append(f"{r.name}: the restart failed (exit {restart.returncode}): {_last_error(restart.log)}")
        elif used is None:
            problems.append(f"{r.name}: the restart found no checkpoint and trained from scratch")
        elif used.get("missing") or not used.get("recoverable") or not used.get("intact"):
            problems.append(f"{r.name}: resumed from {used['name']}, which is not an intact recoverable checkpoint")
        elif r.kill is not None and int(used["step"]) >= r.kill.step:
            problems.append(f"{r.name}: resumed from step {used['step']}, not before the kill at {r.kill.step}")
        elif inexact := [(c["name"], why) for c in r.checkpoints for why in inexact_lineage(c.get("provenance") or {})]:
            problems.append(f"{r.name}: {inexact[0][0]} records a lineage that is not exact: {inexact[0][1]}")
    return problems


def critical_conditions(
    results: Sequence[RunResult], settings: EvidenceSettings
) -> tuple[list[Condition], dict[str, Any]]:
    """Every critical condition but the verdict's (which needs the comparison), and the identity of
    the runs' checkpoints (empty when none committed)."""
    controls = [r for r in results if r.is_control]
    interrupted = [r for r in results if not r.is_control]
    conditions: list[Condition] = []

    done = [r.name for r in controls if completed(r, settings.steps)]
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
    restore_problems = _restore_problems(interrupted)
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
    finished = [r.name for r in interrupted if completed(r, settings.steps)]
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
    return conditions, identity
