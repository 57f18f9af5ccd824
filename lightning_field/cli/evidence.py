"""``field evidence check``: does an existing bundle still support a recovery claim?"""

from __future__ import annotations

import argparse
from pathlib import Path

from lightning_field.evidence.check import check_bundle


def cmd_check(args: argparse.Namespace) -> int:
    checkpoint = Path(args.checkpoint) if args.checkpoint else None
    ok, problems = check_bundle(Path(args.bundle), checkpoint)
    target = f" for {checkpoint}" if checkpoint else ""
    if ok:
        print(f"SUPPORTED  {args.bundle} supports a recovery claim{target}")
        return 0
    print(f"NOT SUPPORTED  {args.bundle} does not support a recovery claim{target}:")
    for problem in problems:
        print(f"  {problem}")
    return 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    evidence = sub.add_parser("evidence", help="resume evidence bundles (made by field-evidence)")
    commands = evidence.add_subparsers(dest="evidence_command", required=True)
    check = commands.add_parser(
        "check",
        help="exit 0 only if the bundle passed its gate, is complete, and (with --checkpoint) is current for it",
    )
    check.add_argument("bundle", help="an evidence bundle directory (holding evidence.json)")
    check.add_argument(
        "--checkpoint", help="the checkpoint directory the claim is about; stale if its code/config/data differ"
    )
    check.set_defaults(func=cmd_check)
