"""``field scale``: a scaling study at constant effective batch (``--json`` for machines).

Bad input exits 2 with a message naming the numbers, before any process is started.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from lightning_field.baseline.scale import RANKS_PER_CPU, ScaleInputError, StudyConfig, parse_ranks, plan_study


def cmd_scale(args: argparse.Namespace) -> int:
    try:
        if args.model != "demo":
            raise ScaleInputError(f"--model {args.model!r}: only the demo regressor is supported")
        if args.stall_s < 0:
            raise ScaleInputError(f"--stall-s {args.stall_s} must be >= 0")
        if args.stall_rank is not None and args.stall_rank < 0:
            raise ScaleInputError(f"--stall-rank {args.stall_rank} must be >= 0")
        if args.tolerance <= 0:
            raise ScaleInputError(f"--tolerance {args.tolerance} must be > 0")
        ranks = parse_ranks(args.ranks)
        plan_study(ranks, args.steps, args.effective_batch, args.max_rank_batch, warmup_steps=args.warmup)
    except ScaleInputError as err:
        print(f"field scale: {err}", file=sys.stderr)
        return 2
    from lightning_field.baseline.scale import render_report, run_study

    out = Path(args.out) if args.out else Path("runs") / "scale" / time.strftime("%Y%m%d-%H%M%S")
    config = StudyConfig(
        ranks=ranks,
        steps=args.steps,
        effective_batch=args.effective_batch,
        out_dir=out,
        max_rank_batch=args.max_rank_batch,
        warmup_steps=args.warmup,
        tolerance=args.tolerance,
        threshold=args.threshold,
        stall_rank=args.stall_rank,
        stall_s=args.stall_s if args.stall_rank is not None else 0.0,
        timeout_s=args.timeout,
    )
    record = run_study(config)
    if args.json:
        print(json.dumps(record, indent=2, default=str))
    else:
        print(render_report(record))
        print(f"records: {', '.join(record['records'].values())}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("scale", help="throughput, efficiency, step breakdown and gradient equivalence at 1..N ranks")
    p.add_argument("--ranks", default="1,2,4", help="rank counts, e.g. 1,2,4 (must include 1)")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps per rank count")
    p.add_argument("--effective-batch", type=int, default=32, help="samples per optimizer step, over all ranks")
    p.add_argument("--max-rank-batch", type=int, help="largest per-rank batch; above it, gradient accumulation")
    p.add_argument("--model", default="demo", choices=["demo"], help="the workload (the demo regressor, dropout 0)")
    p.add_argument("--warmup", type=int, default=2, help="steps excluded from timing")
    p.add_argument("--tolerance", type=float, default=1e-5, help="max relative gradient difference (reduction order)")
    p.add_argument("--threshold", type=float, default=0.7, help="efficiency at the largest count to add devices")
    p.add_argument("--stall-rank", type=int, help="inject a data stall: this rank's loader sleeps per batch")
    p.add_argument("--stall-s", type=float, default=0.05, help="seconds of the injected stall per batch")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per rank count before its group is killed")
    p.add_argument("--out", help="records directory (default runs/scale/<timestamp>)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_scale)
    p.epilog = f"Rank counts above {RANKS_PER_CPU} x the CPU cores are refused."
