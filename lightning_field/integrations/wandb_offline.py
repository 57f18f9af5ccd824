"""Reading what wandb really wrote: the ``.wandb`` transaction log of an offline (or synced) run,
so tests and users can check a run without a server."""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# ---------------------------------------------------------------------------------------------- reading .wandb files
# wandb's transaction log is a LevelDB log: a 7-byte file header (":W&B", magic 0xBEE1, version 0),
# then 32 KiB blocks of records, each a 7-byte header (CRC-32 of type byte + payload, length, type)
# and a payload; a protobuf Record that does not fit is split into FIRST/MIDDLE/LAST fragments, and
# a block's tail shorter than a header is zero padding. wandb 0.31 has no Python reader for it
# (the datastore module went with the Go core), so this is one.
_LOG_IDENT = b":W&B"
_LOG_MAGIC = 0xBEE1
_LOG_VERSION = 0
_BLOCK = 32768
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
_TYPE_CRC = [zlib.crc32(bytes([kind])) for kind in range(_LAST + 1)]


class _Torn:
    """Set when a log ends in a partial or corrupt record (the writer was killed mid-write)."""

    def __init__(self) -> None:
        self.torn = False


def _iter_records(path: Path, torn: _Torn) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2  # wandb's protobufs load only to read a .wandb log

    with open(path, "rb") as f:
        header = f.read(_HEADER)
        if len(header) < _HEADER or header[:4] != _LOG_IDENT:
            raise ValueError(f"{path}: not a W&B transaction log (.wandb file): bad header {header[:7]!r}")
        magic, version = struct.unpack("<HB", header[4:])
        if magic != _LOG_MAGIC or version != _LOG_VERSION:
            raise ValueError(f"{path}: unsupported .wandb format (magic {magic:#x}, version {version})")
        block, pos = header + f.read(_BLOCK - _HEADER), _HEADER
        fragments: bytearray | None = None
        while True:
            if _BLOCK - pos < _HEADER:  # the block is used up, or its tail is padding
                block, pos = f.read(_BLOCK), 0
            if pos >= len(block):
                break
            if len(block) - pos < _HEADER:
                torn.torn = True
                return
            crc, length, kind = struct.unpack("<IHB", block[pos : pos + _HEADER])
            if crc == 0 and length == 0 and kind == 0:  # padding: the rest of this block is empty
                block, pos = f.read(_BLOCK), 0
                continue
            payload = block[pos + _HEADER : pos + _HEADER + length]
            if kind > _LAST or len(payload) < length or zlib.crc32(payload, _TYPE_CRC[kind]) != crc:
                torn.torn = True
                return
            pos += _HEADER + length
            if kind == _FULL:
                fragments, data = None, payload
            elif kind == _FIRST:
                fragments = bytearray(payload)
                continue
            elif fragments is None:  # a MIDDLE or LAST without its FIRST
                torn.torn = True
                return
            else:
                fragments += payload
                if kind == _MIDDLE:
                    continue
                data, fragments = bytes(fragments), None
            # The generated protobuf module builds its message classes at import time, unseen by mypy.
            record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]  # generated at import time
            record.ParseFromString(data)
            yield record
        if fragments is not None:
            torn.torn = True


def _set_nested(target: dict[str, Any], item: Any, value: Any) -> None:
    keys = list(item.nested_key) or [item.key]
    for key in keys[:-1]:
        child = target.get(key)
        if not isinstance(child, dict):
            child = target[key] = {}
        target = child
    target[keys[-1]] = value


def _remove_nested(target: dict[str, Any], item: Any) -> None:
    keys = list(item.nested_key) or [item.key]
    for key in keys[:-1]:
        child = target.get(key)
        if not isinstance(child, dict):
            return
        target = child
    target.pop(keys[-1], None)


def _item_value(item: Any) -> Any:
    if item.value_json:
        return json.loads(item.value_json)
    kind = item.WhichOneof("value") if "value" in item.DESCRIPTOR.oneofs_by_name else None
    if kind is None or kind == "none":
        return None
    value = getattr(item, kind)
    return json.loads(value) if kind == "json" else value


def _apply(target: dict[str, Any], record: Any) -> None:
    for item in record.update:
        _set_nested(target, item, _item_value(item))
    for item in record.remove:
        _remove_nested(target, item)


def _find_log_file(path: Path) -> Path:
    if path.is_file():
        return path
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such .wandb file or offline run directory")
    files = sorted(path.glob("*.wandb"))
    if len(files) != 1:
        found = "none" if not files else ", ".join(f.name for f in files)
        raise ValueError(f"{path}: expected one .wandb file in this run directory, found {found}")
    return files[0]


def read_offline_run(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What wandb wrote for one run segment: a ``.wandb`` file or the ``offline-run-*`` folder holding it.

    Returns ``run_id``, ``project``, ``entity``, ``name``, ``group``, ``tags``, ``notes``,
    ``start_time``; ``config`` and ``summary`` (final values, wandb's ``_wandb`` key left out);
    ``history`` (every row, ``_step`` included) and ``steps`` (their ``_step`` values); ``artifacts``
    (``name``, ``type``, ``aliases``, ``digest``, ``metadata``, ``files``); ``exit_code`` (None without an
    exit record: the writer died) and ``complete``; ``torn`` when the file ends in a damaged record.

    Read a run after its process exited or called ``wandb.teardown()``: in wandb 0.31 ``run.finish()``
    returns before wandb's service process has written the last records to the file.
    """
    file = _find_log_file(Path(path))
    torn = _Torn()
    out: dict[str, Any] = {
        "path": os.fspath(file),
        "run_id": None,
        "project": None,
        "entity": None,
        "name": None,
        "group": None,
        "tags": [],
        "notes": None,
        "start_time": None,
        "config": {},
        "summary": {},
        "history": [],
        "steps": [],
        "artifacts": [],
        "exit_code": None,
        "complete": False,
        "torn": False,
    }
    config: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    for record in _iter_records(file, torn):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            out.update(
                run_id=run.run_id or out["run_id"],
                project=run.project or out["project"],
                entity=run.entity or out["entity"],
                name=run.display_name or out["name"],
                group=run.run_group or out["group"],
                tags=list(run.tags) or out["tags"],
                notes=run.notes or out["notes"],
            )
            if run.HasField("start_time"):
                out["start_time"] = run.start_time.seconds + run.start_time.nanos / 1e9
            _apply(config, run.config)
            _apply(summary, run.summary)
        elif kind == "config":
            _apply(config, record.config)
        elif kind == "summary":
            _apply(summary, record.summary)
        elif kind == "history":
            row: dict[str, Any] = {}
            for item in record.history.item:
                _set_nested(row, item, _item_value(item))
            if record.history.HasField("step"):
                row["_step"] = record.history.step.num
            out["history"].append(row)
        elif kind == "artifact":
            artifact = record.artifact
            out["artifacts"].append(
                {
                    "name": artifact.name,
                    "type": artifact.type,
                    "aliases": list(artifact.aliases),
                    "digest": artifact.digest,
                    "metadata": json.loads(artifact.metadata) if artifact.metadata else {},
                    "files": [entry.path for entry in artifact.manifest.contents],
                }
            )
        elif kind == "exit":
            out["exit_code"] = record.exit.exit_code
            out["complete"] = True
    config.pop("_wandb", None)
    summary.pop("_wandb", None)
    out["config"], out["summary"] = config, summary
    out["steps"] = [row["_step"] for row in out["history"] if "_step" in row]
    out["torn"] = torn.torn
    return out


def last_history_step(segments: list[Path]) -> int | None:
    """The largest ``_step`` any earlier segment wrote (newest segment with history first)."""
    for segment in reversed(segments):
        steps = [
            record.history.step.num
            for file in sorted(segment.glob("*.wandb"))
            for record in _iter_records(file, _Torn())
            if record.HasField("history")
        ]
        if steps:
            return max(steps)
    return None
