"""``field wandb sync RUN_DIR``: upload every offline segment of a run into its one W&B run, in order.

Each attempt of a run logged with ``FieldWandbLogger`` in offline mode leaves its own segment under
``RUN_DIR/wandb/attempt-<N>/``. Syncing those one by one, as ``wandb sync`` does by default,
replays each as if it were the whole run, and a later segment overwrites an earlier one's history
(wandb #3841). ``wandb sync --id`` instead replays several files of one run in order of start time;
this command finds the segments, checks they belong to the run in ``field/wandb.json``, and runs it.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

from lightning_field.core.layout import WANDB_RELPATH
from lightning_field.integrations.wandb_identity import offline_segments, read_wandb_identity


class SyncInputError(ValueError):
    """The run directory cannot be synced as asked (no identity, no segments)."""


def sync_command(
    run_dir: Path, project: str | None = None, entity: str | None = None
) -> tuple[list[str], list[Path], str]:
    """The exact ``wandb sync`` argv, the segments it syncs (attempt order) and the run id."""
    try:
        identity = read_wandb_identity(run_dir)
    except ValueError as err:
        raise SyncInputError(str(err)) from err
    if identity is None:
        if not run_dir.is_dir():
            raise SyncInputError(f"{run_dir}: no such run directory")
        raise SyncInputError(
            f"{run_dir / WANDB_RELPATH} not found: {run_dir} was not logged with FieldWandbLogger(run_dir=...), so"
            " there is no W&B run id to merge its segments into"
        )
    run_id = str(identity["run_id"])
    segments = offline_segments(run_dir, run_id)
    if not segments:
        raise SyncInputError(
            f"{run_dir}: no offline segments of W&B run {run_id} under {run_dir / 'wandb'}/attempt-*/wandb/"
            " (the run logged online, or nothing was written yet): nothing to sync"
        )
    cmd = [sys.executable, "-m", "wandb", "sync", "--id", run_id]
    if project:
        cmd += ["--project", project]
    if entity:
        cmd += ["--entity", entity]
    cmd += [str(s) for s in segments]
    return cmd, segments, run_id


def cmd_sync(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    try:
        cmd, segments, run_id = sync_command(run_dir, args.project, args.entity)
    except SyncInputError as err:
        print(f"field wandb sync: {err}", file=sys.stderr)
        return 2
    print(f"W&B run {run_id}: {len(segments)} offline segment(s), in attempt order:")
    for index, segment in enumerate(segments, 1):
        synced = " (already synced: wandb skips it)" if any(segment.glob("*.wandb.synced")) else ""
        print(f"  {index}. {segment}{synced}")
    print(shlex.join(cmd))
    if args.dry_run:
        return 0
    return subprocess.run(cmd, check=False).returncode


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    wandb = subparsers.add_parser("wandb", help="Weights & Biases: sync a run's offline segments as one W&B run")
    sub = wandb.add_subparsers(dest="wandb_command", required=True)
    sync = sub.add_parser(
        "sync",
        help="upload every offline segment of RUN_DIR into its one W&B run, in attempt order",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sync.add_argument("run_dir", metavar="RUN_DIR", help="the run directory given to FieldWandbLogger(run_dir=...)")
    sync.add_argument("--project", help="W&B project to sync into (default: the one the segments recorded)")
    sync.add_argument("--entity", help="W&B entity to sync into (default: the one the segments recorded)")
    sync.add_argument("--dry-run", action="store_true", help="print the segments and the exact command, run nothing")
    sync.set_defaults(func=cmd_sync)


def main(argv: list[str] | None = None) -> int:
    """``python -m lightning_field.cli.wandb sync RUN_DIR``: the same command without the ``field`` entry point."""
    parser = argparse.ArgumentParser(prog="field")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["wandb", *(argv if argv is not None else sys.argv[1:])])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["SyncInputError", "add_parser", "cmd_sync", "main", "sync_command"]
