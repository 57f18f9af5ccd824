"""Planning estimates: compute (6ND), persistent memory and its sharding, a parallel layout,
checkpoint intervals, and time and cost to a token budget including the expected waste.

Every figure carries the inputs it came from and its formula, and every estimate says it is one.
The numbers are deliberately simple (dense transformer training, persistent state only); the
point is to catch an infeasible plan or a wrong checkpoint cadence before any money is spent.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from lightning_field.planning.intervals import (
    DEFAULT_RESTART_SECONDS,
    DEFAULT_SNAPSHOT_BUDGET,
    FailureModel,
    TierIntervals,
    choose_in_steps,
    choose_intervals,
    daly_interval,
    snapshot_interval_s,
    young_interval,
)

# Persistent bytes per parameter: (weights, gradients, optimizer state incl. any fp32 master copy).
BYTES_PER_PARAM: dict[tuple[str, str], tuple[float, float, float]] = {
    ("adamw", "bf16-mixed"): (2, 2, 12),  # bf16 weights+grads; fp32 master, m, v
    ("adamw", "16-mixed"): (2, 2, 12),
    ("adamw", "32-true"): (4, 4, 8),  # fp32 weights, grads, m, v
    ("adamw", "bf16-true"): (2, 2, 8),  # bf16 weights and grads, fp32 m and v
    ("sgd", "32-true"): (4, 4, 4),  # momentum
    ("sgd", "bf16-mixed"): (2, 2, 8),  # fp32 master + momentum
}
FAST_INTERCONNECTS = ("nvlink", "nvswitch", "xgmi", "infinity-fabric")
_NUMBER_WITH_UNIT = r"\s*((?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*"
_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
_SECONDS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


class PlanInputError(ValueError):
    """An input to the planner is missing, malformed or out of range; the message names it."""


def parse_count(text: str | float, name: str) -> float:
    """'8e9', '8B', '500M', '1.5T' -> a count. Unknown suffixes are refused."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        match = re.fullmatch(_NUMBER_WITH_UNIT, text)
        if not match:
            raise PlanInputError(f"{name}: cannot read {text!r} as a number (e.g. 8e9, 8B, 500M)")
        suffix = match.group(2).lower()
        if suffix not in _SCALE:
            raise PlanInputError(f"{name}: unknown unit {match.group(2)!r} in {text!r}; use K, M, B (or G) or T")
        value = float(match.group(1)) * _SCALE[suffix]
    if not (value > 0 and math.isfinite(value)):
        raise PlanInputError(f"{name} must be > 0, got {text!r}")
    return value


def parse_duration(text: str | float, name: str, default_unit: str) -> float:
    """'60', '60s', '30min', '6h', '1d' -> seconds; a bare number is in ``default_unit``."""
    if isinstance(text, (int, float)):
        value, unit = float(text), default_unit
    else:
        match = re.fullmatch(_NUMBER_WITH_UNIT, text)
        if not match:
            raise PlanInputError(f"{name}: cannot read {text!r} as a duration (e.g. 60s, 30min, 6h)")
        value, unit = float(match.group(1)), (match.group(2).lower() or default_unit)
    if unit not in _SECONDS:
        raise PlanInputError(f"{name}: unknown unit {unit!r} in {text!r}; use s, min (or m), h or d")
    seconds = value * _SECONDS[unit]
    if not (seconds > 0 and math.isfinite(seconds)):
        raise PlanInputError(f"{name} must be > 0, got {text!r}")
    return seconds


@dataclass
class PlanInputs:
    params: float
    tokens: float
    devices: int
    device_tflops: float  # useful (sustained) TFLOP/s per device, not the datasheet peak
    bytes_per_param: float | None = None
    optimizer: str = "adamw"
    precision: str = "bf16-mixed"
    device_memory_gb: float | None = None
    save_seconds: float | None = None
    mtbf_hours: float | None = None
    restart_seconds: float = DEFAULT_RESTART_SECONDS
    price_per_device_hour: float | None = None
    interconnect: str | None = None
    devices_per_node: int = 8
    state_fraction: float = 0.6  # of device memory the persistent state may take; the rest is for activations
    snapshot_seconds: float | None = None  # what one step snapshot holds training up
    snapshot_interval_seconds: float | None = None  # time between step snapshots; None: chosen by the cost model
    snapshot_commit_seconds: float = 0.0  # until a snapshot committed beside training is resumable (0: in line)
    snapshot_coverage: float | None = None  # the share of failures a snapshot survives; None: by the node count
    step_seconds: float | None = None  # a step's time: the intervals then in whole steps, as a run takes them
    checkpoint_every_steps: int | None = None  # a persistent interval the run keeps (held by the user), in steps
    sources: dict[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        for name in (
            "device_tflops",
            "bytes_per_param",
            "device_memory_gb",
            "save_seconds",
            "mtbf_hours",
            "restart_seconds",
            "price_per_device_hour",
            "state_fraction",
            "snapshot_seconds",
            "snapshot_interval_seconds",
            "snapshot_commit_seconds",
            "snapshot_coverage",
            "step_seconds",
        ):
            value = getattr(self, name)
            # argparse's float() reads "inf" and "nan"; a figure computed from one means nothing.
            if value is not None and not math.isfinite(value):
                raise PlanInputError(f"{_flag(name)} must be a finite number, got {value}")
        if self.devices < 1:
            raise PlanInputError(f"--devices must be >= 1, got {self.devices}")
        if self.devices_per_node < 1:
            raise PlanInputError(f"--devices-per-node must be >= 1, got {self.devices_per_node}")
        if self.device_memory_gb is not None and not self.device_memory_gb > 0:
            raise PlanInputError(f"--device-memory-gb must be > 0, got {self.device_memory_gb}")
        if self.restart_seconds < 0:
            raise PlanInputError(f"--restart-seconds must be >= 0, got {self.restart_seconds}")
        if self.bytes_per_param is not None and not self.bytes_per_param > 0:
            raise PlanInputError(f"--bytes-per-param must be > 0, got {self.bytes_per_param}")
        if not self.device_tflops > 0:
            raise PlanInputError(f"--device-tflops must be > 0, got {self.device_tflops}")
        if self.price_per_device_hour is not None and self.price_per_device_hour < 0:
            raise PlanInputError(f"--price-per-device-hour must be >= 0, got {self.price_per_device_hour}")
        if self.mtbf_hours is not None and not self.mtbf_hours > 0:
            raise PlanInputError(f"--mtbf-hours must be > 0, got {self.mtbf_hours}")
        if self.save_seconds is not None and not self.save_seconds > 0:
            raise PlanInputError(f"--save-seconds must be > 0, got {self.save_seconds}")
        if self.bytes_per_param is None and (self.optimizer, self.precision) not in BYTES_PER_PARAM:
            known = ", ".join(f"{o}/{p}" for o, p in BYTES_PER_PARAM)
            raise PlanInputError(
                f"no bytes-per-param rule for optimizer {self.optimizer!r} with precision {self.precision!r}"
                f" (known: {known}); pass --bytes-per-param"
            )
        if self.snapshot_seconds is None and self.snapshot_interval_seconds is not None:
            raise PlanInputError(
                "--snapshot-interval needs --snapshot-seconds: what a snapshot costs (without --snapshot-interval,"
                " the plan chooses the interval)"
            )
        if self.snapshot_coverage is not None and not 0 <= self.snapshot_coverage < 1:
            raise PlanInputError(f"--snapshot-coverage must be a share in [0, 1), got {self.snapshot_coverage}")
        if self.step_seconds is not None and not self.step_seconds > 0:
            raise PlanInputError(f"--step-seconds must be > 0, got {self.step_seconds}")
        if self.checkpoint_every_steps is not None and (self.checkpoint_every_steps < 1 or self.step_seconds is None):
            raise PlanInputError(
                f"--checkpoint-every-steps must be an integer >= 1 with --step-seconds (the step it counts),"
                f" got {self.checkpoint_every_steps}"
            )
        if self.snapshot_seconds is not None and self.snapshot_seconds < 0:
            raise PlanInputError(f"--snapshot-seconds must be >= 0, got {self.snapshot_seconds}")
        if self.snapshot_interval_seconds is not None and not self.snapshot_interval_seconds > 0:
            raise PlanInputError(f"--snapshot-interval must be > 0, got {self.snapshot_interval_seconds}")
        if self.snapshot_commit_seconds < 0:
            raise PlanInputError(f"--snapshot-commit-seconds must be >= 0, got {self.snapshot_commit_seconds}")
        snapshot, every = self.snapshot_seconds, self.snapshot_interval_seconds
        if snapshot is not None and every is not None and snapshot >= every:
            # The interval runs from one snapshot's commit to the next: it holds the snapshot's own cost.
            raise PlanInputError(
                f"--snapshot-seconds ({snapshot:g} s) must be shorter than --snapshot-interval ({every:g} s),"
                " the time from one snapshot to the next, its cost included"
            )
        if not 0 < self.state_fraction <= 1:
            raise PlanInputError(f"--state-fraction must be in (0, 1], got {self.state_fraction}")


def _flag(name: str) -> str:
    """The command-line flag of a ``PlanInputs`` field."""
    return {"snapshot_interval_seconds": "--snapshot-interval"}.get(name, "--" + name.replace("_", "-"))


def _figure(value: Any, unit: str, inputs: list[str], formula: str, estimate: bool = True) -> dict[str, Any]:
    return {"value": value, "unit": unit, "from": inputs, "formula": formula, "estimate": estimate}


def make_plan(inp: PlanInputs) -> dict[str, Any]:
    inp.validate()
    figures: dict[str, dict[str, Any]] = {}
    flops = 6.0 * inp.params * inp.tokens
    figures["total_flops"] = _figure(flops, "FLOP", ["params", "tokens"], "6 x N x D")
    ideal_s = flops / (inp.devices * inp.device_tflops * 1e12)
    figures["ideal_time"] = _figure(
        ideal_s, "s", ["params", "tokens", "devices", "device_tflops"], "6ND / (devices x useful FLOP/s)"
    )
    figures["ideal_time_hours"] = _figure(ideal_s / 3600, "h", figures["ideal_time"]["from"], "ideal_time / 3600")

    if inp.bytes_per_param is not None:
        weights, grads, optim = inp.bytes_per_param, 0.0, 0.0
        split_known = False
        bpp_from = ["bytes_per_param"]
    else:
        weights, grads, optim = BYTES_PER_PARAM[(inp.optimizer, inp.precision)]
        split_known = True
        bpp_from = ["optimizer", "precision"]
    per_param = weights + grads + optim
    state = per_param * inp.params
    figures["bytes_per_param"] = _figure(per_param, "B", bpp_from, "weights + gradients + optimizer state")
    figures["persistent_state"] = _figure(state / 1e9, "GB", ["params", *bpp_from], "bytes_per_param x N")
    n = inp.devices
    shares = {"ddp": state}
    if split_known:
        shares["zero1"] = (weights + grads) * inp.params + optim * inp.params / n
        shares["zero2"] = weights * inp.params + (grads + optim) * inp.params / n
    shares["fsdp_zero3"] = state / n
    tp = min(inp.devices_per_node, n)
    shares[f"tensor_parallel_{tp}"] = state / tp
    figures["state_per_device"] = _figure(
        {k: v / 1e9 for k, v in shares.items()},
        "GB",
        ["params", *bpp_from, "devices", "devices_per_node"],
        "DDP: all; ZeRO-1: optimizer/n; ZeRO-2: (grads+optimizer)/n; FSDP/ZeRO-3: all/n; TP(t): all/t",
    )
    plan: dict[str, Any] = {"inputs": {k: v for k, v in asdict(inp).items() if k != "sources"}, "figures": figures}
    plan["inputs"]["sources"] = inp.sources
    plan["layout"] = _layout(inp, shares)

    if inp.save_seconds is not None and inp.mtbf_hours is not None:
        _interval_figures(inp, figures, ideal_s)
    elif inp.snapshot_seconds is not None and inp.snapshot_interval_seconds is not None:
        given = ["snapshot_seconds", "snapshot_interval_seconds"]
        overhead = inp.snapshot_seconds / inp.snapshot_interval_seconds
        figures["snapshot_overhead"] = _figure(overhead, "fraction", given, "σ/τₛ")
    total_s = figures.get("time_to_budget", figures["ideal_time"])["value"]
    if inp.price_per_device_hour is not None:
        hours = total_s / 3600 * inp.devices
        basis = "time_to_budget" if "time_to_budget" in figures else "ideal_time"
        figures["device_hours"] = _figure(hours, "device-h", [basis, "devices"], f"{basis} x devices")
        figures["cost"] = _figure(
            hours * inp.price_per_device_hour, "currency", ["device_hours", "price_per_device_hour"], "device-h x price"
        )
    return plan


def _failure_model(inp: PlanInputs) -> FailureModel:
    assert inp.mtbf_hours is not None
    return FailureModel(
        mtbf_hours=inp.mtbf_hours, restart_seconds=inp.restart_seconds, snapshot_coverage=inp.snapshot_coverage
    )


def _interval_figures(inp: PlanInputs, figures: dict[str, dict[str, Any]], ideal_s: float) -> None:
    """Young's and Daly's intervals, and what persistent checkpoints alone lose and waste there; with a
    snapshot cost, both tiers chosen together by the cost model every tool shares
    (:func:`~lightning_field.planning.intervals.choose_intervals`), with the same figures beside."""
    assert inp.save_seconds is not None and inp.mtbf_hours is not None
    failures, mtbf, save = _failure_model(inp), inp.mtbf_hours * 3600.0, inp.save_seconds
    young, daly = young_interval(save, mtbf), daly_interval(save, mtbf)
    basis = ["save_seconds", "mtbf_hours"]
    figures["checkpoint_interval_young"] = _figure(young, "s", basis, "sqrt(2 δ M)")
    figures["checkpoint_interval_daly"] = _figure(
        daly, "s", basis, "sqrt(2δM)[1 + sqrt(δ/2M)/3 + (δ/2M)/9] - δ (δ < 2M)"
    )
    alone = choose_intervals(failures, save)
    _refuse_meaningless(inp, daly, alone.waste_alone or 0.0)
    tiers, persistent_steps, snapshot_steps = alone, None, None
    if inp.snapshot_seconds is not None:
        tiers = _tiers(inp, failures)
    if inp.step_seconds is not None:
        step = inp.step_seconds
        user = None if inp.snapshot_interval_seconds is None else max(1, round(inp.snapshot_interval_seconds / step))
        held = inp.checkpoint_every_steps
        _, persistent_steps, tiers, snapshot_steps = choose_in_steps(
            failures,
            save,
            inp.snapshot_seconds,
            inp.snapshot_commit_seconds,
            step,
            lambda tau: held if held is not None else max(1, round(tau / step)),
            replicated=_replicated(inp),
            snapshot_budget=DEFAULT_SNAPSHOT_BUDGET if inp.snapshot_interval_seconds is None else None,
            snapshot_steps=user,
        )
        steps_from = [*basis, "step_seconds"] if held is None else ["checkpoint_every_steps"]
        figures["checkpoint_interval_steps"] = _figure(
            persistent_steps,
            "steps",
            steps_from,
            "round(τ / step), the interval a run takes" if held is None else "given: the interval the run keeps",
        )
    waste = tiers.waste_alone or 0.0
    if waste >= 1 and persistent_steps is not None and inp.step_seconds is not None:
        _refuse_interval_in_steps(inp, persistent_steps, waste)
    inputs = [*basis, "restart_seconds", *(["step_seconds"] if inp.step_seconds is not None else [])]
    inputs += ["checkpoint_every_steps"] if inp.checkpoint_every_steps is not None else []
    at = "at Daly's τ" if inp.step_seconds is None else "at τ in whole steps"
    at = at if inp.checkpoint_every_steps is None else "at the run's interval"
    figures["expected_waste"] = _figure(waste, "fraction", inputs, f"δ/τ + (ℓ(τ) + R)/M {at} (persistent alone)")
    figures["time_to_budget"] = _figure(
        ideal_s / (1.0 - waste), "s", [*figures["ideal_time"]["from"], *inputs], "ideal_time / (1 - expected_waste)"
    )
    figures["time_to_budget_hours"] = _figure(
        figures["time_to_budget"]["value"] / 3600, "h", figures["time_to_budget"]["from"], "/ 3600"
    )
    figures["lost_work_per_failure"] = _figure(
        tiers.lost_alone_s, "s", inputs, f"ℓ(τ) = M - τ/(e^(τ/M) - 1) ≈ τ/2 {at} (persistent alone)"
    )
    if inp.snapshot_seconds is not None:
        if inp.step_seconds is not None and snapshot_steps is None and persistent_steps is not None:
            # Off at the steps taken: what they would give there, at their own interval.
            tiers = _tiers(inp, failures, persistent_steps * inp.step_seconds)
        _snapshot_figures(inp, figures, ideal_s, tiers, snapshot_steps)


def _replicated(inp: PlanInputs) -> bool:
    """More than one node: each node's snapshots replicated to a partner (their default coverage)."""
    return inp.devices > inp.devices_per_node


def _tiers(inp: PlanInputs, failures: FailureModel, persistent_s: float | None = None) -> TierIntervals:
    """Both tiers at their best intervals (the persistent one at ``persistent_s`` where the run keeps
    one); snapshots at the given interval, else at their own even where they do not pay, so that the
    plan shows what they would give."""
    assert inp.save_seconds is not None and inp.snapshot_seconds is not None
    given = inp.snapshot_interval_seconds
    budget = None if given is not None else DEFAULT_SNAPSHOT_BUDGET
    replicated = _replicated(inp)
    if given is None:
        given = snapshot_interval_s(failures, inp.snapshot_seconds, replicated=replicated, budget=budget)
        if not math.isfinite(given):  # a coverage of 0: they survive no failure
            return choose_intervals(failures, inp.save_seconds, persistent_s=persistent_s)
    return choose_intervals(
        failures,
        inp.save_seconds,
        inp.snapshot_seconds,
        inp.snapshot_commit_seconds,
        replicated=replicated,
        persistent_s=persistent_s,
        snapshot_budget=budget,
        snapshot_every_s=given,
    )


def _snapshot_figures(
    inp: PlanInputs,
    figures: dict[str, dict[str, Any]],
    ideal_s: float,
    tiers: TierIntervals,
    snapshot_steps: int | None,
) -> None:
    """The snapshot tier beside the persistent one (estimates): whether they pay, their interval, the
    persistent interval with them, the work a failure loses and the waste."""
    assert inp.snapshot_seconds is not None
    chosen = inp.snapshot_interval_seconds is None
    inputs = ["save_seconds", "mtbf_hours", "restart_seconds", "snapshot_seconds", "snapshot_commit_seconds"]
    inputs += ["snapshot_coverage"] + ([] if chosen else ["snapshot_interval_seconds"])
    inputs += [] if inp.step_seconds is None else ["step_seconds"]
    origin = "given" if inp.sources.get("snapshot_coverage") or inp.snapshot_coverage is not None else "default"
    what = f"the share of failures a snapshot survives ({origin}: 0.22 on one node, 0.95 with a partner's replica)"
    figures["snapshot_coverage"] = _figure(
        tiers.coverage, "fraction", ["snapshot_coverage", "devices", "devices_per_node"], what
    )
    figures["snapshots_pay"] = _figure(
        tiers.snapshots_pay,
        "bool",
        inputs,
        "expected waste with snapshots < without (an interval given: priced as given)",
    )
    if tiers.snapshot_s is None:
        return  # they survive no failure: nothing to price
    tau_s = tiers.snapshot_s
    figures["snapshot_interval"] = _figure(
        tau_s, "s", inputs, "formula(σ, M/p), at least σ/budget" if chosen else "given (--snapshot-interval)"
    )
    if snapshot_steps is not None:
        figures["snapshot_interval_steps"] = _figure(snapshot_steps, "steps", inputs, "round(τₛ / step)")
    figures["snapshot_overhead"] = _figure(inp.snapshot_seconds / tau_s, "fraction", inputs, "σ/τₛ")
    figures["checkpoint_interval_with_snapshots"] = _figure(
        tiers.persistent_s, "s", inputs, "formula(δ, M/(1 - p)): only the failures snapshots do not survive"
    )
    figures["lost_work_per_failure_with_snapshots"] = _figure(
        tiers.lost_per_failure_s, "s", inputs, "p(ℓ(τₛ) + c) + (1 - p)ℓ(τₚ)"
    )
    waste = tiers.waste
    assert waste is not None  # a plan prices snapshots only with a save cost
    if waste >= 1:
        raise PlanInputError(
            f"expected waste with snapshots {waste:.0%} >= 100%: snapshots of {inp.snapshot_seconds:g} s every"
            f" {tau_s:g} s beside saves of {inp.save_seconds:g} s leave no time to train (check --snapshot-seconds"
            " and --snapshot-interval)"
        )
    figures["expected_waste_with_snapshots"] = _figure(waste, "fraction", inputs, "δ/τₚ + σ/τₛ + (L + R)/M")
    figures["time_to_budget_with_snapshots"] = _figure(
        ideal_s / (1.0 - waste),
        "s",
        [*figures["ideal_time"]["from"], *inputs],
        "ideal_time / (1 - expected_waste_with_snapshots)",
    )


def _refuse_meaningless(inp: PlanInputs, interval_s: float, waste: float) -> None:
    """Refuse inputs under which the interval and waste formulas stop describing a run: a save as long
    as the interval between saves, or failures, saves and restarts that leave no time to train. The
    formulas still return numbers there (a waste of 4629679 %), which read as a plan but are none."""
    assert inp.save_seconds is not None and inp.mtbf_hours is not None
    mtbf, save, restart = f"{inp.mtbf_hours:g} h", f"{inp.save_seconds:g} s", f"{inp.restart_seconds:g} s"
    if inp.save_seconds >= interval_s:
        raise PlanInputError(
            f"a save of {save} is as long as the best interval between saves ({interval_s:.3g} s) with a failure"
            f" every {mtbf}: no checkpoint cadence can make progress (lower --save-seconds or raise --mtbf-hours)"
        )
    if waste >= 1:
        raise PlanInputError(
            f"expected waste {waste:.0%} >= 100%: saves of {save}, restarts of {restart} and a failure every {mtbf}"
            " leave no time to train, so no time or cost to the budget exists (check --save-seconds,"
            " --restart-seconds and --mtbf-hours)"
        )


def _refuse_interval_in_steps(inp: PlanInputs, steps: int, waste: float) -> None:
    """Refuse the persistent interval a plan prices in whole steps (the run's own, or Daly's rounded)
    where its first-order waste reaches 100%: saves that take about as long as the training between
    them. ``time_to_budget`` would be negative, and the snapshots' figures would be blamed for it.

    Raises:
        PlanInputError: naming the interval, the save and the waste (to the hundredth of a percent,
            as ``CheckpointCadence`` prints it for the same run).
    """
    assert inp.save_seconds is not None and inp.step_seconds is not None
    given = inp.checkpoint_every_steps is not None
    where = "at the run's interval" if given else "in whole steps"
    fix = ": raise --checkpoint-every-steps or the run's every_n_train_steps" if given else ""
    every = f"every {steps} steps of {inp.step_seconds:g} s ({steps * inp.step_seconds:g} s of training)"
    raise PlanInputError(
        f"expected waste {waste:.2%} >= 100% {where}: saves of {inp.save_seconds:g} s {every} leave no time to"
        " train; the first-order waste does not describe a run that saves about as long as it trains between"
        f" saves (save less often{fix})"
    )


def _layout(inp: PlanInputs, shares: dict[str, float]) -> dict[str, Any]:
    """The simplest layout whose persistent state fits, with room left for activations."""
    if inp.device_memory_gb is None:
        return {"recommendation": None, "reason": "pass --device-memory-gb to check what fits"}
    budget = inp.device_memory_gb * 1e9 * inp.state_fraction
    order = [("ddp", "data parallel (DDP): the full state fits on every device")]
    order += [("zero1", "DDP with sharded optimizer state (ZeRO-1)"), ("zero2", "ZeRO-2: shard gradients too")]
    order += [("fsdp_zero3", "fully sharded (FSDP / ZeRO-3): parameters, gradients and optimizer state")]
    fast = (inp.interconnect or "").lower() in FAST_INTERCONNECTS
    for key, text in order:
        if key in shares and shares[key] <= budget:
            return {
                "recommendation": key,
                "reason": f"{text}; {shares[key] / 1e9:.1f} GB per device within {budget / 1e9:.1f} GB"
                f" ({inp.state_fraction:.0%} of {inp.device_memory_gb:g} GB, the rest for activations)",
                "tensor_or_pipeline_parallel": "not needed for the persistent state",
                "from": ["params", "devices", "device_memory_gb", "state_fraction"],
            }
    needed = math.ceil(shares["ddp"] / budget)
    tp = min(inp.devices_per_node, inp.devices)
    return {
        "recommendation": "does_not_fit",
        "reason": f"even fully sharded, {shares['fsdp_zero3'] / 1e9:.1f} GB per device exceeds {budget / 1e9:.1f} GB;"
        f" at least {needed} devices are needed for the persistent state alone",
        "tensor_or_pipeline_parallel": (
            f"tensor parallel within a node (degree <= {tp}) over {inp.interconnect or 'the node links'}"
            + ("" if fast else "; the interconnect is not a fast intra-node link, prefer pipeline stages across nodes")
        ),
        "from": ["params", "devices", "device_memory_gb", "state_fraction", "interconnect"],
    }
