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
from typing import Any, TypedDict

from lightning_field.core.documents import DocumentFormat, check_envelope, parse_document
from lightning_field.core.errors import CheckpointError
from lightning_field.core.fsio import atomic_write_bytes
from lightning_field.core.hashing import HASH_ALGORITHM
from lightning_field.core.manifest_records import (
    SnapshotIntervalRecord,
    StopRecord,
    TrainerSettings,
    lineage_problem,
    snapshot_interval_problem,
    stop_record_problem,
)
from lightning_field.core.member_paths import member_name_problem
from lightning_field.core.signing import ManifestKeys, canonical_bytes
from lightning_field.core.storage import Location, StorageOptions

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


class CodeProvenance(TypedDict, total=False):
    """The stack's versions and, when the user's code is in git, its commit and a hash of its diff."""

    python: str
    torch: str
    lightning: str
    lightning_field: str
    git_commit: str
    git_dirty: bool
    git_diff_hash: str | None


class ConfigProvenance(TypedDict, total=False):
    resolved: Any  # the run's resolved configuration, secrets redacted
    hash: str


class DataProvenance(TypedDict, total=False):
    source: str  # "datamodule.fingerprint", "sampled" or "none"
    fingerprint: str | None
    type: str
    length: int | None
    sample_hash: str | None
    sample_error: str
    stream: dict[str, Any]  # a streamed dataset's shards, library and workers
    # Under reload_dataloaders_every_n_epochs: the epoch the fingerprinted train loaders were built for
    # (a resume compares like with like: the loaders of the same epoch).
    loaders_epoch: int


class ModelProvenance(TypedDict, total=False):
    parameters: int
    dtypes: list[str]
    architecture_hash: str
    shapes: dict[str, list[int]]


class Provenance(TypedDict, total=False):
    """Which code, config, data, model and environment produced a checkpoint (``manifest.provenance``).

    A JSON document that several versions write and read: every key is optional (an earlier
    version may lack one), a key this version does not know is kept as read, and the type checker
    checks every reader's keys against this schema.
    """

    code: CodeProvenance
    config: ConfigProvenance
    data: DataProvenance | None
    model: ModelProvenance
    environment: dict[str, Any]
    world_size: int
    resharded_from: dict[str, Any]
    inexact_resume: dict[str, Any]
    trainer: TrainerSettings
    # Each resume of this lineage that accepted a changed Trainer setting (allow_changed): the
    # checkpoint, its step and each change as [checkpoint's value, the run's value].
    changed_settings: list[dict[str, Any]]
    # The run (core/events.py) whose lineage this checkpoint is: minted at its fresh start, carried
    # by every resume, so the event log counts each resume as an attempt of that run.
    run_id: str


def rank_state_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


RANK_COMPONENTS: tuple[str, ...] = ("rng", "data_position")
"""The components every rank holds its own of, in its rank file (:func:`rank_state_file`): the state
no ``state_dict`` holds, never deduplicated across ranks."""


class ManifestError(CheckpointError, ValueError):
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
    provenance: Provenance = field(default_factory=lambda: Provenance())
    created_unix: float = field(default_factory=time.time)
    save_seconds: float | None = None
    # Set by a passing restore drill (lightning_field.evidence.RestoreDrill), with the drill's record.
    restore_tested: bool = False
    restore_drill: dict[str, Any] | None = None
    # Per rank, per train loader: how a resume restores the data position and what that costs.
    data_restore: dict[str, list[str]] = field(default_factory=dict)
    # Per rank, per stream loader: each worker's dataset position (lightning_field.state.streams).
    stream_positions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # Set on a save where training stopped (a stop point, an interrupt): why, and whether it had finished.
    stopped: StopRecord | None = None
    # The run's step snapshots at this save: asked for, the interval in force, and why (or why off).
    snapshot_interval: SnapshotIntervalRecord | None = None
    format: str = FORMAT
    hash_algorithm: str = HASH_ALGORITHM
    # A keyed MAC over the rest, set by the commit when a checkpoint key is configured (core/signing.py).
    signature: dict[str, str] | None = None
    # The canonical bytes the signature covers, as read (never written): see ``signed_content``.
    read_content: bytes | None = field(default=None, repr=False, compare=False)
    # Keys of a readable format that this version does not know (a later writer's): kept as read, and
    # written back unchanged when the manifest is rewritten, never dropped.
    unknown_fields: dict[str, Any] = field(default_factory=dict, repr=False)

    def to_json(self, compact: bool = False) -> str:
        """The manifest as written: indented for people to read, or ``compact`` (step snapshots, one a
        step: the indented form takes json's pure-Python encoder, several times slower)."""
        # Not dataclasses.asdict: it deep-copies the provenance (the whole resolved config) per save.
        data = {name: getattr(self, name) for name in self.__dataclass_fields__ if name not in _NOT_WRITTEN}
        data["files"] = {name: asdict(entry) for name, entry in self.files.items()}
        data.update(self.unknown_fields)
        if data["signature"] is None:
            del data["signature"]  # an unsigned manifest reads exactly as earlier versions wrote it
        if compact:
            return json.dumps(data, sort_keys=True, default=str, separators=(",", ":"))
        return json.dumps(data, indent=2, sort_keys=True, default=str)

    def signed_content(self) -> bytes:
        """What a signature covers: the manifest as it was read (unknown keys included), else as it
        would be written."""
        return self.read_content if self.read_content is not None else canonical_bytes(json.loads(self.to_json()))

    def sign(self, keys: ManifestKeys | None) -> None:
        """Sign, at the commit, with the configured key; nothing without one."""
        self.signature, self.read_content = None, None  # what is signed is what will be written
        if keys is not None:
            self.signature = keys.sign(self.signed_content())

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
        known = set(cls.__dataclass_fields__) - {"unknown_fields", "read_content"}
        unknown = {k: v for k, v in payload.items() if k not in known}
        return cls(**{k: v for k, v in payload.items() if k in known}, unknown_fields=unknown)

    def write(self, directory: Path, durable: bool = True, compact: bool = False) -> None:
        atomic_write_bytes(directory / MANIFEST_NAME, self.to_json(compact).encode(), durable)


_NOT_WRITTEN = frozenset({"read_content", "unknown_fields"})


def manifest_from_bytes(raw: bytes | None, where: Location, drill: bytes | None, drill_where: Location) -> Manifest:
    """A manifest from its bytes (None: there is none), with the restore drill's record beside it
    (``drill``: the bytes of ``restore_drill.json``, or None) applied when it is this commit's.

    Raises:
        ManifestError: naming the file, when the manifest is missing, either document is not JSON,
            of a format this version cannot read, or lacks a field.
    """
    if raw is None:
        raise ManifestError(f"{where}: no manifest, so this is not a committed checkpoint")
    data = parse_document(raw, MANIFEST_DOCUMENT, where, ManifestError)
    _check_file_entries(data["files"], where)
    _check_fields(data, where)
    try:
        manifest = Manifest.from_dict(data)
    except (KeyError, TypeError) as err:
        raise ManifestError(f"{where}: manifest lacks a required field ({err})") from err
    except ManifestError as err:
        raise ManifestError(f"{where}: {err}") from None
    manifest.read_content = canonical_bytes(data)
    if drill is not None:
        recorded = parse_document(drill, DRILL_RECORD_DOCUMENT, drill_where, ManifestError)
        if not isinstance(recorded["restore_tested"], bool) or not isinstance(recorded["record"], dict):
            raise ManifestError(f"{drill_where}: restore_tested must be true or false and record an object")
        # A record left by an earlier checkpoint of the same name (an object store overwrites a prefix
        # in place) is not this one's.
        if recorded["record"].get("created_unix") == manifest.created_unix:
            manifest.restore_tested, manifest.restore_drill = recorded["restore_tested"], recorded["record"]
    return manifest


def _check_file_entries(files: Any, where: Location) -> None:
    """Every file entry well-typed and every name a plain relative path inside the checkpoint, before
    any of them reaches a store (:mod:`lightning_field.core.member_paths`)."""
    if not isinstance(files, dict):
        raise ManifestError(f"{where}: 'files' is not an object of file entries")
    for name, entry in files.items():
        if (problem := member_name_problem(name)) is not None:
            raise ManifestError(f"{where}: names {problem}, which would leave the checkpoint directory")
        if not isinstance(entry, dict):
            raise ManifestError(f"{where}: the entry of {name!r} is not an object")
        size, digest, rank = entry.get("size"), entry.get("hash"), entry.get("rank")
        if not (type(size) is int and size >= 0 and isinstance(digest, str) and type(rank) is int and rank >= 0):
            raise ManifestError(
                f"{where}: the entry of {name!r} needs a size (bytes, >= 0), a hash (text) and a rank (>= 0);"
                f" got size={size!r}, hash={digest!r}, rank={rank!r}"
            )
        if not isinstance(entry.get("contents", []), list):
            raise ManifestError(f"{where}: the contents of {name!r} are not a list")


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "step": (int,),
    "epoch": (int,),
    "world_size": (int,),
    "components": (dict,),
    "recoverable": (bool,),
    "missing": (list,),
    "kind": (str,),
    "provenance": (dict,),
    "created_unix": (int, float),
    "save_seconds": (int, float, type(None)),
    "restore_tested": (bool,),
    "restore_drill": (dict, type(None)),
    "data_restore": (dict,),
    "stream_positions": (dict,),
    "hash_algorithm": (str,),
    "signature": (dict, type(None)),
    "stopped": (dict, type(None)),
    "snapshot_interval": (dict, type(None)),
}


def _check_fields(data: dict[str, Any], where: Location) -> None:
    """Every field this version reads of the type its readers expect: a forged manifest is refused
    here, naming the field, not by a TypeError in whatever reads the field first."""
    for key, types in _FIELD_TYPES.items():
        if key not in data:
            continue
        value = data[key]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise ManifestError(f"{where}: field {key!r} is {type(value).__name__}, not {types[0].__name__}")
    for key in ("step", "epoch", "world_size"):
        if not 0 <= data[key] < 2**53:
            raise ManifestError(f"{where}: field {key!r} is {data[key]}, out of range")
    if data["world_size"] < 1:
        raise ManifestError(f"{where}: field 'world_size' is {data['world_size']}, below 1")
    if not all(isinstance(m, str) for m in data["missing"]):
        raise ManifestError(f"{where}: field 'missing' is not a list of texts")
    for component, ranks in data["components"].items():
        if not isinstance(ranks, list) or not all(type(r) is int and r >= 0 for r in ranks):
            raise ManifestError(f"{where}: component {component!r} does not list ranks")
    for problem in (
        stop_record_problem(data.get("stopped")),
        lineage_problem(data.get("provenance", {})),
        snapshot_interval_problem(data.get("snapshot_interval")),
    ):
        if problem is not None:
            raise ManifestError(f"{where}: {problem}")


def drill_record_bytes(record: dict[str, Any], passed: bool) -> bytes:
    """``restore_drill.json``'s bytes for a drill's ``record``."""
    document = {"format": DRILL_RECORD_FORMAT, "restore_tested": passed, "record": record}
    return json.dumps(document, indent=2, sort_keys=True, default=str).encode()


# The readers live with the stores (lightning_field.checkpoint.stores), which sit above this module;
# these names stay for code that imported them from here. Imported at call time for that reason.


def read_manifest(checkpoint_dir: str | os.PathLike[str], storage_options: StorageOptions | None = None) -> Manifest:
    """:func:`lightning_field.checkpoint.stores.read_manifest`."""
    from lightning_field.checkpoint import stores  # imported here: stores imports this module

    return stores.read_manifest(checkpoint_dir, storage_options)


def is_checkpoint_dir(path: str | os.PathLike[str], storage_options: StorageOptions | None = None) -> bool:
    """:func:`lightning_field.checkpoint.stores.is_checkpoint`."""
    from lightning_field.checkpoint import stores  # imported here: stores imports this module

    return stores.is_checkpoint(path, storage_options)


def write_drill_record(
    checkpoint_dir: str | os.PathLike[str],
    record: dict[str, Any],
    passed: bool,
    storage_options: StorageOptions | None = None,
) -> None:
    """:func:`lightning_field.checkpoint.stores.write_drill_record`."""
    from lightning_field.checkpoint import stores  # imported here: stores imports this module

    stores.write_drill_record(checkpoint_dir, record, passed, storage_options)
