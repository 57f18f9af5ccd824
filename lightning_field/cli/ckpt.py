"""``field ckpt verify|list|inspect|export``: look at checkpoints without starting a training run, and take
a model's weights out of one (``export``: :mod:`lightning_field.cli.ckpt_export`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO, cast

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from lightning_field.checkpoint.resolver import CheckpointEntry, committed_checkpoints, latest_recoverable
from lightning_field.checkpoint.snapshot_dirs import snapshot_dir_for
from lightning_field.checkpoint.snapshot_lineage import LINEAGE_NAME, lineage_mismatch
from lightning_field.checkpoint.stores import CheckpointStore, LocalStore, location_exists
from lightning_field.checkpoint.verify import VerifyReport, name_step_problem, verify_checkpoint
from lightning_field.cli.ckpt_export import add_export_parser
from lightning_field.cli.storage_options import storage_options_of
from lightning_field.core.manifest import MANIFEST_NAME, Manifest, ManifestError, read_manifest
from lightning_field.core.member_paths import UnsafeMemberError
from lightning_field.core.signing import keys_from_environment, signature_legend, signature_state, signature_status
from lightning_field.core.storage import Location, StorageOptions, as_location, basename, open_fs, parent

_PROGRESS_MIN_BYTES = 64 << 20


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _human_age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


class _Progress:
    """A byte progress bar on stderr (``rich.progress``), shown only for verifications big enough to
    wait for: it starts at the first report of such a total and is closed by ``close``."""

    def __init__(self, stream: TextIO) -> None:
        self._bar = Progress(
            TextColumn("verifying"),
            BarColumn(),
            DownloadColumn(binary_units=True),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=Console(file=stream),
        )
        self._task: TaskID | None = None

    def __call__(self, done: int, total: int) -> None:
        if total < _PROGRESS_MIN_BYTES:
            return
        if self._task is None:
            self._bar.start()
            self._task = self._bar.add_task("verify", total=total)
        self._bar.update(self._task, completed=done)

    def close(self) -> None:
        if self._task is not None:
            self._bar.stop()
            self._task = None


def _not_a_checkpoint(path: str, options: StorageOptions | None, problems: list[str]) -> str:
    """Why ``path`` has no readable manifest, in the words that tell the user what to do next: a typo'd
    path, the checkpoints folder given for one checkpoint, and a directory whose save never committed
    are three different mistakes."""
    location = as_location(path)
    if isinstance(location, Path):
        exists, is_dir = location.exists(), location.is_dir()
        has_manifest = (location / MANIFEST_NAME).is_file()
    else:
        fs, prefix = open_fs(location, options)
        exists, is_dir = bool(fs.exists(prefix)), bool(fs.isdir(prefix))
        has_manifest = bool(fs.isfile(f"{prefix}/{MANIFEST_NAME}"))
    if not exists:
        return f"DOES NOT EXIST  {path}: no such file or directory (check the path)"
    if not is_dir:
        if basename(location) == MANIFEST_NAME:
            return (
                f"NOT A CHECKPOINT  {path} is its manifest; verify the directory: field ckpt verify {parent(location)}"
            )
        return (
            f"NOT A CHECKPOINT  {path} is a file, and not the .ckpt of a committed checkpoint (no folder beside it"
            f" whose state.pt it is); a checkpoint is a directory holding {MANIFEST_NAME}"
        )
    if has_manifest:  # there, but unreadable: the reader's words say how
        return f"NOT A CHECKPOINT  {path}: its manifest cannot be read\n  " + "\n  ".join(problems)
    inside = committed_checkpoints(location, options)
    if inside:
        newest = basename(inside[0].path)
        path = path.rstrip("/")
        return (
            f"NOT A CHECKPOINT  {path} is a folder of {len(inside)} checkpoint(s) (newest {newest}), not one"
            f" checkpoint: see them with `field ckpt list {path}`, or verify one: field ckpt verify {path}/{newest}"
        )
    return (
        f"NOT A CHECKPOINT  {path}: a directory without {MANIFEST_NAME} (an interrupted save that never"
        " committed, or not a checkpoint directory)"
    )


def cmd_verify(args: argparse.Namespace) -> int:
    options = storage_options_of(args)
    progress = None if args.quiet else _Progress(sys.stderr)
    try:
        report = verify_checkpoint(args.path, progress=progress, storage_options=options)
    finally:
        if progress is not None:
            progress.close()
    if report.manifest is None:
        print(_not_a_checkpoint(args.path, options, report.problems))
        return 1
    m = report.manifest
    if report.problems:
        # Refused, not damaged: a name that states another step (refused unhashed: what it holds may be
        # intact, just not that step), or intact files under a signature that does not verify.
        refused = name_step_problem(report.path, m) is not None or report.files_intact
        heading = "REFUSED" if refused else "CORRUPT"
        print(f"{heading}  {args.path} (step {m.step})")
        for problem in report.problems:
            print(f"  {problem}")
        return 1
    if not m.recoverable:
        print(f"INTACT BUT NOT RECOVERABLE  {args.path} (step {m.step}, {m.kind}); it lacks:")
        for missing in m.missing:
            print(f"  {missing}")
        return 1
    total = sum(f.size for f in m.files.values())
    print(
        f"OK  {args.path}: recoverable, {len(m.files)} files, {_human_bytes(total)}, step {m.step},"
        f" world size {m.world_size}; {_signature(m)}"
    )
    return 0


def _signature(m: Manifest) -> str:
    return signature_status(m.signed_content(), m.signature, keys_from_environment())


def _drill_mark(m: Manifest) -> str:
    if m.restore_tested:
        return "tested"
    outcome = str((m.restore_drill or {}).get("outcome"))
    return {"mismatch": "FAILED", "error": "error"}.get(outcome, "-")


def _snapshot_tier(root: str, parent: str | None) -> Path | None:
    """The step snapshots of the checkpoints under ``root`` on this machine (where
    ``ManifestCheckpoint(snapshots=SnapshotConfig(...))`` keeps them), if any are there and they
    are this run's (a deleted run's, left behind, are named and not listed: a resume ignores them)."""
    location = as_location(root)
    if not isinstance(location, Path):
        return None  # snapshots are of a local run's dirpath; an object store's run keeps them on its nodes
    where = snapshot_dir_for(location, parent)
    if not where.is_dir():  # a run over several nodes: each node's folder is named for it
        where = next(iter(sorted(where.parent.glob(f"{where.name}-node*"))), where)
    if not where.is_dir():
        return None
    mismatch = lineage_mismatch(where, cast(CheckpointStore, LocalStore()), location)
    if mismatch is not None:
        if any(child.name != LINEAGE_NAME for child in where.iterdir()):
            print(f"not listed: {mismatch}; a restart ignores them, and its setup deletes them")
        return None
    return where


def _files_here(entry: CheckpointEntry) -> int:
    """How many of the manifest's files this copy holds (a node's copy of a multi-node snapshot may hold
    some), as the store sees them: a name that leads out of the checkpoint is not held."""
    assert entry.manifest is not None and isinstance(entry.path, Path)  # snapshots are local
    store, held = LocalStore(), 0
    for name in entry.manifest.files:
        with contextlib.suppress(UnsafeMemberError):
            held += store.size(entry.path, name) is not None
    return held


def _status(entry: CheckpointEntry, report: VerifyReport | None, tier: str) -> str:
    m = entry.manifest
    assert m is not None
    if tier == "snapshot" and (held := _files_here(entry)) < len(m.files):
        return f"partial {held}/{len(m.files)}"
    if name_step_problem(entry.path, m) is not None:
        return "misnamed"  # its name states another step than its manifest: refused, never resumed
    if report is not None:
        if report.recoverable or not report.problems:
            return "recoverable" if report.recoverable else "not recoverable"
        return "bad signature" if report.files_intact else "corrupt"  # intact files, a refused signature
    return "recoverable*" if m.recoverable else f"{m.kind}, incomplete" if m.kind == "recovery" else m.kind


def cmd_list(args: argparse.Namespace) -> int:
    options = storage_options_of(args)
    root = args.dir
    if not location_exists(root, options):
        print(f"field ckpt list: {root} is not a directory or an existing prefix", file=sys.stderr)
        return 2
    tiers: list[tuple[str, CheckpointEntry]] = [("persistent", e) for e in committed_checkpoints(root, options)]
    snapshots = _snapshot_tier(root, args.snapshot_dir)
    if snapshots is not None:
        tiers += [("snapshot", e) for e in committed_checkpoints(snapshots)]
    reports: dict[Location, VerifyReport] = {}
    if args.verify:
        reports = {
            e.path: verify_checkpoint(e.path, storage_options=options if t == "persistent" else None)
            for t, e in tiers
            if e.manifest
        }
    # The mark is the resolver's own pick over both tiers, not the LAST pointer: LAST names the newest
    # commit, which a restart skips when it is not recoverable, is corrupt or failed its restore drill.
    # Without --verify the resolver still hashes the newest candidates until one is intact (usually one).
    picks: dict[str, tuple[Location, int] | None] = {}
    for tier, where, storage in (("persistent", root, options), ("snapshot", snapshots, None)):
        found = latest_recoverable(where, storage, reports, log_skips=False) if where is not None else None
        manifest = next((e.manifest for t, e in tiers if t == tier and e.path == found), None)
        picks[tier] = (found, manifest.step) if found is not None and manifest is not None else None
    # As a resume picks over the tiers: the newer step, the persistent checkpoint on a tie.
    persistent, snapshot = picks["persistent"], picks["snapshot"]
    newer = snapshot is not None and (persistent is None or snapshot[1] > persistent[1])
    resume_tier = "snapshot" if newer else "persistent"
    resume = picks[resume_tier]
    now = time.time()
    entries = sorted(
        tiers, key=lambda te: (te[1].manifest.step if te[1].manifest else -1, te[0] == "persistent"), reverse=True
    )
    # --verify: each signature, under the configured key (a column once a key is set or one is signed).
    keys = keys_from_environment() if args.verify else None
    signed = args.verify and (keys is not None or any(e.manifest and e.manifest.signature for _, e in tiers))
    column = f" {'signature':<9}" if signed else ""
    print(f"{'name':<36} {'tier':<10} {'step':>8} {'status':<16} {'drill':<6}{column} {'size':>10} {'age':>7}")
    for tier, entry in entries:
        m = entry.manifest
        name = basename(entry.path)
        if m is None:
            print(f"{name:<36} {tier:<10} {'?':>8} {'unreadable':<16} {'':<6} {'':>10} {'':>7}  {entry.error}")
            continue
        status = _status(entry, reports.get(entry.path) if args.verify else None, tier)
        marks = " <- resume" if resume is not None and entry.path == resume[0] else ""
        size = sum(f.size for f in m.files.values())
        signature = f" {signature_state(m.signed_content(), m.signature, keys):<9}" if signed else ""
        print(
            f"{name:<36} {tier:<10} {m.step:>8} {status:<16} {_drill_mark(m):<6}{signature} {_human_bytes(size):>10}"
            f" {_human_age(now - m.created_unix):>7}{marks}"
        )
    if not args.verify and tiers:
        print("* from the manifest, not verified; add --verify to hash every file")
    if tiers:
        print("drill: 'tested' = a restore drill replayed the next step from it and matched the live run")
    if args.verify and tiers:
        print(signature_legend(signed))
    if snapshots is not None:
        print(
            f"snapshot: a step snapshot on this machine, in {snapshots} (a run over several nodes agrees over"
            " every node's copies and their replicas; 'partial' = this node holds some of its files)"
        )
    if resume is not None:
        where, step = resume
        print(f"resume: a restart with ckpt_path='last' resumes from {basename(where)} ({resume_tier}, step {step})")
    elif tiers:
        print(
            f"NOTHING RECOVERABLE in {root}: none of the {len(tiers)} checkpoint(s) is recoverable and intact, so"
            " a restart with ckpt_path='last' starts from step 0 (see `field ckpt verify PATH` for why)"
        )
    else:
        print(f"NOTHING RECOVERABLE: no committed checkpoints in {root}; a restart starts from step 0")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    try:
        m = read_manifest(args.path, storage_options_of(args))
    except ManifestError as err:
        print(f"field ckpt inspect: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(m.to_json())
        return 0
    print(f"checkpoint   {args.path}")
    print(f"format       {m.format} (hashes: {m.hash_algorithm})")
    print(f"kind         {m.kind}; recoverable: {'yes' if m.recoverable else 'NO'}")
    print(f"signature    {_signature(m)}")
    for missing in m.missing:
        print(f"  missing    {missing}")
    print(f"step/epoch   {m.step} / {m.epoch}; world size {m.world_size}")
    created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(m.created_unix))
    save = f"; save took {m.save_seconds:.2f}s" if m.save_seconds is not None else ""
    print(f"created      {created}{save}")
    if m.restore_drill is not None:
        checks = m.restore_drill.get("checks", {})
        failed = [name for name, check in checks.items() if not check.get("passed")]
        outcome = (
            "passed"
            if m.restore_tested
            else f"{m.restore_drill.get('outcome')} ({', '.join(failed) or m.restore_drill.get('error')})"
        )
        print(f"restore      drill {outcome}; log {m.restore_drill.get('log')}")
    else:
        print("restore      not drilled (no restore drill has replayed a step from it)")
    print("components")
    for name, ranks in sorted(m.components.items()):
        print(f"  {name:<14} ranks {ranks}")
    print("files")
    for name, entry in sorted(m.files.items()):
        print(
            f"  {name:<18} {_human_bytes(entry.size):>10}  rank {entry.rank}  {entry.hash[:16]}…"
            f"  {', '.join(entry.contents)}"
        )
    # Shown as read back: a manifest is untrusted, so anything but the written shape is printed, not walked.
    restore = m.data_restore if isinstance(m.data_restore, dict) else {"?": [m.data_restore]}
    positions = m.stream_positions if isinstance(m.stream_positions, dict) else {"?": [m.stream_positions]}
    if restore or positions:
        print("data position")
    for rank in sorted(set(restore) | set(positions), key=lambda r: (not str(r).isdigit(), str(r).zfill(8))):
        for index, how in enumerate(_as_list(restore.get(rank))):
            print(f"  rank {rank}  loader {index}: {how}")
        for index, workers in enumerate(_as_list(positions.get(rank))):
            for worker, position in sorted(workers.items()) if isinstance(workers, dict) else [("?", workers)]:
                print(f"  rank {rank}  stream {index} {worker}: {json.dumps(position, sort_keys=True, default=str)}")
    prov = m.provenance
    print("provenance")
    for section in ("code", "model", "data", "environment"):
        value = prov.get(section)
        if value:
            print(f"  {section:<12} {json.dumps(value, sort_keys=True, default=str)}")
    config = prov.get("config") or {}
    if config:
        print(f"  {'config':<12} hash {config.get('hash', '?')[:16]}… (full resolved config: --json)")
    return 0


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [] if value is None else [value]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    ckpt = subparsers.add_parser("ckpt", help="verify, list, inspect and export manifest checkpoints")
    sub = ckpt.add_subparsers(dest="ckpt_command", required=True)
    verify = sub.add_parser("verify", help="exit 0 only for an intact, recoverable checkpoint")
    verify.add_argument("path")
    verify.add_argument("-q", "--quiet", action="store_true", help="no progress meter")
    verify.set_defaults(func=cmd_verify)
    listing = sub.add_parser("list", help="each checkpoint with its step, status, size and age")
    listing.add_argument("dir")
    listing.add_argument("--verify", action="store_true", help="hash every file (slower, exact status)")
    listing.add_argument(
        "--snapshot-dir",
        metavar="PARENT",
        help="where the run keeps step snapshots, as given to SnapshotConfig(directory=...) (default /dev/shm)",
    )
    listing.set_defaults(func=cmd_list)
    inspect = sub.add_parser("inspect", help="the manifest in readable form")
    inspect.add_argument("path")
    inspect.add_argument("--json", action="store_true", help="the raw manifest")
    inspect.set_defaults(func=cmd_inspect)
    export = add_export_parser(sub)
    for command in (verify, listing, inspect, export):
        command.add_argument(
            "--storage-option",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="fsspec storage option for a URL path, repeatable (endpoint_url=http://..., anon=true)",
        )


__all__ = ["add_parser"]
