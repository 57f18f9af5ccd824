"""The manifest schema: the one description of what a checkpoint holds, readable without torch.

``manifest.json`` is written last and published by rename, so its presence *is* the commit. Every
consumer (the resolver, ``field ckpt``, and later evidence and release records) reads checkpoints
through this module rather than by looking at files.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lightning_field.core.documents import DocumentFormat, check_envelope, parse_document
from lightning_field.core.fsio import atomic_write_bytes
from lightning_field.core.hashing import HASH_ALGORITHM
from lightning_field.core.storage import StorageOptions, is_url, join, open_fs

FORMAT = "lightning_field.checkpoint/2"
# Every format this version reads, with the one hash algorithm each names: format 1 (SHA-256)
# checkpoints written by earlier versions still verify and resume.
READABLE_FORMATS = {"lightning_field.checkpoint/1": "sha256", FORMAT: HASH_ALGORITHM}
MANIFEST_NAME = "manifest.json"
MANIFEST_DOCUMENT = DocumentFormat(
    title="checkpoint",
    current=FORMAT,
    readable=tuple(READABLE_FORMATS),
    required=("name", "step", "epoch", "world_size", "files", "components", "recoverable", "missing"),
    missing_hint="no manifest, so this is not a committed checkpoint",
)
SHARED_STATE_FILE = "state.pt"
DRILL_RECORD_NAME = "restore_drill.json"
DRILL_RECORD_FORMAT = "lightning_field.restore_drill/1"
DRILL_RECORD_DOCUMENT = DocumentFormat(
    title="restore drill record",
    current=DRILL_RECORD_FORMAT,
    readable=(DRILL_RECORD_FORMAT,),
    required=("restore_tested", "record"),
)
"""A restore drill's outcome, written beside the manifest after the commit. Checkpoints of earlier
versions carry it in the manifest itself (``restore_tested``, ``restore_drill``), still read there."""


def rank_state_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


class ManifestError(ValueError):
    """A manifest is missing, unreadable, or of a format this version cannot read."""


@dataclass
class FileEntry:
    size: int
    hash: str
    rank: int
    contents: list[str] = field(default_factory=list)


@dataclass
class Manifest:
    name: str
    step: int
    epoch: int
    world_size: int
    files: dict[str, FileEntry]
    components: dict[str, list[int]]
    recoverable: bool
    missing: list[str]
    kind: str = "recovery"
    provenance: dict[str, Any] = field(default_factory=dict)
    created_unix: float = field(default_factory=time.time)
    save_seconds: float | None = None
    # Set by a passing restore drill (lightning_field.evidence.RestoreDrill), with the drill's record.
    restore_tested: bool = False
    restore_drill: dict[str, Any] | None = None
    # Per rank, per train loader: how a resume restores the data position and what that costs.
    data_restore: dict[str, list[str]] = field(default_factory=dict)
    # Per rank, per stream loader: each worker's dataset position (lightning_field.state.streams).
    stream_positions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    format: str = FORMAT
    hash_algorithm: str = HASH_ALGORITHM
    # Keys of a readable format that this version does not know (a later writer's): kept as read, and
    # written back unchanged when the manifest is rewritten, never dropped.
    unknown_fields: dict[str, Any] = field(default_factory=dict, repr=False)

    def to_json(self) -> str:
        data = asdict(self)
        data.update(data.pop("unknown_fields"))
        return json.dumps(data, indent=2, sort_keys=True, default=str)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        fmt = check_envelope(data, MANIFEST_DOCUMENT, "manifest", ManifestError)["format"]
        if data.get("hash_algorithm") != READABLE_FORMATS[fmt]:
            raise ManifestError(
                f"checkpoint format {fmt!r} names hash algorithm {data.get('hash_algorithm')!r};"
                f" that format uses {READABLE_FORMATS[fmt]!r}"
            )
        payload = dict(data)
        payload["files"] = {name: FileEntry(**entry) for name, entry in data["files"].items()}
        known = set(cls.__dataclass_fields__) - {"unknown_fields"}
        unknown = {k: v for k, v in payload.items() if k not in known}
        return cls(**{k: v for k, v in payload.items() if k in known}, unknown_fields=unknown)

    def write(self, directory: Path) -> None:
        atomic_write_bytes(directory / MANIFEST_NAME, self.to_json().encode())


def read_manifest(checkpoint_dir: str | os.PathLike[str], storage_options: StorageOptions | None = None) -> Manifest:
    """The checkpoint's manifest, with what was recorded of it after its commit (a restore drill's
    outcome, from ``restore_drill.json`` beside it): the one reader of both.

    Raises:
        ManifestError: naming the file, when the manifest or the drill record beside it is missing
            (the manifest), not JSON, of a format this version cannot read, or lacks a field.
    """
    path = join(checkpoint_dir, MANIFEST_NAME)
    raw = _read_beside(checkpoint_dir, MANIFEST_NAME, storage_options)
    if raw is None:
        raise ManifestError(f"{path}: no manifest, so this is not a committed checkpoint")
    data = parse_document(raw, MANIFEST_DOCUMENT, path, ManifestError)
    try:
        manifest = Manifest.from_dict(data)
    except (KeyError, TypeError) as err:
        raise ManifestError(f"{path}: manifest lacks a required field ({err})") from err
    drill = _read_beside(checkpoint_dir, DRILL_RECORD_NAME, storage_options)
    if drill is not None:
        where = join(checkpoint_dir, DRILL_RECORD_NAME)
        recorded = parse_document(drill, DRILL_RECORD_DOCUMENT, where, ManifestError)
        if not isinstance(recorded["restore_tested"], bool) or not isinstance(recorded["record"], dict):
            raise ManifestError(f"{where}: restore_tested must be true or false and record an object")
        # A record left by an earlier checkpoint of the same name (an object store overwrites a prefix
        # in place) is not this one's.
        if recorded["record"].get("created_unix") == manifest.created_unix:
            manifest.restore_tested, manifest.restore_drill = recorded["restore_tested"], recorded["record"]
    return manifest


def write_drill_record(
    checkpoint_dir: str | os.PathLike[str],
    record: dict[str, Any],
    passed: bool,
    storage_options: StorageOptions | None = None,
) -> None:
    """Record a restore drill of a committed checkpoint beside its manifest, which stays as its commit
    wrote it: atomically in a local folder, in one PUT under a URL."""
    document = {"format": DRILL_RECORD_FORMAT, "restore_tested": passed, "record": record}
    data = json.dumps(document, indent=2, sort_keys=True, default=str).encode()
    location = join(checkpoint_dir, DRILL_RECORD_NAME)
    if isinstance(location, Path):
        atomic_write_bytes(location, data)
        return
    fs, inner = open_fs(location, storage_options)
    fs.pipe_file(inner, data)


def _read_beside(checkpoint_dir: str | os.PathLike[str], name: str, options: StorageOptions | None) -> bytes | None:
    """The bytes of ``name`` in the checkpoint folder, or None where there is no such file."""
    path = join(checkpoint_dir, name)
    try:
        if isinstance(path, Path):
            return path.read_bytes()
        fs, inner = open_fs(path, options)
        return bytes(fs.cat_file(inner))
    except (FileNotFoundError, NotADirectoryError):  # NotADirectory: a file given as the checkpoint
        return None


def is_checkpoint_dir(path: str | os.PathLike[str], storage_options: StorageOptions | None = None) -> bool:
    if is_url(path):
        fs, inner = open_fs(os.fspath(path), storage_options)
        return bool(fs.isfile(f"{inner.rstrip('/')}/{MANIFEST_NAME}"))
    return (Path(path) / MANIFEST_NAME).is_file()
