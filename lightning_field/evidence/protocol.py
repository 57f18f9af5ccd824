"""The controlled protocol: two uninterrupted controls and K runs killed for real, then resumed.

Every run is a separate child process (a separate process group), started the way a user starts a
job, so an interruption is a real SIGKILL and a resume is a real cold start: interpreter, imports,
checkpoint verification and load, data fast-forward. The parent only plans, launches and collects;
all judgement happens afterwards on what the runs wrote to disk (see ``compare`` and ``bundle``).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lightning_field.checkpoint.resolver import committed_checkpoints
from lightning_field.checkpoint.verify import verify_checkpoint
from lightning_field.core.events import read_events
from lightning_field.core.manifest import MANIFEST_NAME
from lightning_field.evidence.faults import KILL_MODES
from lightning_field.evidence.trace import attempt_file, read_trace
from lightning_field.evidence.worker import CHECKPOINTS, FINAL_STATE, KILL_RECORD, TRACE, RunSpec


class EvidenceConfigError(ValueError):
    """The protocol cannot be run as configured; the message names the setting."""


@dataclass
class EvidenceSettings:
    """The protocol's own knobs (``conf/evidence/default.yaml`` mirrors this)."""

    steps: int = 40
    interruptions: int = 1
    kill_steps: list[int] | None = None
    kill_mode: str = "step"  # step | save | mixed (alternating, starting with step)
    kills_seed: int = 0
    noise_tolerance: float = 3.0
    state_every_n_steps: int = 1
    keep_checkpoints: bool = False
    claim_checkpoint: str | None = None
    attempt_timeout_s: float = 1800.0
    parallel_controls: bool = False  # run the two controls at the same time (needs the cores/memory for two)

    def validate(self) -> None:
        if self.steps < 2:
            raise EvidenceConfigError(f"evidence.steps must be >= 2, got {self.steps}")
        if self.interruptions < 1:
            raise EvidenceConfigError(f"evidence.interruptions must be >= 1, got {self.interruptions}")
        if self.kill_mode not in (*KILL_MODES, "mixed"):
            raise EvidenceConfigError(f"evidence.kill_mode must be one of step, save, mixed; got {self.kill_mode!r}")
        if self.noise_tolerance < 1:
            raise EvidenceConfigError(f"evidence.noise_tolerance must be >= 1, got {self.noise_tolerance}")


@dataclass
class Kill:
    step: int
    mode: str


def plan_kills(settings: EvidenceSettings, save_every: int | None) -> list[Kill]:
    """Where each interrupted run dies. Random steps always leave a committed checkpoint behind
    them, so every interruption exercises a restore rather than a restart from scratch."""
    settings.validate()
    modes = [
        ("save" if settings.kill_mode == "save" or (settings.kill_mode == "mixed" and i % 2 == 1) else "step")
        for i in range(settings.interruptions)
    ]
    if "save" in modes and not save_every:
        raise EvidenceConfigError(
            "a kill during a save needs step-based checkpoints: set callbacks.checkpoint.every_n_train_steps"
        )
    if settings.kill_steps is not None:
        steps = list(settings.kill_steps)
        if len(steps) != settings.interruptions:
            raise EvidenceConfigError(
                f"evidence.kill_steps has {len(steps)} entries for {settings.interruptions} interruptions"
            )
        for step, mode in zip(steps, modes, strict=True):
            if not 1 <= step < settings.steps:
                raise EvidenceConfigError(f"kill step {step} is outside 1..{settings.steps - 1}")
            if save_every and step < save_every:
                raise EvidenceConfigError(
                    f"evidence.kill_steps: kill step {step} comes before the first checkpoint (step {save_every},"
                    f" every_n_train_steps={save_every}): the resume would restart from scratch, which tests no"
                    f" restore; use a step >= {save_every}"
                )
            if mode == "save" and step % int(save_every or 1):
                raise EvidenceConfigError(
                    f"kill step {step} is not a checkpoint step (every_n_train_steps={save_every}):"
                    " nothing is saved there to interrupt"
                )
        return [Kill(step, mode) for step, mode in zip(steps, modes, strict=True)]
    rng = random.Random(settings.kills_seed)
    first_commit = int(save_every or 1)
    kills = []
    for mode in modes:
        if mode == "save":
            candidates = [s for s in range(2 * first_commit, settings.steps, first_commit)]
        else:
            candidates = list(range(first_commit + 1, settings.steps))
        if not candidates:
            raise EvidenceConfigError(
                f"evidence.steps={settings.steps} is too short to kill after a committed checkpoint"
                f" (every_n_train_steps={save_every}): raise evidence.steps"
            )
        kills.append(Kill(rng.choice(candidates), mode))
    return kills


@dataclass
class Attempt:
    attempt: int
    returncode: int
    launched_unix: float
    ended_unix: float
    log: Path


@dataclass
class RunResult:
    """What one run left on disk, read back after it finished."""

    name: str
    run_dir: Path
    kill: Kill | None
    attempts: list[Attempt] = field(default_factory=list)
    raw_records: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    timelines: dict[int, dict[str, Any]] = field(default_factory=dict)
    kill_record: dict[str, Any] | None = None
    final_state: dict[str, Any] | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)

    @property
    def is_control(self) -> bool:
        return self.kill is None


def child_env(extra_path: Sequence[str]) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*extra_path, *filter(None, [env.get("PYTHONPATH")])])
    return env


@dataclass
class _Child:
    spec: RunSpec
    process: subprocess.Popen[bytes]
    log_path: Path


def _spawn(spec: RunSpec, cwd: Path) -> _Child:
    run_dir = Path(spec.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    spec_path = run_dir / f"spec-{spec.attempt}.json"
    log_path = run_dir / f"attempt-{spec.attempt}.log"
    spec.launched_unix = time.time()
    spec.write(spec_path)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "lightning_field.evidence.worker", str(spec_path)],
            cwd=cwd,
            env=child_env(spec.extra_sys_path),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: a kill takes every rank and worker with it
        )
    return _Child(spec, process, log_path)


def _wait(child: _Child, timeout_s: float) -> Attempt:
    proc = child.process
    try:
        returncode = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        returncode = proc.wait()
        with open(child.log_path, "a") as log:
            log.write(f"\n[lightning_field] attempt killed after the {timeout_s:.0f} s timeout\n")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # ranks or loader workers left behind
    assert child.spec.launched_unix is not None
    return Attempt(child.spec.attempt, returncode, child.spec.launched_unix, time.time(), child.log_path)


def _launch(spec: RunSpec, cwd: Path, timeout_s: float) -> Attempt:
    return _wait(_spawn(spec, cwd), timeout_s)


def _collect(result: RunResult, keep_checkpoints: bool) -> None:
    run_dir = result.run_dir
    trace_dir = run_dir / TRACE
    ranks = sorted(int(p.stem.split("-")[1]) for p in trace_dir.glob("rank-*.jsonl")) if trace_dir.is_dir() else []
    result.raw_records = {rank: read_trace(trace_dir, rank) for rank in ranks}
    for attempt in result.attempts:
        path = attempt_file(trace_dir, attempt.attempt)
        if path.is_file():
            result.timelines[attempt.attempt] = json.loads(path.read_text())
    kill_path = run_dir / KILL_RECORD
    if kill_path.is_file():
        result.kill_record = json.loads(kill_path.read_text())
    final_path = run_dir / FINAL_STATE
    if final_path.is_file():
        result.final_state = torch.load(final_path, map_location="cpu", weights_only=False)
    result.events = read_events(run_dir)
    manifests_dir = run_dir / "manifests"
    manifests_dir.mkdir(exist_ok=True)
    for entry in committed_checkpoints(run_dir / CHECKPOINTS):
        report = verify_checkpoint(entry.path)
        copy = manifests_dir / f"{entry.path.name}.json"
        shutil.copyfile(entry.path / MANIFEST_NAME, copy)
        result.checkpoints.append(
            {
                "name": entry.path.name,
                "path": str(entry.path),
                "manifest_copy": str(copy),
                "step": entry.manifest.step if entry.manifest else None,
                "recoverable": report.recoverable,
                "intact": report.intact,
                "problems": report.problems,
                "provenance": entry.manifest.provenance if entry.manifest else {},
            }
        )
    if not keep_checkpoints:
        # The manifests are the cited artifact; the tensors are as large as the model.
        shutil.rmtree(run_dir / CHECKPOINTS, ignore_errors=True)
        final_path.unlink(missing_ok=True)


def _spec_for(
    name: str,
    kill: Kill | None,
    config: Mapping[str, Any],
    settings: EvidenceSettings,
    runs_dir: Path,
    extra_path: list[str],
) -> RunSpec:
    return RunSpec(
        name=name,
        run_dir=str(runs_dir / name),
        config=dict(config),
        max_steps=settings.steps,
        kill_step=kill.step if kill else None,
        kill_mode=kill.mode if kill else "step",
        state_every_n_steps=settings.state_every_n_steps,
        extra_sys_path=extra_path,
    )


def run_protocol(
    config: Mapping[str, Any], settings: EvidenceSettings, bundle_dir: Path, cwd: Path | None = None
) -> list[RunResult]:
    """Run the controls and the interrupted runs; return what each left behind."""
    cwd = cwd or Path.cwd()
    save_every = (config.get("callbacks", {}).get("checkpoint") or {}).get("every_n_train_steps")
    kills = plan_kills(settings, save_every)
    extra_path = [str(cwd)]
    runs_dir = bundle_dir / "runs"
    if bundle_dir.exists() and any(bundle_dir.iterdir()):
        raise EvidenceConfigError(f"the bundle directory {bundle_dir} is not empty: each bundle needs a fresh one")
    plan: list[tuple[str, Kill | None]] = [("control-1", None), ("control-2", None)]
    plan += [(f"interrupted-{i + 1}", kill) for i, kill in enumerate(kills)]
    results = []
    if settings.parallel_controls:
        # Both controls at once: halves their wall time where cores (and device memory) allow.
        controls = [_spec_for(name, kill, config, settings, runs_dir, extra_path) for name, kill in plan[:2]]
        children = [_spawn(spec, cwd) for spec in controls]
        for spec, child in zip(controls, children, strict=True):
            result = RunResult(name=spec.name, run_dir=Path(spec.run_dir), kill=None)
            result.attempts.append(_wait(child, settings.attempt_timeout_s))
            print(f"[field-evidence] {spec.name}: uninterrupted (in parallel), exit {result.attempts[-1].returncode}")
            _collect(result, settings.keep_checkpoints)
            results.append(result)
        plan = plan[2:]
    for name, kill in plan:
        run_dir = runs_dir / name
        result = RunResult(name=name, run_dir=run_dir, kill=kill)
        spec = _spec_for(name, kill, config, settings, runs_dir, extra_path)
        print(
            f"[field-evidence] {name}: {'uninterrupted' if kill is None else f'kill at step {kill.step} ({kill.mode})'}"
        )
        result.attempts.append(_launch(spec, cwd, settings.attempt_timeout_s))
        if kill is not None and result.attempts[-1].returncode == -signal.SIGKILL:
            resume = RunSpec(**{**spec.__dict__, "attempt": 2, "resume": True, "kill_step": None})
            result.attempts.append(_launch(resume, cwd, settings.attempt_timeout_s))
        for attempt in result.attempts:
            print(f"[field-evidence]   attempt {attempt.attempt}: exit {attempt.returncode}, log {attempt.log}")
            planned = kill is not None and attempt.attempt == 1 and attempt.returncode == -signal.SIGKILL
            if attempt.returncode != 0 and not planned:
                print(failure_tail(attempt.log), flush=True)
        _collect(result, settings.keep_checkpoints)
        results.append(result)
        if kill is None and result.attempts[-1].returncode != 0:
            # The rest would run the same code into the same failure: the gate fails on what ran.
            print(f"[field-evidence] {name} failed: the remaining runs are not started", flush=True)
            break
    return results


def failure_tail(log: Path, lines: int = 10) -> str:
    """The end of a failed child's log, indented, for the console: the cause is usually there."""
    try:
        text = Path(log).read_text(errors="replace").rstrip().splitlines()
    except OSError as err:
        return f"[field-evidence]     (log unreadable: {err})"
    return "\n".join(f"[field-evidence]     {line}" for line in text[-lines:])
