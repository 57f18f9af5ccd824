"""What a run is expected to cost before it starts: compute, checkpoint cadence and badput budget.

``field-train`` prints this before launch so that a lead sees, while it is still cheap to change,
how much of the wall time the configured failure rate and save cost will eat. Every figure is an
*estimate* and names what it came from; the run's event log later replaces the assumptions with
measurements (``field plan --from-run``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lightning_field.planning.intervals import (
    DEFAULT_RESTART_SECONDS,
    daly_interval,
    expected_waste_fraction,
    young_interval,
)

# AdamW in fp32: weights, first and second moments are checkpointed (gradients are not).
CHECKPOINT_BYTES_PER_PARAM = 12.0


@dataclass
class LaunchInputs:
    params: int
    steps: int
    world_size: int
    flops_per_batch: float | None = None  # per rank and batch, as the module reports it
    tokens: float | None = None  # total training tokens, for 6ND when flops_per_batch is unknown
    device_tflops: float | None = None  # useful (sustained) TFLOP/s per device
    every_n_train_steps: int | None = None
    cadence_formula: str | None = None  # set when CheckpointCadence retunes the interval
    mtbf_hours: float | None = None
    save_seconds: float | None = None  # measured or a prior; None: estimated from the state size
    write_gb_per_s: float = 0.5
    restart_seconds: float = DEFAULT_RESTART_SECONDS
    price_per_device_hour: float | None = None


def launch_estimate(inp: LaunchInputs) -> dict[str, Any]:
    """Pure: the figures ``render_launch_estimate`` prints, each with its basis."""
    out: dict[str, Any] = {"params": inp.params, "steps": inp.steps, "world_size": inp.world_size}
    if inp.flops_per_batch:
        out["total_flops"] = inp.flops_per_batch * inp.steps * inp.world_size
        out["flops_basis"] = "module flops_per_batch x steps x ranks"
    elif inp.tokens:
        out["total_flops"] = 6.0 * inp.params * inp.tokens
        out["flops_basis"] = "6 x params x plan.tokens"
    else:
        out["total_flops"] = None
        out["flops_basis"] = "unknown: give the module a flops_per_batch attribute or set plan.tokens"
    if out["total_flops"] is not None and inp.device_tflops:
        out["ideal_s"] = out["total_flops"] / (inp.world_size * inp.device_tflops * 1e12)
    else:
        out["ideal_s"] = None

    if inp.save_seconds is not None:
        save_s, save_basis = inp.save_seconds, "given"
    else:
        state_gb = inp.params * CHECKPOINT_BYTES_PER_PARAM / 1e9
        save_s = max(state_gb / inp.write_gb_per_s, 0.01)
        save_basis = f"{state_gb * 1e3:.3g} MB of state at an assumed {inp.write_gb_per_s:g} GB/s"
    out["save_s"], out["save_basis"] = save_s, save_basis
    out["cadence"] = {
        "every_n_train_steps": inp.every_n_train_steps,
        "retuned_by": inp.cadence_formula,
    }
    if inp.mtbf_hours:
        mtbf_s = inp.mtbf_hours * 3600.0
        interval = daly_interval(save_s, mtbf_s)
        out["cadence"]["young_s"] = young_interval(save_s, mtbf_s)
        out["cadence"]["daly_s"] = interval
        out["badput"] = {
            "fraction": expected_waste_fraction(interval, save_s, mtbf_s, inp.restart_seconds),
            "basis": f"Daly interval {interval:.0f} s, save {save_s:.2g} s, MTBF {inp.mtbf_hours:g} h,"
            f" restart {inp.restart_seconds:g} s",
        }
        if out["ideal_s"] is not None:
            out["badput"]["expected_s"] = out["ideal_s"] / (1.0 - out["badput"]["fraction"])
    else:
        out["badput"] = None
    if inp.price_per_device_hour is not None and out["ideal_s"] is not None:
        hours = (out["badput"] or {}).get("expected_s", out["ideal_s"]) / 3600.0 * inp.world_size
        out["cost"] = hours * inp.price_per_device_hour
    return out


def _seconds(value: float) -> str:
    return f"{value / 3600:.2f} h" if value >= 3600 else f"{value:.1f} s"


def render_launch_estimate(est: dict[str, Any]) -> str:
    lines = [f"Plan (estimates): {est['params']:,} parameters, {est['steps']} steps on {est['world_size']} rank(s)"]
    if est["total_flops"] is not None:
        lines.append(f"  compute: {est['total_flops']:.3g} FLOP ({est['flops_basis']})")
    else:
        lines.append(f"  compute: {est['flops_basis']}")
    if est["ideal_s"] is not None:
        lines.append(f"  ideal time at the given device TFLOP/s: {_seconds(est['ideal_s'])}")
    else:
        lines.append("  ideal time: set plan.device_tflops (sustained TFLOP/s per device) to estimate it")
    cadence = est["cadence"]
    every = cadence["every_n_train_steps"]
    line = f"  checkpoint cadence: every {every} step(s)" if every else "  checkpoint cadence: no step interval"
    if cadence["retuned_by"]:
        line += f", retuned by CheckpointCadence ({cadence['retuned_by']}) from the measured save cost"
    lines.append(line)
    lines.append(f"  save cost: {est['save_s']:.2g} s ({est['save_basis']})")
    badput = est["badput"]
    if badput:
        lines.append(f"  optimal interval: Daly {_seconds(cadence['daly_s'])}, Young {_seconds(cadence['young_s'])}")
        lines.append(f"  badput budget: {100 * badput['fraction']:.2f}% of wall time ({badput['basis']})")
        if "expected_s" in badput:
            lines.append(f"  expected time with failures: {_seconds(badput['expected_s'])}")
    else:
        lines.append("  badput budget: set callbacks.checkpoint_cadence.mtbf_hours or plan.mtbf_hours")
    if est.get("cost") is not None:
        lines.append(f"  cost: {est['cost']:.2f}")
    return "\n".join(lines)
