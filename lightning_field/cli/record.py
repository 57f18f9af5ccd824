"""``field record build|check|sign``: the release record (``lightning_field.record``).

Exit status: ``check`` 0 only when every critical condition passes with fresh evidence, the record is
unedited and every signature is valid, 1 otherwise; every command 2 for unusable input (a missing
directory, an unknown role, no sources, a malformed condition configuration).

``lightning_field.record`` and the checkpoint reader are imported inside the commands: ``cli.main``
imports this module to build ``field --help``, which must not pay for torch and Lightning.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any

from lightning_field.core.layout import RECORD_RELPATH

EXIT_OK, EXIT_HELD, EXIT_BAD_INPUT = 0, 1, 2


def _fail(message: str) -> int:
    print(f"field record: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _print_conditions(conditions: list[dict[str, Any]]) -> None:
    for c in conditions:
        print(f"  {c['status'].upper():<8} {c['severity']:<9} {c['name']}: {c['detail']}")


def _approved(decision: dict[str, Any], exposure: dict[str, Any]) -> str:
    """The exposure a GO approves: only the level the evidence supports, never the next one."""
    if decision["verdict"] != "go":
        return ""
    return (
        f", for exposure up to {exposure['supported']}"
        if exposure["supported"]
        else ", but no exposure level is supported yet"
    )


def _print_exposure(exposure: dict[str, Any]) -> None:
    print(f"exposure: supported level {exposure['supported'] or 'none'} ({exposure['why']})")
    if exposure["next"]:
        lacks = "; ".join(f"{x['name']} ({x['status']})" for x in exposure["next_lacks"]) or "nothing"
        print(f"exposure: next level {exposure['next']} lacks: {lacks}")


_OVERRIDE = re.compile(r"^[+~]{0,2}record([.=@]|$)")


def split_items(items: list[str]) -> tuple[list[Path], list[str]]:
    """(run directories, overrides): an existing directory is a run, ``record...`` is an override."""
    runs, overrides = [], []
    for item in items:
        if _OVERRIDE.match(item) and not Path(item).is_dir():
            overrides.append(item)
        else:
            runs.append(Path(item))
    return runs, overrides


ITEMS_HELP = (
    "run directories (the first one holding checkpoints is the run being released) and Hydra overrides of the"
    " record group, e.g. record.conditions.no_stragglers.severity=critical or '~record.conditions.goodput'"
)


def _build_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", help="record directory (default: RELEASED_RUN_DIR/field/record)")
    p.add_argument("--copy", action="store_true", help="copy the sources into the record (default: link and hash)")
    p.add_argument("--plan", help="a `field plan --json` output to set beside the measurements")
    p.add_argument("--no-wandb", action="store_true", help="do not log the record to the run's W&B run")


def build_arguments() -> argparse.ArgumentParser:
    """What follows the first run directory: more of them, overrides and options, intermixed."""
    p = argparse.ArgumentParser(prog="field record build", description="assemble the release record")
    _build_options(p)
    p.add_argument("items", nargs="*", metavar="RUN_DIR|OVERRIDE", help=ITEMS_HELP)
    return p


def released_dir(run_dirs: list[Path]) -> Path:
    """Where the record goes by default: the released run's ``field/record`` (the first with checkpoints)."""
    # Lazy: keeps `field --help` free of torch (module docstring).
    from lightning_field.checkpoint.resolver import committed_checkpoints

    return next((d for d in run_dirs if any(e.manifest for e in committed_checkpoints(d / "checkpoints"))), run_dirs[0])


def cmd_build(outer: argparse.Namespace) -> int:
    try:
        args = build_arguments().parse_intermixed_args(outer.items)
    except SystemExit as exit_:  # a usage error, already printed
        return int(exit_.code or 0)
    for name in ("out", "copy", "plan", "no_wandb"):  # options given before the first run directory
        if not getattr(args, name) and getattr(outer, name):
            setattr(args, name, getattr(outer, name))
    # Lazy: keeps `field --help` free of torch (module docstring).
    from lightning_field.record.build import RECORD_HTML, build_record
    from lightning_field.record.collect import NoSourcesError
    from lightning_field.record.config import RecordConfigError, load_record_config

    run_dirs, overrides = split_items(args.items)
    if not run_dirs:
        return _fail("no RUN_DIR given")
    missing = [str(d) for d in run_dirs if not d.is_dir()]
    if missing:
        return _fail(f"not a directory: {', '.join(missing)}")
    try:
        config = load_record_config(overrides)
    except RecordConfigError as err:
        return _fail(str(err))
    out = Path(args.out) if args.out else released_dir(run_dirs) / RECORD_RELPATH
    try:
        record = build_record(
            run_dirs, out, config, time.time(), copy=args.copy, plan=Path(args.plan) if args.plan else None
        )
    except NoSourcesError as err:
        return _fail(str(err))
    decision = record["decision"]
    print(f"release record: {out / 'record.json'}\nrelease record: {out / RECORD_HTML}")
    print(f"released run: {record['release'].get('run_dir')} ({record['release'].get('checkpoint')})")
    print(f"{len(record['sources'])} source(s), {len(record['figures'])} figure(s)")
    _print_conditions(record["conditions"])
    _print_exposure(record["exposure"])
    held = f" (held by {', '.join(h['name'] for h in decision['held_by'])})" if decision["held_by"] else ""
    print(f"decision: {'GO' if decision['verdict'] == 'go' else 'HOLD'}{held}{_approved(decision, record['exposure'])}")
    _maybe_log_wandb(args, config, record, out)
    return EXIT_OK


def _maybe_log_wandb(args: argparse.Namespace, config: Any, record: dict[str, Any], out: Path) -> None:
    """W&B is a destination, never a gate: a failure to log is reported and the record stands."""
    run_dir = record["release"].get("run_dir")
    if args.no_wandb or config.wandb_log is False or run_dir is None:
        return
    # Lazy: the integrations package loads W&B and Lightning, which only a record logged to W&B needs.
    from lightning_field.integrations.wandb_identity import read_wandb_identity

    try:
        has_run = read_wandb_identity(run_dir) is not None
    except ValueError as err:
        print(f"field record: W&B not logged: {err}", file=sys.stderr)
        return
    if not has_run:
        if config.wandb_log is True:
            print(f"field record: W&B not logged: {run_dir} has no field/wandb.json", file=sys.stderr)
        return
    from lightning_field.record.wandb_log import log_record  # imports wandb: only when a run is logged to

    try:
        logged = log_record(record, out, Path(run_dir), config.wandb_mode)
    except Exception as err:  # the record is written; W&B being unreachable must not undo that
        print(f"field record: W&B not logged: {type(err).__name__}: {err}", file=sys.stderr)
        return
    print(
        f"W&B: artifact {logged['artifact']} and verdict logged to run {logged['run_id']} ({logged['mode']},"
        f" {logged['segment']})"
    )


def cmd_check(args: argparse.Namespace) -> int:
    # Lazy: keeps `field --help` free of torch (module docstring).
    from lightning_field.record.check import RecordUnreadableError, check_record
    from lightning_field.record.config import RecordConfigError

    try:
        result = check_record(Path(args.record_dir))
    except (RecordUnreadableError, RecordConfigError) as err:
        return _fail(str(err))
    _print_conditions(result.conditions)
    _print_exposure(result.exposure)
    for s in result.signatures:
        print(f"signature: valid, {s['role']} {s['name']!r} at {s['time']}: {s['note']}")
    for warning in result.warnings:
        print(f"note: {warning}")
    if result.ok:
        print(
            f"GO  {args.record_dir}: every critical condition passes with fresh evidence"
            + _approved(result.decision, result.exposure)
        )
        return EXIT_OK
    print(f"HOLD  {args.record_dir}:")
    for held in result.decision["held_by"]:
        print(f"  {held['name']} is {held['status']}: {held['detail']}")
    for problem in result.problems:
        print(f"  {problem}")
    return EXIT_HELD


def cmd_sign(args: argparse.Namespace) -> int:
    # Lazy: keeps `field --help` free of torch (module docstring).
    from lightning_field.record.build import write_html, write_json
    from lightning_field.record.check import RecordUnreadableError, load_record
    from lightning_field.record.signing import CONTENT_SHA256, content_sha256, sign, verify_signatures

    record_dir = Path(args.record_dir)
    try:
        record = load_record(record_dir)
    except RecordUnreadableError as err:
        return _fail(str(err))
    roles = record["signoff"]["roles"]
    if args.role not in roles:
        return _fail(f"unknown role {args.role!r}; this record's roles are {', '.join(roles)}")
    if not args.name.strip():
        return _fail("--name is empty: a signature names who takes responsibility")
    if record.get(CONTENT_SHA256) != content_sha256(record):
        return _fail(f"{record_dir / 'record.json'} was edited after it was built; rebuild it before signing")
    _, invalid = verify_signatures(record)
    entry = sign(record, args.role, args.name.strip(), args.note, time.time())
    write_json(record, record_dir)
    write_html(record, record_dir)
    print(f"signed by {entry['name']!r} as {entry['role']} at {entry['time']} over content {entry['content_sha256']}")
    for problem in invalid:
        print(f"note: {problem}")
    if record["decision"]["verdict"] != "go":
        print("note: this record is HELD; the signature records accountability for it as it stands")
    return EXIT_OK


def add_parser(sub: argparse._SubParsersAction) -> None:
    record = sub.add_parser("record", help="the release record: evidence, conditions, exposure level, sign-off")
    commands = record.add_subparsers(dest="record_command", required=True)
    build = commands.add_parser("build", help="assemble record.json and record.html from run directories")
    _build_options(build)
    # REMAINDER: run directories, then overrides and options in any order (parsed again in cmd_build).
    build.add_argument("items", nargs=argparse.REMAINDER, metavar="RUN_DIR|OVERRIDE", help=ITEMS_HELP)
    build.set_defaults(func=cmd_build)
    check = commands.add_parser("check", help="exit 0 only if every critical condition passes with fresh evidence")
    check.add_argument("record_dir", metavar="RECORD_DIR")
    check.set_defaults(func=cmd_check)
    sign = commands.add_parser("sign", help="append a sign-off over the record's current content")
    sign.add_argument("record_dir", metavar="RECORD_DIR")
    sign.add_argument("--role", required=True, help="model-owner, data-owner, training-operator (as configured)")
    sign.add_argument("--name", required=True)
    sign.add_argument("--note", default="")
    sign.set_defaults(func=cmd_sign)
