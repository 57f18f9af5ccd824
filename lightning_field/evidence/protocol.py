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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from lightning_field.checkpoint.resolver import committed_checkpoints
from lightning_field.checkpoint.verify import verify_checkpoint
from lightning_field.core.events import read_run_events
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


class Launcher(Protocol):
    """How the protocol starts one attempt of one run and waits for it.

    Call order, per attempt: ``spawn`` (returns at once; the attempt runs), then ``wait`` (blocks
    until it exited, was killed by its own fault drill, or ran past ``timeout_s``, in which case the
    launcher kills its whole process group). Several attempts may be spawned before the first
    ``wait``. The attempt must run ``lightning_field.evidence.worker.run(spec)`` in a process of its
    own, in a process group of its own, so that a drill's SIGKILL takes every rank and DataLoader
    worker of that attempt and nothing else. Its output goes to ``attempt-<n>.log`` in the run
    directory.
    """

    def spawn(self, spec: RunSpec, cwd: Path) -> Any: ...

    def wait(self, handle: Any, timeout_s: float) -> Attempt: ...


@dataclass
class _Child:
    spec: RunSpec
    process: subprocess.Popen[bytes]
    log_path: Path


def prepare_attempt(spec: RunSpec) -> tuple[Path, Path]:
    """Write the attempt's spec into its run directory; (spec path, log path)."""
    run_dir = Path(spec.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    spec_path = run_dir / f"spec-{spec.attempt}.json"
    spec.launched_unix = time.time()
    spec.write(spec_path)
    return spec_path, run_dir / f"attempt-{spec.attempt}.log"


def note_timeout(log_path: Path, timeout_s: float) -> None:
    with open(log_path, "a") as log:
        log.write(f"\n[lightning_field] attempt killed after the {timeout_s:.0f} s timeout\n")


class SubprocessLauncher:
    """A fresh interpreter per attempt (``python -m lightning_field.evidence.worker SPEC``), as a
    user starts a job: a resume is a real cold start, imports and all. Lightning's DDP launcher
    re-runs the same command for the other ranks."""

    def spawn(self, spec: RunSpec, cwd: Path) -> _Child:
        spec_path, log_path = prepare_attempt(spec)
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

    def wait(self, handle: _Child, timeout_s: float) -> Attempt:
        proc = handle.process
        try:
            returncode = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            returncode = proc.wait()
            note_timeout(handle.log_path, timeout_s)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # ranks or loader workers left behind
        assert handle.spec.launched_unix is not None
        return Attempt(handle.spec.attempt, returncode, handle.spec.launched_unix, time.time(), handle.log_path)


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
    result.events = read_run_events(run_dir)
    (manifests_dir := run_dir / "manifests").mkdir(exist_ok=True)
    for entry in committed_checkpoints(run_dir / CHECKPOINTS):
        path = Path(entry.path)  # a local run directory: every entry is a Path
        report = verify_checkpoint(path)
        copy = manifests_dir / f"{path.name}.json"
        shutil.copyfile(path / MANIFEST_NAME, copy)
        result.checkpoints.append(
            {
                "name": path.name,
                "path": str(path),
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


def _announce(name: str, kill: Kill | None, note: str = "") -> None:
    what = "uninterrupted" if kill is None else f"kill at step {kill.step} ({kill.mode})"
    print(f"[field-evidence] {name}: {what}{note}", flush=True)


def _report(result: RunResult) -> None:
    for attempt in result.attempts:
        print(f"[field-evidence]   attempt {attempt.attempt}: exit {attempt.returncode}, log {attempt.log}")
        planned = result.kill is not None and attempt.attempt == 1 and attempt.returncode == -signal.SIGKILL
        if attempt.returncode != 0 and not planned:
            print(failure_tail(attempt.log), flush=True)


def _run_together(
    runs: Sequence[tuple[RunResult, RunSpec]], launcher: Launcher, cwd: Path, settings: EvidenceSettings
) -> None:
    """Every run's first attempt at once, then every killed run's resume at once; collected after."""
    handles = [launcher.spawn(spec, cwd) for _, spec in runs]
    for (result, _), handle in zip(runs, handles, strict=True):
        result.attempts.append(launcher.wait(handle, settings.attempt_timeout_s))
    resumes = []
    for result, spec in runs:
        if result.kill is not None and result.attempts[-1].returncode == -signal.SIGKILL:
            resume = RunSpec(**{**spec.__dict__, "attempt": 2, "resume": True, "kill_step": None})
            resumes.append((result, launcher.spawn(resume, cwd)))
    for result, handle in resumes:
        result.attempts.append(launcher.wait(handle, settings.attempt_timeout_s))
    for result, _ in runs:
        _report(result)
        _collect(result, settings.keep_checkpoints)


def run_protocol(
    config: Mapping[str, Any],
    settings: EvidenceSettings,
    bundle_dir: Path,
    cwd: Path | None = None,
    launcher: Launcher | None = None,
    resolve_kill_steps: Callable[[RunResult], list[int]] | None = None,
    concurrent: bool = False,
) -> list[RunResult]:
    """Run the controls and the interrupted runs; return what each left behind.

    Args:
        launcher: how attempts are started (default: a fresh interpreter each, ``SubprocessLauncher``).
        resolve_kill_steps: where the kills go, decided from control 1's record once it has run
            (a named position such as an epoch's end needs the run's epoch length); it replaces
            ``settings.kill_steps``, and is validated like it.
        concurrent: after control 1, run control 2 and every interrupted run at once (then every
            resume at once), where cores allow; ``settings.parallel_controls`` pairs the two controls.
    """
    cwd = cwd or Path.cwd()
    launcher = launcher or SubprocessLauncher()
    save_every = (config.get("callbacks", {}).get("checkpoint") or {}).get("every_n_train_steps")
    kills = plan_kills(settings, save_every) if resolve_kill_steps is None else []
    extra_path = [str(cwd)]
    runs_dir = bundle_dir / "runs"
    if bundle_dir.exists() and any(bundle_dir.iterdir()):
        raise EvidenceConfigError(f"the bundle directory {bundle_dir} is not empty: each bundle needs a fresh one")

    def prepared(name: str, kill: Kill | None) -> tuple[RunResult, RunSpec]:
        spec = _spec_for(name, kill, config, settings, runs_dir, extra_path)
        return RunResult(name=name, run_dir=runs_dir / name, kill=kill), spec

    results: list[RunResult] = []
    if settings.parallel_controls and not concurrent and resolve_kill_steps is None:
        # Both controls at once: halves their wall time where cores (and device memory) allow.
        controls = [prepared(name, None) for name in ("control-1", "control-2")]
        for result, _ in controls:
            _announce(result.name, None, " (in parallel)")
        _run_together(controls, launcher, cwd, settings)
        results += [result for result, _ in controls]
        rest = [prepared(f"interrupted-{i + 1}", kill) for i, kill in enumerate(kills)]
    else:
        first = prepared("control-1", None)
        _announce("control-1", None)
        _run_together([first], launcher, cwd, settings)
        results.append(first[0])
        if first[0].attempts[-1].returncode != 0:
            print("[field-evidence] control-1 failed: the remaining runs are not started", flush=True)
            return results
        if resolve_kill_steps is not None:
            settings.kill_steps = resolve_kill_steps(first[0])
            settings.interruptions = len(settings.kill_steps)
            kills = plan_kills(settings, save_every)
        rest = [prepared("control-2", None)] + [prepared(f"interrupted-{i + 1}", kill) for i, kill in enumerate(kills)]
    if concurrent:
        for result, _ in rest:
            _announce(result.name, result.kill, " (concurrently)")
        _run_together(rest, launcher, cwd, settings)
        return results + [result for result, _ in rest]
    for result, spec in rest:
        _announce(result.name, result.kill)
        _run_together([(result, spec)], launcher, cwd, settings)
        results.append(result)
        if result.kill is None and result.attempts[-1].returncode != 0:
            # The rest would run the same code into the same failure: the gate fails on what ran.
            print(f"[field-evidence] {result.name} failed: the remaining runs are not started", flush=True)
            break
    return results


def failure_tail(log: Path, lines: int = 10) -> str:
    """The end of a failed child's log, indented, for the console: the cause is usually there."""
    try:
        text = Path(log).read_text(errors="replace").rstrip().splitlines()
    except OSError as err:
        return f"[field-evidence]     (log unreadable: {err})"
    return "\n".join(f"[field-evidence]     {line}" for line in text[-lines:])
