"""``assert_resumes_exactly``: the controlled resume protocol as one assertion in a test suite.

A refactor that adds state outside every ``state_dict`` (a Python counter, a cached tensor, a
sampler's private RNG, a new scheduler) breaks exact resume silently: the run continues, only
differently. This assertion turns that into a red test on the change that caused it, long before a
preempted week-long run finds out. It runs what ``field-evidence`` runs (``evidence/protocol.py``):
two uninterrupted controls and one run per kill position, killed for real with SIGKILL in a child
process and resumed from its latest recoverable checkpoint, then compares them step by step
(``evidence/compare.py``) and writes the evidence bundle (``evidence/bundle.py``).

What is different from the command line is only the cost: the attempts are forked from a warm
interpreter (``testing/launcher.py``), the runs after the first control run at once, and the
default run is eight steps.
"""

from __future__ import annotations

import importlib
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KILL_POSITIONS = ("mid-epoch", "epoch-end")
"""Named kill positions, resolved against the run's own epoch length (from the first control)."""

_RESERVED_TRAINER_KEYS = (
    "max_steps",
    "callbacks",
    "logger",
    "default_root_dir",
    "enable_progress_bar",
    "enable_model_summary",
)
"""Trainer arguments the protocol sets itself: the run length, its tracer, fault drill and checkpoints."""


class ResumeCheckFailed(AssertionError):
    """The continuation after a real kill and resume differs from the uninterrupted runs.

    Attributes:
        bundle: the evidence bundle directory (``evidence.md`` explains, ``runs/`` holds the logs).
        evidence: the bundle's ``evidence.json`` content.
    """

    def __init__(self, message: str, bundle: Path, evidence: Mapping[str, Any]) -> None:
        super().__init__(message)
        self.bundle = bundle
        self.evidence = evidence


@dataclass
class ResumeEvidence:
    """What a passing check returns: the bundle and its verdict (``exact`` or ``within_noise``)."""

    bundle: Path
    verdict: str
    evidence: dict[str, Any]

    @property
    def markdown(self) -> Path:
        return self.bundle / "evidence.md"


def import_path(factory: str | Callable[..., Any], role: str) -> str:
    """The dotted import path a child process instantiates ``factory`` from.

    Raises:
        TypeError: ``factory`` cannot be imported by name in another process (a lambda, a function
            or class defined inside another function, or one defined in ``__main__``).
        ImportError: a string path that does not import.
    """
    if isinstance(factory, str):
        path = factory.replace(":", ".")
        module_name, _, attr = path.rpartition(".")
        try:
            target = importlib.import_module(module_name)
            for part in attr.split("."):
                target = getattr(target, part)
        except (ImportError, AttributeError, ValueError) as err:
            raise ImportError(f"{role} {factory!r} does not import: {err}") from None
        return path
    if not callable(factory):
        raise TypeError(f"{role} must be a class, a module-level function or an import path string, got {factory!r}")
    module = getattr(factory, "__module__", None)
    qualname = getattr(factory, "__qualname__", "")
    fix = (
        "each run is a separate process that imports it by name: define it at module level in an importable"
        " module or in the test file itself (def make_model(): ...), or pass its import path as a string"
        " ('my_project.models.MyModel')"
    )
    if getattr(factory, "__name__", "") == "<lambda>":
        raise TypeError(f"{role} is a lambda; {fix}")
    if "<locals>" in qualname:
        raise TypeError(f"{role} {qualname} is defined inside a function; {fix}")
    if module in (None, "__main__", "__mp_main__"):
        raise TypeError(f"{role} {qualname} is defined in __main__ (a script run directly); {fix}")
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if found is not factory:
        raise TypeError(f"{role} {module}.{qualname} is not reachable under that name; {fix}")
    return f"{module}.{qualname}"


def _kill_positions(kill_at: int | str | Sequence[int | str]) -> list[int | str]:
    positions = [kill_at] if isinstance(kill_at, (int, str)) else list(kill_at)
    if not positions:
        raise ValueError("kill_at is empty: give at least one step or named position")
    for position in positions:
        if isinstance(position, bool) or not isinstance(position, (int, str)):
            raise TypeError(f"kill_at entries are steps (int) or one of {KILL_POSITIONS}, got {position!r}")
        if isinstance(position, str) and position not in KILL_POSITIONS:
            raise ValueError(
                f"kill_at={position!r} is not a named position; use a step number or one of {KILL_POSITIONS}"
            )
    return positions


def steps_per_epoch(records: Sequence[Mapping[str, Any]], steps: int) -> int | None:
    """Optimizer steps in the first epoch of a control run's rank-0 trace; None if it never ended."""
    epochs = {int(r["epoch"]) for r in records}
    if len(epochs) < 2:
        return None
    return max(int(r["step"]) for r in records if int(r["epoch"]) == min(epochs))


def resolve_kill_steps(
    positions: Sequence[int | str], epoch_steps: int | None, steps: int, save_every: int
) -> list[int]:
    """Named positions as steps: ``mid-epoch`` is a step strictly inside the first epoch that is not
    a checkpoint step (so work is lost and replayed from the checkpoint before it); ``epoch-end``
    is the first epoch end after the first checkpoint (the kill lands before that epoch's save).

    Raises:
        ValueError: the run is too short, or its epochs too short, for the position.
    """
    resolved = []
    for position in positions:
        if isinstance(position, int):
            resolved.append(position)
        elif position == "mid-epoch":
            end = min(epoch_steps or steps, steps)
            candidates = [s for s in range(save_every + 1, end) if s % save_every] or list(range(save_every + 1, end))
            if not candidates:
                raise ValueError(
                    f"kill_at='mid-epoch' needs a step inside an epoch after the first checkpoint (step {save_every}):"
                    f" {'an epoch is ' + str(epoch_steps) if epoch_steps else 'the run is ' + str(steps)} steps long;"
                    " raise steps, or the batches per epoch"
                )
            resolved.append(candidates[len(candidates) // 2])
        else:
            if epoch_steps is None:
                raise ValueError(
                    f"kill_at='epoch-end' needs an epoch to end within the run: no epoch ended in {steps} steps;"
                    " raise steps, or set Trainer(limit_train_batches=...) lower"
                )
            ends = [e for e in range(epoch_steps, steps, epoch_steps) if e >= save_every]
            if not ends:
                raise ValueError(
                    f"kill_at='epoch-end' needs an epoch end after the first checkpoint (step {save_every}) and"
                    f" before the last step ({steps}); epochs are {epoch_steps} steps: raise steps to at least"
                    f" {max(epoch_steps, save_every) + 1}"
                )
            resolved.append(ends[0])
    return resolved


def _tolerance(tolerance: str | float) -> float | None:
    """None for "exact"; the noise multiplier otherwise."""
    if tolerance == "exact":
        return None
    if tolerance == "noise":
        return 3.0
    if isinstance(tolerance, (int, float)) and not isinstance(tolerance, bool) and tolerance >= 1:
        return float(tolerance)
    raise ValueError(f"tolerance must be 'exact', 'noise' or a noise multiplier >= 1, got {tolerance!r}")


def build_config(
    module: str,
    data: str | None,
    module_kwargs: Mapping[str, Any],
    data_kwargs: Mapping[str, Any],
    trainer: Mapping[str, Any],
    checkpoint: Mapping[str, Any],
    devices: int,
    seed: int,
) -> dict[str, Any]:
    """The run configuration, in the shape ``field-evidence`` composes with Hydra."""
    reserved = sorted(set(trainer) & set(_RESERVED_TRAINER_KEYS))
    if reserved:
        raise ValueError(
            f"trainer={{{', '.join(reserved)}: ...}} is set by the check itself (the run length is `steps`,"
            " checkpoints are `checkpoint=`); remove it"
        )
    trainer_config: dict[str, Any] = {
        "_target_": "lightning.pytorch.Trainer",
        "accelerator": "cpu",
        "devices": devices,
        "num_sanity_val_steps": 0,
    }
    if devices > 1:
        trainer_config["strategy"] = "ddp"
    trainer_config.update(trainer)
    return {
        "seed": seed,
        "seed_workers": True,
        "model": {"_target_": module, **module_kwargs},
        "data": {"_target_": data, **data_kwargs} if data else None,
        "trainer": trainer_config,
        "callbacks": {
            "checkpoint": {"_target_": "lightning_field.ManifestCheckpoint", "every_n_train_steps": 2, **checkpoint}
        },
    }


def assert_resumes_exactly(
    module: str | Callable[..., Any],
    data: str | Callable[..., Any] | None = None,
    *,
    steps: int = 8,
    kill_at: int | str | Sequence[int | str] = "mid-epoch",
    devices: int = 1,
    tolerance: str | float = "exact",
    module_kwargs: Mapping[str, Any] | None = None,
    data_kwargs: Mapping[str, Any] | None = None,
    trainer: Mapping[str, Any] | None = None,
    checkpoint: Mapping[str, Any] | None = None,
    seed: int = 0,
    bundle_dir: str | Path | None = None,
    timeout_s: float = 300.0,
    launcher: Any = None,
) -> ResumeEvidence:
    """Kill a short training run for real, resume it, and assert it continues exactly as an
    uninterrupted run does.

    Two uninterrupted controls and one interrupted run per ``kill_at`` position train ``steps``
    optimizer steps each, with a :class:`~lightning_field.ManifestCheckpoint` every 2 steps (see
    ``checkpoint``). Each interrupted run is SIGKILLed in its own process right after the step named,
    before that step is saved, and restarted with the latest recoverable checkpoint. Every batch's
    data, RNG streams, weights and optimizer state, and every step's loss, are compared with
    control 1's; the controls are compared with each other first.

    Args:
        module: the LightningModule: a class, a module-level factory function, or an import path
            ("pkg.models.MyModel" or "pkg.models:make_model"). Each run imports it by name.
        data: a LightningDataModule (or a function returning one, or a train DataLoader), named the
            same way; None when the module defines its own ``train_dataloader``.
        steps: optimizer steps per run.
        kill_at: where each interrupted run dies: a step number, ``"mid-epoch"`` (a step inside the
            first epoch that is not a checkpoint step) or ``"epoch-end"`` (the first epoch's last
            step), or several of them (one interrupted run each).
        devices: 1, or 2 for a gloo DDP job on CPU.
        tolerance: ``"exact"`` (bitwise, the default), ``"noise"`` (within 3x the difference the two
            controls show, for runs that are not reproducible even uninterrupted), or that
            multiplier as a number.
        module_kwargs, data_kwargs: keyword arguments for the two factories.
        trainer: further ``Trainer`` arguments (``accelerator`` defaults to "cpu").
        checkpoint: ``ManifestCheckpoint`` arguments (``every_n_train_steps`` defaults to 2).
        seed: passed to ``seed_everything`` in every run.
        bundle_dir: where the evidence bundle goes (a fresh temporary directory by default).
        timeout_s: per attempt; an attempt past it is killed and the check fails.
        launcher: how attempts start (default: forked from a warm fork server,
            :class:`~lightning_field.testing.launcher.ForkedLauncher`).

    Returns:
        The evidence bundle of a passing check.

    Raises:
        ResumeCheckFailed: (an ``AssertionError``) the resumed run diverged, or a run failed; the
            message names the first divergent step and component, and the bundle.
        TypeError, ImportError, ValueError: the arguments cannot make a check (named in the message).

    Example::

        from lightning_field.testing import assert_resumes_exactly

        def test_my_model_resumes_exactly():
            assert_resumes_exactly("my_project.models.MyModel", "my_project.data.MyData", kill_at="mid-epoch")
    """
    # The pytest plugin imports this module in every suite: torch and Lightning load only when a check runs.
    from lightning_field.evidence.bundle import build_evidence, write_bundle
    from lightning_field.evidence.protocol import EvidenceSettings, RunResult, run_protocol
    from lightning_field.evidence.trace import read_trace
    from lightning_field.testing.launcher import ForkedLauncher

    if steps < 3:
        raise ValueError(f"steps must be >= 3 (a checkpoint, a kill after it, a step to resume), got {steps}")
    if devices not in (1, 2):
        raise ValueError(f"devices must be 1 or 2 (gloo DDP on CPU), got {devices}")
    positions = _kill_positions(kill_at)
    noise = _tolerance(tolerance)
    module_path = import_path(module, "module")
    data_path = import_path(data, "data") if data is not None else None
    config = build_config(
        module_path,
        data_path,
        dict(module_kwargs or {}),
        dict(data_kwargs or {}),
        dict(trainer or {}),
        dict(checkpoint or {}),
        devices,
        seed,
    )
    save_every = config["callbacks"]["checkpoint"].get("every_n_train_steps")
    if not save_every:
        raise ValueError("checkpoint= needs every_n_train_steps: the kills are placed between step-based checkpoints")
    bundle = Path(bundle_dir) if bundle_dir is not None else Path(tempfile.mkdtemp(prefix="lightning-field-resume-"))
    bundle = bundle.resolve()

    def kill_steps(control: RunResult) -> list[int]:
        epoch = steps_per_epoch(read_trace(control.run_dir / "trace", 0), steps)
        return resolve_kill_steps(positions, epoch, steps, int(save_every))

    settings = EvidenceSettings(
        steps=steps, interruptions=len(positions), noise_tolerance=noise or 3.0, attempt_timeout_s=timeout_s
    )
    results = run_protocol(
        config,
        settings,
        bundle,
        cwd=Path.cwd(),
        launcher=launcher or ForkedLauncher(devices),
        resolve_kill_steps=kill_steps,
        concurrent=True,
    )
    evidence, plots = build_evidence(results, settings, config, bundle)
    write_bundle(evidence, plots, bundle)
    passed = evidence["gate"]["passed"] and (noise is not None or evidence["verdict"] == "exact")
    if not passed:
        raise ResumeCheckFailed(failure_message(evidence, bundle, module_path, noise is None), bundle, evidence)
    return ResumeEvidence(bundle, evidence["verdict"], evidence)


def failure_message(evidence: Mapping[str, Any], bundle: Path, module: str, exact: bool) -> str:
    """One screen: what failed, where it first diverged and in what, and where the bundle is."""
    lines = [f"{module} does not resume {'exactly' if exact else 'within noise'}: {evidence['summary']}"]
    failed = [c for c in evidence["critical_conditions"] if not c["passed"]]
    for condition in failed:
        if condition["name"] != "verdict_not_fail":
            lines.append(f"  {condition['name']}: {condition['detail'][:300]}")
    for comparison in evidence.get("comparisons", []):
        divergence = comparison.get("first_divergence")
        final = comparison["final"]
        if divergence:
            where = (
                f"first divergence at step {divergence['step']} (epoch {divergence['epoch']}, batch"
                f" {divergence['batch_idx']}, rank {divergence['rank']}): {divergence['component']}"
            )
            extra = [c for c in divergence["components"] if c != divergence["component"]]
            where += f" (also {', '.join(extra)})" if extra else ""
        elif not (final["weights_equal"] and final["optimizer_equal"]):
            where = "every step equal; the final weights or optimizer state differ"
        else:
            where = "identical"
        resumed = f", resumed from step {comparison['resume_step']}" if comparison.get("resume_step") else ""
        lines.append(f"  {comparison['name']} vs control-1{resumed}: {where}")
    if exact and evidence["verdict"] == "within_noise":
        lines.append(
            "  the controls differ from each other too: the run is not reproducible uninterrupted (nondeterministic"
            " ops or unseeded randomness); fix that, or pass tolerance='noise'"
        )
    lines.append(f"  evidence: {bundle / 'evidence.md'}")
    lines.append(f"  logs: {bundle / 'runs'}/<run>/attempt-<n>.log")
    return "\n".join(lines)
