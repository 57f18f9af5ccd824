"""``field plan``: planning estimates from the command line (``--json`` for machines)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from itertools import pairwise
from pathlib import Path
from typing import Any

from lightning_field.core.events import read_jsonl, read_run_events
from lightning_field.core.layout import PROFILE_RELPATH
from lightning_field.planning.intervals import DEFAULT_RESTART_SECONDS
from lightning_field.planning.plan import PlanInputError, PlanInputs, make_plan, parse_count, parse_duration
from lightning_field.quality.ledger import goodput_ledger


def measured_from_run(run_dir: Path) -> tuple[dict[str, float], dict[str, str]]:
    """Save cost, restart cost and MTBF as a run recorded them in its event log."""
    events = read_run_events(run_dir)
    if not events:
        raise PlanInputError(f"--from-run {run_dir}: no event log at {run_dir / 'field' / 'events.jsonl'}")
    values: dict[str, float] = {}
    sources: dict[str, str] = {}
    saves = [float(e["payload"]["blocking_s"]) for e in events if e["event"] == "ckpt_committed"]
    if saves:
        values["save_seconds"] = statistics.median(saves)
        sources["save_seconds"] = f"median of {len(saves)} blocking saves in {run_dir}"
    snapshots = [e for e in events if e["event"] == "snapshot_committed"]
    chosen = [e["payload"] for e in events if e["event"] == "snapshot_interval" and isinstance(e.get("payload"), dict)]
    requested = chosen[-1].get("requested") if chosen else None
    if snapshots:
        values["snapshot_seconds"] = statistics.median(float(e["payload"].get("blocking_s") or 0.0) for e in snapshots)
        # Committed in line, a snapshot is resumable once training goes on: no latency beyond its cost.
        values["snapshot_commit_seconds"] = statistics.median(
            0.0 if e["payload"].get("in_line") else float(e["payload"].get("commit_s") or 0.0) for e in snapshots
        )
        for name in ("snapshot_seconds", "snapshot_commit_seconds"):
            sources[name] = f"median over {len(snapshots)} step snapshots committed in {run_dir}"
    # A user's snapshot interval is the run's; "auto" is the cost model's choice, which the plan makes.
    gaps = [b["wall_time"] - a["wall_time"] for a, b in pairwise(snapshots) if a.get("attempt") == b.get("attempt")]
    if gaps and isinstance(requested, int) and not isinstance(requested, bool):
        values["snapshot_interval_seconds"] = statistics.median(gaps)
        sources["snapshot_interval_seconds"] = (
            f"median of {len(gaps)} intervals between step snapshots in {run_dir} (snapshots.every_n_train_steps"
            f"={requested})"
        )
    if chosen:  # the interval in force at the end, as the run chose it
        every, by, why = (chosen[-1].get(k) for k in ("every_n_train_steps", "chosen_by", "reason"))
        sources["snapshot_every_n_train_steps"] = (
            f"every {every} steps ({by}) in {run_dir}: {why}" if every is not None else f"off in {run_dir}: {why}"
        )
    ledger = goodput_ledger(events)
    if ledger.interruptions and ledger.mean_time_between_interruptions_s:
        values["mtbf_hours"] = ledger.mean_time_between_interruptions_s / 3600
        # The ledger's MTBF is over the time attempts ran (its exposure), not the elapsed time: name both.
        exposure = ledger.mean_time_between_interruptions_s * ledger.interruptions
        sources["mtbf_hours"] = (
            f"{ledger.interruptions} interruption(s) in {exposure:.0f} s of attempts running in {run_dir}"
            f" ({ledger.elapsed_s:.0f} s elapsed, of which"
            f" {ledger.idle_breakdown.get('downtime_between_attempts', 0.0):.0f} s downtime between attempts, excluded)"
        )
    if ledger.mean_restart_s is not None:
        values["restart_seconds"] = ledger.mean_restart_s
        sources["restart_seconds"] = f"mean process start to first step after the interruptions in {run_dir}"
    _from_cadence(events, run_dir, values, sources)
    tflops, basis = measured_tflops(run_dir)
    if tflops is not None:
        values["device_tflops"] = tflops
    sources["device_tflops"] = basis
    return values, sources


def _from_cadence(
    events: list[dict[str, Any]], run_dir: Path, values: dict[str, float], sources: dict[str, str]
) -> None:
    """Where ``CheckpointCadence`` chose the run's intervals, the figures its last choice was made from
    (save cost, MTBF posterior, restart, step time, snapshot cost, commit and coverage): the plan then
    makes the same choice and prints the same numbers as the run's log."""
    decisions = [e for e in events if e["event"] == "cadence" and isinstance(e.get("payload"), dict)]
    if not decisions:
        return
    decision, step = decisions[-1]["payload"], decisions[-1].get("step")
    where = f"CheckpointCadence's choice at step {step} in {run_dir}"
    taken = {
        "save_seconds": decision.get("save_s"),
        "mtbf_hours": (decision.get("mtbf_s") or 0.0) / 3600.0 or None,
        "restart_seconds": decision.get("restart_s"),
        "step_seconds": decision.get("step_s"),
        "snapshot_seconds": decision.get("snapshot_s"),
        "snapshot_commit_seconds": decision.get("snapshot_commit_s"),
        "snapshot_coverage": decision.get("coverage"),
    }
    for name, value in taken.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            values[name] = float(value)
            sources[name] = where
    steps = decision.get("steps")
    if isinstance(steps, int) and not isinstance(steps, bool) and decision.get("held_at_user_setting"):
        values["checkpoint_every_steps"] = steps  # the user's interval, which the cadence kept
        sources["checkpoint_every_steps"] = f"{where}: held at the every_n_train_steps set on ManifestCheckpoint"
    every = decision.get("snapshot_every_steps")
    if "snapshot_interval_seconds" in values and isinstance(every, int) and "step_seconds" in values:
        values["snapshot_interval_seconds"] = every * values["step_seconds"]  # the user's, in its steps
        sources["snapshot_interval_seconds"] = where


def _whole(value: float | None) -> int | None:
    return None if value is None else int(value)


def measured_tflops(run_dir: Path) -> tuple[float | None, str]:
    """Useful TFLOP/s per device as the run's ``StragglerMonitor`` reports measured it: the median over
    reports of the median over ranks (a rank's FLOPs per second of wall time, data waits and all)."""
    path = run_dir / PROFILE_RELPATH / "reports.jsonl"
    reports = read_jsonl(path) if path.exists() else []
    per_report = []
    for report in reports:
        rates = [r["flops_per_s"] for r in report.get("throughput", {}).get("per_rank", []) if r.get("flops_per_s")]
        if rates:
            per_report.append(statistics.median(rates))
    if not per_report:
        return None, f"not recorded by the run (no FLOP/s in {path}: add StragglerMonitor to measure it)"
    return statistics.median(per_report) / 1e12, (
        f"median over {len(per_report)} StragglerMonitor report(s) of the per-rank FLOP/s measured in {run_dir}"
    )


def cmd_plan(args: argparse.Namespace) -> int:
    try:
        sources: dict[str, str] = {}
        measured: dict[str, float] = {}
        if args.from_run:
            measured, sources = measured_from_run(Path(args.from_run))
        if args.device_tflops is not None:
            sources["device_tflops"] = "command line"
        device_tflops = args.device_tflops if args.device_tflops is not None else measured.get("device_tflops")
        for name, value in (
            ("params", args.params),
            ("tokens", args.tokens),
            ("devices", args.devices),
            ("device_tflops", device_tflops),
        ):
            if value is None:
                hint = " (or --from-run a run profiled by StragglerMonitor)" if name == "device_tflops" else ""
                raise PlanInputError(f"--{name.replace('_', '-')} is required{hint}")
        assert device_tflops is not None  # refused above when missing; narrows the type
        save = parse_duration(args.save_seconds, "--save-seconds", "s") if args.save_seconds else None
        mtbf = parse_duration(args.mtbf_hours, "--mtbf-hours", "h") / 3600 if args.mtbf_hours else None
        for name, given in (("save_seconds", save), ("mtbf_hours", mtbf), ("restart_seconds", args.restart_seconds)):
            if given is not None:
                sources[name] = "command line"
        restart = args.restart_seconds if args.restart_seconds is not None else measured.get("restart_seconds")
        snapshot = parse_duration(args.snapshot_seconds, "--snapshot-seconds", "s") if args.snapshot_seconds else None
        every = parse_duration(args.snapshot_interval, "--snapshot-interval", "s") if args.snapshot_interval else None
        step = parse_duration(args.step_seconds, "--step-seconds", "s") if args.step_seconds else None
        for name, given in (
            ("snapshot_seconds", snapshot),
            ("snapshot_interval_seconds", every),
            ("snapshot_commit_seconds", args.snapshot_commit_seconds),
            ("snapshot_coverage", args.snapshot_coverage),
            ("step_seconds", step),
            ("checkpoint_every_steps", args.checkpoint_every_steps),
        ):
            if given is not None:
                sources[name] = "command line"
        if restart is None:
            restart = DEFAULT_RESTART_SECONDS
            sources["restart_seconds"] = (
                f"assumed {DEFAULT_RESTART_SECONDS:g} s, as field-train's estimate (plan.restart_seconds);"
                " --restart-seconds or --from-run a run that was interrupted to replace it"
            )
        inputs = PlanInputs(
            params=parse_count(args.params, "--params"),
            tokens=parse_count(args.tokens, "--tokens"),
            devices=args.devices,
            device_tflops=device_tflops,
            bytes_per_param=args.bytes_per_param,
            optimizer=args.optimizer,
            precision=args.precision,
            device_memory_gb=args.device_memory_gb,
            save_seconds=save if save is not None else measured.get("save_seconds"),
            mtbf_hours=mtbf if mtbf is not None else measured.get("mtbf_hours"),
            restart_seconds=restart,
            price_per_device_hour=args.price_per_device_hour,
            interconnect=args.interconnect,
            devices_per_node=args.devices_per_node,
            state_fraction=args.state_fraction,
            snapshot_seconds=snapshot if snapshot is not None else measured.get("snapshot_seconds"),
            snapshot_interval_seconds=every if every is not None else measured.get("snapshot_interval_seconds"),
            snapshot_commit_seconds=(
                args.snapshot_commit_seconds
                if args.snapshot_commit_seconds is not None
                else measured.get("snapshot_commit_seconds", 0.0)
            ),
            snapshot_coverage=(
                args.snapshot_coverage if args.snapshot_coverage is not None else measured.get("snapshot_coverage")
            ),
            step_seconds=step if step is not None else measured.get("step_seconds"),
            checkpoint_every_steps=(
                args.checkpoint_every_steps
                if args.checkpoint_every_steps is not None
                else _whole(measured.get("checkpoint_every_steps"))
            ),
            sources=sources,
        )
        plan = make_plan(inputs)
    except PlanInputError as err:
        print(f"field plan: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(plan, indent=2, default=str))
    else:
        print(render_plan(plan))
    return 0


def _value(figure: dict[str, Any]) -> str:
    value, unit = figure["value"], figure["unit"]
    if unit == "bool":
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v:.1f}" for k, v in value.items()) + f" {unit}"
    if unit == "s" and value < 60:
        return f"{value:.3g} s"  # a snapshot's lost work: tenths of a second, not "0 s"
    if unit == "s":
        return f"{value:,.0f} s ({value / 60:.1f} min)"
    if unit == "fraction":
        return f"{100 * value:.2f} %"
    return f"{value:.4g} {unit}"


def render_plan(plan: dict[str, Any]) -> str:
    lines = ["Plan (estimates; each figure names the inputs it came from)"]
    width = max(map(len, plan["figures"]), default=0)
    for name, figure in plan["figures"].items():
        lines.append(f"  {name:<{width}} {_value(figure):<48} from {', '.join(figure['from'])}")
    layout = plan["layout"]
    # No recommendation is not a layout called "None": say that nothing was checked, and why.
    label = {None: "not checked", "does_not_fit": "does not fit"}.get(layout.get("recommendation"))
    lines.append(f"  layout: {label or layout['recommendation']}: {layout['reason']}")
    if layout.get("tensor_or_pipeline_parallel"):
        lines.append(f"          tensor/pipeline parallel: {layout['tensor_or_pipeline_parallel']}")
    for name, source in plan["inputs"].get("sources", {}).items():
        lines.append(f"  input {name}: {source}")
    return "\n".join(lines)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="6ND compute, memory and layout, checkpoint interval, time and cost estimates")
    p.add_argument("--params", help="parameter count, e.g. 8e9 or 8B")
    p.add_argument("--tokens", help="training tokens, e.g. 10B")
    p.add_argument("--devices", type=int)
    p.add_argument(
        "--device-tflops",
        type=float,
        help="useful (sustained) TFLOP/s per device, not the peak (default with --from-run: as measured)",
    )
    p.add_argument(
        "--bytes-per-param", type=float, help="persistent bytes per parameter (else from optimizer+precision)"
    )
    p.add_argument("--optimizer", default="adamw", choices=["adamw", "sgd"])
    p.add_argument("--precision", default="bf16-mixed", choices=["bf16-mixed", "16-mixed", "32-true", "bf16-true"])
    p.add_argument("--device-memory-gb", type=float)
    p.add_argument("--save-seconds", help="blocking checkpoint save cost, e.g. 60 or 60s or 2min")
    p.add_argument("--mtbf-hours", help="mean time between failures, e.g. 6 or 6h or 90min")
    p.add_argument(
        "--restart-seconds",
        type=float,
        help=f"time from a failure to training again (default: measured by --from-run, else {DEFAULT_RESTART_SECONDS:g}"
        " s, as field-train assumes)",
    )
    p.add_argument("--snapshot-seconds", help="what one step snapshot holds training up, e.g. 0.02 or 0.02s")
    p.add_argument(
        "--snapshot-interval", help="time between step snapshots, e.g. 0.3 or 5s (default: the cost model chooses it)"
    )
    p.add_argument(
        "--snapshot-coverage",
        type=float,
        help="the share of failures a snapshot survives, in [0, 1) (default: 0.22 on one node, 0.95 on several,"
        " where each node's snapshots are replicated to a partner)",
    )
    p.add_argument(
        "--step-seconds", help="a training step's time: the intervals are then whole steps, as a run takes them"
    )
    p.add_argument(
        "--checkpoint-every-steps",
        type=int,
        help="a persistent interval the run keeps (every_n_train_steps held by the user), priced instead of the"
        " formula's; needs --step-seconds",
    )
    p.add_argument(
        "--snapshot-commit-seconds",
        type=float,
        help="until a snapshot committed beside training is resumable (default 0: committed in line)",
    )
    p.add_argument("--price-per-device-hour", type=float)
    p.add_argument("--interconnect", help="intra-node links, e.g. nvlink, pcie")
    p.add_argument("--devices-per-node", type=int, default=8)
    p.add_argument("--state-fraction", type=float, default=0.6, help="share of device memory for persistent state")
    p.add_argument(
        "--from-run",
        help="a run directory: save cost, snapshot cost and interval, restart cost and MTBF from its event log;"
        " useful TFLOP/s from its StragglerMonitor reports",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_plan)
