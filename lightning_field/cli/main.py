"""Entry point of the ``field`` command."""

from __future__ import annotations

import argparse
import sys

from lightning_field.cli import ckpt, evidence, plan, probe, record, scale, wandb


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="field", description="lightning_field: recoverable, bounded training runs")
    sub = parser.add_subparsers(dest="command", required=True)
    ckpt.add_parser(sub)
    evidence.add_parser(sub)
    plan.add_parser(sub)
    probe.add_parser(sub)
    record.add_parser(sub)
    scale.add_parser(sub)
    wandb.add_parser(sub)
    preflight = sub.add_parser(
        "preflight",
        help="data and label checks, a tiny overfit, a one-device baseline and the fit (Hydra overrides follow)",
        add_help=False,  # --help and every other argument go to the Hydra app
    )
    preflight.add_argument("overrides", nargs=argparse.REMAINDER)
    preflight.set_defaults(func=_preflight)
    return parser


def _preflight(args: argparse.Namespace) -> int:
    from lightning_field.cli import preflight_app

    sys.argv = ["field preflight", *args.overrides]
    preflight_app.main()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
