"""Time to quality as data and as text, from the run's event log alone (no Lightning, no torch).

``TimeToQuality`` (``time_to_quality.py``) writes this summary at every evaluation; the run summary,
the release record and ``field`` read it back from a finished run's log with the same function.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lightning_field.quality.ledger import Ledger, goodput_ledger

MODES = ("min", "max")


def crossed(value: float, target: float, mode: str) -> bool:
    return value <= target if mode == "min" else value >= target


def quality_summary(
    events: Sequence[Mapping[str, Any]],
    monitor: str,
    target: float,
    mode: str,
    price_per_device_hour: float | None,
    deadline_s: float | None,
    now: float,
    ledger: Ledger | None = None,
) -> dict[str, Any]:
    """Time to quality from the event log alone: reached or not, when, at what device-hours and cost.
    ``ledger``: the log's goodput ledger at ``now``, when the caller has it already."""
    ledger = ledger or goodput_ledger(events, now=now)
    run_start = ledger.run_start_unix
    evals = [e for e in events if e["event"] == "eval" and monitor in e["payload"].get("metrics", {})]
    reached = next((e for e in evals if crossed(float(e["payload"]["metrics"][monitor]), target, mode)), None)

    def costed(until: float) -> dict[str, Any]:
        hours = ledger.device_hours(until)
        return {
            "wall_s": until - run_start,
            "device_hours": hours,
            "cost": hours * price_per_device_hour if price_per_device_hour is not None else None,
        }

    summary: dict[str, Any] = {
        "monitor": monitor,
        "target": target,
        "mode": mode,
        "run_start_unix": run_start,
        "deadline_s": deadline_s,
        "price_per_device_hour": price_per_device_hour,
        "evaluations": len(evals),
        "reached": None,
        "so_far": costed(now),
    }
    if reached is not None:
        summary["reached"] = {
            "step": reached["step"],
            "value": reached["payload"]["metrics"][monitor],
            "attempt": reached.get("attempt"),
            **costed(reached["wall_time"]),
        }
        if deadline_s is not None:
            summary["deadline_met"] = summary["reached"]["wall_s"] <= deadline_s
    elif evals:
        last = evals[-1]
        summary["latest"] = {"step": last["step"], "value": last["payload"]["metrics"][monitor]}
    return summary


def _h(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds:.1f} s"


def render_summary(summary: Mapping[str, Any]) -> str:
    """The end-of-fit console summary."""
    lines = [
        f"Time to quality ({summary['monitor']} {'<=' if summary['mode'] == 'min' else '>='} {summary['target']}):"
    ]
    reached = summary.get("reached")
    cost = lambda c: "" if c is None else f", cost {c:.2f}"  # noqa: E731
    if reached:
        lines.append(
            f"  reached at step {reached['step']} ({reached['value']:.4g}) after {_h(reached['wall_s'])},"
            f" {reached['device_hours']:.3g} device-hours{cost(reached['cost'])}"
        )
    else:
        so_far = summary["so_far"]
        lines.append(
            f"  NOT reached after {_h(so_far['wall_s'])} ({so_far['device_hours']:.3g} device-hours"
            f"{cost(so_far['cost'])}); latest {summary.get('latest', {}).get('value', 'n/a')}"
        )
        fc = summary.get("forecast", {})
        if fc.get("available"):
            band = fc["seconds_band"]
            lines.append(
                f"  forecast: step {fc['steps_to_target']:.0f}, {_h(fc['seconds_to_target'])} from the start"
                f" (80% band {_h(band[0])}-{_h(band[1])})"
            )
        else:
            lines.append(f"  {fc.get('reason', 'no forecast')}")
        if fc.get("deadline_miss_probability") is not None:
            lines.append(f"  risk of missing the deadline: {100 * fc['deadline_miss_probability']:.0f}%")
    gp = summary["goodput"]
    # Where the lost steps were cut back to (summaries written before tiers have no redone_steps).
    redone = [
        f"{'no checkpoint' if tier == 'none' else tier} {steps}"
        for tier, steps in (gp.get("redone_steps") or {}).items()
        if steps
    ]
    by_tier = f" (redone after a resume from: {', '.join(redone)})" if redone else ""
    lines.append(
        f"Goodput {100 * gp['goodput']:.1f}% of {_h(gp['elapsed_s'])}; {gp['interruptions']} interruption(s),"
        f" {gp['lost_steps']} step(s) lost{by_tier}"
    )
    lines.append("  " + ", ".join(f"{k} {_h(v)}" for k, v in gp["buckets_s"].items()))
    return "\n".join(lines)
