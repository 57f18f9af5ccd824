"""``field probe collectives``: the nccl-tests-style sweep, launched with torchrun."""

from __future__ import annotations

import argparse
import subprocess
import sys


def cmd_collectives(args: argparse.Namespace) -> int:
    if args.nproc < 1:
        print(f"field probe collectives: --nproc must be >= 1, got {args.nproc}", file=sys.stderr)
        return 2
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={args.nproc}",
        "-m",
        "lightning_field.profiling.probe",
        "--sizes",
        args.sizes,
        "--iters",
        str(args.iters),
        "--out",
        args.out,
    ]
    return subprocess.call(command)


def add_parser(sub: argparse._SubParsersAction) -> None:
    probe = sub.add_parser("probe", help="measure the interconnect before training")
    commands = probe.add_subparsers(dest="probe_command", required=True)
    coll = commands.add_parser("collectives", help="all-reduce, all-gather, reduce-scatter across sizes (torchrun)")
    coll.add_argument("--nproc", type=int, default=2, help="processes (ranks) on this node")
    coll.add_argument("--sizes", default="1K,16K,256K,4M,32M")
    coll.add_argument("--iters", type=int, default=20)
    coll.add_argument("--out", default="collective_probe.json")
    coll.set_defaults(func=cmd_collectives)
