"""The comparison and the verdict: pure functions of the runs' step records and final states.

Each record carries digests of what went *into* a batch (RNG streams, the batch's bytes, weights,
optimizer state) and the loss that came out. Walking two runs in step order, the first record that
differs, and the first differing field in causal order, names what diverged: a broken RNG restore
shows as "RNG" before it can alter augmentation or dropout; a wrong data position as "data order";
state that lives outside every ``state_dict`` as "loss" (or "weights" one step later).

Verdicts:
    exact         every interrupted run is bitwise equal to the controls, which are equal to each other.
    within_noise  the controls already differ; each interrupted run differs from control 1 by no more
                  than ``tolerance`` times control 2 does, on the statistics named in ``STATISTIC``.
    fail          anything else.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

# Causal order within one batch: where the loader is (the same batch index must be the same step),
# the RNG and the data go in, the weights, optimizer and scheduler state and the torchmetrics states
# accumulated so far are the starting point, the loss comes out.
COMPONENTS: tuple[tuple[str, str, str], ...] = (
    ("position", "step", "data position"),
    ("rng", "rng", "RNG"),
    ("data", "batch", "data order"),
    ("weights", "weights", "weights"),
    ("optimizer", "optimizer", "optimizer"),
    ("scheduler", "scheduler", "scheduler"),
    ("metrics", "metrics", "logged metrics"),
    ("loss", "loss", "loss"),
)
LABELS = {name: label for name, _, label in COMPONENTS}
# What goes *into* a step. Floating-point nondeterminism cannot change these, so when the controls
# agree on them a difference here is a resume bug even in a run whose numbers are noisy.
STRUCTURAL = ("position", "rng", "data")

EXACT, WITHIN_NOISE, FAIL = "exact", "within_noise", "fail"
STATISTIC = (
    "mean |Δloss| (rank 0) over the steps trained after the resume, max |Δ| over every final parameter, and max |Δ|"
    " over the final optimizer and scheduler state; an interrupted run is within noise when each is <= tolerance x"
    " the same statistic between the two controls (over the same steps), and when it differs from control 1 in data"
    " position, RNG or batches only where the controls differ too"
)

Key = tuple[int, int]  # (epoch, batch index): stable across attempts, unlike a process's own counters


def step_of(record: Mapping[str, Any]) -> int:
    """The optimizer step a batch works towards (1-based); with gradient accumulation several
    batches share one, and the first batch after a resume from step r belongs to step r + 1."""
    if "step_before" in record:
        return int(record["step_before"]) + 1
    return int(record["step"])


def effective_records(records: Iterable[Mapping[str, Any]]) -> dict[Key, dict[str, Any]]:
    """One record per batch, as the run's final history has it.

    A restarted attempt invalidates what earlier attempts recorded from its own starting point on
    (that work was lost with the kill): every later batch position, and every later optimizer step.
    A batch the continuation skipped therefore shows up as missing, or at the wrong step, instead of
    being papered over by the killed attempt's record of it.
    """
    by_key: dict[Key, dict[str, Any]] = {}
    attempts: dict[int, list[Mapping[str, Any]]] = {}
    for record in records:
        attempts.setdefault(int(record.get("attempt", 1)), []).append(record)
    for attempt in sorted(attempts):
        batch = {(int(r["epoch"]), int(r["batch_idx"])): dict(r) for r in attempts[attempt]}
        first_key = min(batch)
        resumed_at = int(batch[first_key]["step_before"])
        by_key = {key: r for key, r in by_key.items() if key < first_key and int(r["step"]) <= resumed_at}
        by_key.update(batch)
    return dict(sorted(by_key.items()))


@dataclass
class Divergence:
    step: int
    epoch: int
    batch_idx: int
    rank: int
    components: list[str]

    @property
    def primary(self) -> str:
        return self.components[0]

    def describe(self) -> str:
        names = ", ".join(LABELS.get(c, c) for c in self.components)
        return f"step {self.step} (epoch {self.epoch}, batch {self.batch_idx}, rank {self.rank}): {names}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "epoch": self.epoch,
            "batch_idx": self.batch_idx,
            "rank": self.rank,
            "components": [LABELS.get(c, c) for c in self.components],
            "component": LABELS.get(self.primary, self.primary),
        }


def _differing_components(a: Mapping[str, Any], b: Mapping[str, Any], only: Sequence[str] | None) -> list[str]:
    differing = []
    for name, key, _ in COMPONENTS:
        if only is not None and name not in only:
            continue
        if key in a and key in b and a[key] != b[key]:
            differing.append(name)
    return differing


def first_divergence(
    reference: Mapping[int, Mapping[Key, Mapping[str, Any]]],
    other: Mapping[int, Mapping[Key, Mapping[str, Any]]],
    only: Sequence[str] | None = None,
) -> Divergence | None:
    """The earliest batch (over all ranks) where ``other`` differs from ``reference`` (in ``only``
    those components, when given). A rank or batch the other run lacks is a data-position divergence."""
    found: list[tuple[Key, Divergence]] = []
    for rank, ref_records in reference.items():
        other_records = other.get(rank, {})
        for key, ref in ref_records.items():
            missing = key not in other_records
            components = ["position"] if missing else _differing_components(ref, other_records[key], only)
            if components:
                found.append((key, Divergence(step_of(ref), key[0], key[1], rank, components)))
                break
    if not found:
        return None
    return min(found, key=lambda item: (item[0], item[1].rank))[1]


def _flatten_tensors(value: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    if isinstance(value, torch.Tensor):
        out[prefix] = value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            out.update(_flatten_tensors(item, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            out.update(_flatten_tensors(item, f"{prefix}[{i}]"))
    return out


def _scalars(value: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(value, Mapping):
        for key, item in value.items():
            out.update(_scalars(item, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(value, (list, tuple)) and not all(isinstance(v, (int, float)) for v in value):
        for i, item in enumerate(value):
            out.update(_scalars(item, f"{prefix}[{i}]"))
    elif not isinstance(value, torch.Tensor):
        out[prefix] = value
    return out


def max_abs_difference(a: Any, b: Any) -> tuple[bool, float]:
    """(bitwise equal, max |a - b| over floating tensors); structure or dtype mismatches count as inf."""
    ta, tb = _flatten_tensors(a), _flatten_tensors(b)
    if ta.keys() != tb.keys() or _scalars(a) != _scalars(b):
        return False, float("inf")
    equal, worst = True, 0.0
    for key, x in ta.items():
        y = tb[key]
        if x.shape != y.shape or x.dtype != y.dtype:
            return False, float("inf")
        if not torch.equal(x, y):
            equal = False
            gap = float((x.double() - y.double()).abs().max()) if x.is_floating_point() else float("inf")
            worst = max(worst, gap)
    return equal, worst


@dataclass
class FinalComparison:
    weights_equal: bool
    weights_max_abs_diff: float
    optimizer_equal: bool
    optimizer_max_abs_diff: float

    @property
    def equal(self) -> bool:
        return self.weights_equal and self.optimizer_equal

    @property
    def components(self) -> list[str]:
        return [
            name for name, same in (("weights", self.weights_equal), ("optimizer", self.optimizer_equal)) if not same
        ]


def compare_final(a: Mapping[str, Any], b: Mapping[str, Any]) -> FinalComparison:
    weights_equal, weights_diff = max_abs_difference(a["weights"], b["weights"])
    opt_equal, opt_diff = max_abs_difference(
        {"optimizer": a["optimizer"], "schedulers": a.get("schedulers")},
        {"optimizer": b["optimizer"], "schedulers": b.get("schedulers")},
    )
    return FinalComparison(weights_equal, weights_diff, opt_equal, opt_diff)


def loss_deltas(
    reference: Mapping[Key, Mapping[str, Any]], other: Mapping[Key, Mapping[str, Any]]
) -> list[tuple[int, float]]:
    """(step, |Δloss|) for every batch both runs recorded a loss for."""
    deltas = []
    for key, ref in reference.items():
        rec = other.get(key)
        if rec is None or ref.get("loss") is None or rec.get("loss") is None:
            continue
        deltas.append((step_of(ref), abs(float(rec["loss"]) - float(ref["loss"]))))
    return deltas


def mean_over(deltas: Sequence[tuple[int, float]], after_step: int) -> float | None:
    """Mean over the steps after ``after_step``; None when there is nothing to average (no losses)."""
    window = [d for step, d in deltas if step > after_step]
    return sum(window) / len(window) if window else None


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


@dataclass
class RunComparison:
    """One run compared with control 1."""

    name: str
    divergence: Divergence | None
    final: FinalComparison
    deltas: list[tuple[int, float]]
    structural: Divergence | None = None  # first difference in position, RNG or data alone
    resume_step: int = 0  # the checkpoint step the continuation started from (0 for controls)
    deviation_loss: float | None = None
    noise_loss: float | None = None
    noise_weights: float = 0.0
    noise_optimizer: float = 0.0
    verdict: str = EXACT
    findings: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return self.divergence is None and self.final.equal

    def where(self) -> str:
        if self.divergence is not None:
            return self.divergence.describe()
        if not self.final.equal:
            return "final state: " + ", ".join(self.final.components)
        return "nowhere"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "verdict": self.verdict,
            "identical": self.identical,
            "first_divergence": self.divergence.to_dict() if self.divergence else None,
            "final": {
                "weights_equal": self.final.weights_equal,
                "weights_max_abs_diff": self.final.weights_max_abs_diff,
                "optimizer_equal": self.final.optimizer_equal,
                "optimizer_max_abs_diff": self.final.optimizer_max_abs_diff,
            },
            "resume_step": self.resume_step,
            "deviation": {
                "mean_abs_loss_diff": self.deviation_loss,
                "final_weights_max_abs_diff": self.final.weights_max_abs_diff,
                "final_optimizer_max_abs_diff": self.final.optimizer_max_abs_diff,
            },
            "noise": {
                "mean_abs_loss_diff": self.noise_loss,
                "final_weights_max_abs_diff": self.noise_weights,
                "final_optimizer_max_abs_diff": self.noise_optimizer,
            },
            "findings": self.findings,
        }


def compare_run(
    name: str,
    reference: Mapping[int, Mapping[Key, Mapping[str, Any]]],
    other: Mapping[int, Mapping[Key, Mapping[str, Any]]],
    reference_final: Mapping[str, Any],
    other_final: Mapping[str, Any],
    resume_step: int = 0,
) -> RunComparison:
    deltas = loss_deltas(reference.get(0, {}), other.get(0, {}))
    final = compare_final(reference_final, other_final)
    return RunComparison(
        name=name,
        divergence=first_divergence(reference, other),
        final=final,
        deltas=deltas,
        structural=first_divergence(reference, other, STRUCTURAL),
        resume_step=resume_step,
        deviation_loss=mean_over(deltas, resume_step),
    )


def _within(deviation: float | None, noise: float | None, tolerance: float) -> bool:
    if deviation is None or noise is None:
        return True  # not measured (no loss recorded): judged on the other statistics
    return deviation <= tolerance * noise


@dataclass
class Verdict:
    verdict: str
    reproducible: bool
    summary: str
    tolerance: float
    statistic: str = STATISTIC


def decide(controls: RunComparison, interrupted: Sequence[RunComparison], tolerance: float) -> Verdict:
    """Judge every interrupted run against the noise the controls show; update each run in place."""
    reproducible = controls.identical
    if not reproducible:
        controls.verdict = WITHIN_NOISE
        controls.findings.append(
            "The run is not reproducible even without interruption: the two controls first differ at"
            f" {controls.where()}; control-vs-control mean |Δloss| = {_fmt(mean_over(controls.deltas, 0))},"
            f" final weights max |Δ| = {controls.final.weights_max_abs_diff:.3g}."
        )
    for run in interrupted:
        run.noise_loss = mean_over(controls.deltas, run.resume_step)
        run.noise_weights = controls.final.weights_max_abs_diff
        run.noise_optimizer = controls.final.optimizer_max_abs_diff
        if run.identical:
            run.verdict = EXACT if reproducible else WITHIN_NOISE
            continue
        if reproducible:
            run.verdict = FAIL
            run.findings.append(
                f"Diverged from the uninterrupted runs, which are bitwise equal to each other, at {run.where()}."
            )
            if run.divergence is not None and run.divergence.step <= run.resume_step:
                run.findings.append("The divergence precedes the resume: the first attempt already differed.")
            continue
        if run.structural is not None and controls.structural is None:
            run.verdict = FAIL
            run.findings.append(
                "The controls agree on data position, RNG and batches at every step, but this run differs in"
                f" them at {run.structural.describe()}: a resume bug, not numerical noise."
            )
            continue
        if run.structural is not None:
            run.findings.append(
                f"The controls themselves differ in {controls.structural.describe() if controls.structural else ''}:"
                " RNG/data differences cannot be told apart from the run's own nondeterminism."
            )
        final = run.final
        within = (
            _within(run.deviation_loss, run.noise_loss, tolerance)
            and _within(final.weights_max_abs_diff, run.noise_weights, tolerance)
            and _within(final.optimizer_max_abs_diff, run.noise_optimizer, tolerance)
        )
        run.verdict = WITHIN_NOISE if within else FAIL
        run.findings.append(
            f"mean |Δloss| after the resume {_fmt(run.deviation_loss)} vs control noise {_fmt(run.noise_loss)};"
            f" final weights max |Δ| {final.weights_max_abs_diff:.3g} vs {run.noise_weights:.3g};"
            f" final optimizer state max |Δ| {final.optimizer_max_abs_diff:.3g} vs {run.noise_optimizer:.3g}"
            f" (tolerance {tolerance:g}x): {'within' if within else 'BEYOND'} noise."
        )
    verdicts = {run.verdict for run in interrupted}
    if FAIL in verdicts:
        failed = [run for run in interrupted if run.verdict == FAIL]
        first = failed[0]
        summary = f"fail: {first.name} diverged at {first.where()}"
    elif not interrupted:
        summary = "fail: no interrupted run to judge"
        verdicts = {FAIL}
    elif reproducible:
        summary = f"exact: {len(interrupted)} interrupted run(s) bitwise equal to the uninterrupted controls"
    else:
        summary = (
            "within noise: the run is not reproducible without interruption (controls differ at"
            f" {controls.where()}); every interrupted run stays within {tolerance:g}x the control-vs-control noise"
        )
    verdict = FAIL if FAIL in verdicts else (EXACT if reproducible else WITHIN_NOISE)
    return Verdict(verdict=verdict, reproducible=reproducible, summary=summary, tolerance=tolerance)
