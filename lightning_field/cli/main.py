"""Entry point of the ``field`` command."""

from __future__ import annotations

import argparse
import sys

from lightning_field.cli import ckpt, evidence, ledger, plan, probe, record, scale, wandb
from lightning_field.core.signing import SigningKeyError

PREFLIGHT_HELP = "data and label checks, a tiny overfit, a one-device baseline and the fit (Hydra overrides follow)"
PREFLIGHT_USAGE = """usage: field preflight [--config-dir DIR] [--config-name NAME] [--cfg {job,hydra,all}]
                       [OVERRIDE ...]

The baseline-first checks (also `field-preflight`): data and label checks, a tiny overfit, a
one-device baseline and the fit. Exit 0 when every check passed, 1 when one failed, 2 when the
settings are unusable. Arguments are Hydra's: overrides on the same groups as field-train
(experiment=char_gpt_tiny, model._target_=my_pkg.MyModule, preflight.overfit_max_steps=50, ...).
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="field", description="lightning_field: recoverable, bounded training runs")
    sub = parser.add_subparsers(dest="command", required=True)
    ckpt.add_parser(sub)
    evidence.add_parser(sub)
    ledger.add_parser(sub)
    plan.add_parser(sub)
    probe.add_parser(sub)
    record.add_parser(sub)
    scale.add_parser(sub)
    wandb.add_parser(sub)
    # Listed here for `field --help`; main() hands its arguments to Hydra before argparse sees them.
    preflight = sub.add_parser("preflight", help=PREFLIGHT_HELP, add_help=False)
    preflight.add_argument("overrides", nargs=argparse.REMAINDER)
    preflight.set_defaults(func=lambda args: _preflight(args.overrides))
    return parser


def _preflight(overrides: list[str]) -> int:
    if {"-h", "--help"} & set(overrides):
        # Hydra's own help lists the config groups and the composed config, but no usage line.
        print(PREFLIGHT_USAGE)
    sys.argv = ["field preflight", *overrides]
    from lightning_field.cli import preflight_app  # Lightning and Hydra: only for the command that needs them

    try:
        preflight_app.main()
    except SystemExit as done:  # Hydra exits, after --help and with the run's status: returned, not raised
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "preflight":
        # Not through argparse: its REMAINDER refuses a leading option (`field preflight --help`,
        # `--config-dir DIR`) as unrecognized before Hydra, whose options they are, could see it.
        return _preflight(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except SigningKeyError as err:  # the environment's key, malformed: a clean refusal, whatever the command
        print(f"field: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
