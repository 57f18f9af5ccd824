"""The raw tensor file: a checkpoint file written without pickle, for step snapshots.

``torch.save`` pickles the state: a ``persistent_id`` call per object, a zip record per tensor, and
the interpreter walking every container. For a snapshot taken every step that walk is most of its
cost (issue 39: 1.105x a step at N=1 on the main job). This format writes, as safetensors does, one
small header and then every tensor's bytes back to back, hashed in the same pass:

    b"LFTENSR1" | header length (8 bytes, little-endian) | header (JSON) | zero padding | tensor bytes

The header names the format, the byte order, every tensor (dtype, shape, strides, offset, size) and
the tree that holds them: the checkpoint's dicts, lists, tuples, numbers, strings and the few
library types a Lightning checkpoint carries (``AttributeDict``, ``torch.dtype``, ``torch.Size``,
NumPy arrays and scalars of the RNG states), each a JSON node of its own tag. Nothing in the file
names code: reading it builds only those types, so it is safe to read from storage others can
write, and a malformed file is refused naming it. A tree holding anything else (a user's own
class, an OmegaConf config) is not encodable: the writer returns ``None`` and the caller writes
that file with ``torch.save`` instead, which the reader (:mod:`~lightning_field.checkpoint.tensor_file_reader`)
tells apart by its first bytes.
"""

from __future__ import annotations

import base64
import ctypes
import json
import math
import os
import sys
from collections import OrderedDict
from concurrent.futures import Future, wait
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lightning_field.checkpoint.safe_load import ATTRIBUTE_DICT, lightning_type
from lightning_field.checkpoint.verify import CheckpointCorruptError
from lightning_field.core.hashing import new_hasher, write_hash_threads
from lightning_field.core.workers import HASHING

__all__ = ["FORMAT", "MAGIC", "TensorFileError", "write_tensor_file"]

MAGIC = b"LFTENSR1"
FORMAT = "lightning_field.tensors/1"
_ALIGN = 64
_MAX_HEADER = 256 * 1024 * 1024
_MAX_DEPTH = 100  # a Lightning checkpoint nests about 10 deep; the reader recurses per level
_COALESCE = 64 * 1024  # tensors smaller than this are gathered into one buffer: one write, one hash update
_IOV_MAX = 512

_DTYPES: dict[str, torch.dtype] = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.complex64,
        torch.complex128,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
    )
}
_NUMPY_DTYPES = frozenset(
    {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64"}
)


_SCALARS = frozenset({int, str, bool, type(None)})  # written as JSON as they are (floats may not be finite)
_HASH_BESIDE = 1024 * 1024  # files at least this large are hashed on a thread beside their write


class TensorFileError(CheckpointCorruptError):
    """A raw tensor file is malformed: named, with what is wrong; nothing of it was used."""


class _Unencodable(Exception):
    """The tree holds a value this format does not carry (the caller falls back to ``torch.save``)."""


# ---------------------------------------------------------------------------------------- writing
def _mapping_tags() -> dict[type, str]:
    """The mappings this format carries, by type: Lightning's ``AttributeDict`` only where this process
    imported Lightning, as no other process can hold one."""
    tags: dict[type, str] = {dict: "d", OrderedDict: "od"}
    attribute_dict = lightning_type(ATTRIBUTE_DICT, import_it=False)
    if attribute_dict is not None:
        tags[attribute_dict] = "ad"
    return tags


class _Encoder:
    def __init__(self) -> None:
        self.tensors: list[torch.Tensor] = []
        self._seen: dict[int, int] = {}
        self._mappings = _mapping_tags()

    def node(self, value: Any, depth: int = 0) -> Any:
        if depth > _MAX_DEPTH:
            raise _Unencodable("nested too deeply")
        kind = type(value)
        if value is None or kind in (bool, int, str):
            return value
        if kind is float:
            return value if math.isfinite(value) else ["f", repr(value)]
        if kind is torch.Tensor:
            return ["T", self._tensor(value)]
        tag = self._mappings.get(kind)
        if tag is not None:
            # Scalars inline, without a call each: a checkpoint is mostly such leaves and tensors.
            node, deeper = self.node, depth + 1
            pairs = [
                [k if type(k) in _SCALARS else node(k, deeper), v if type(v) in _SCALARS else node(v, deeper)]
                for k, v in value.items()
            ]
            return [tag, pairs]
        if kind is list or kind is tuple:
            items = [item if type(item) in _SCALARS else self.node(item, depth + 1) for item in value]
            return ["l" if kind is list else "t", items]
        if kind is bytes:
            return ["b", base64.b64encode(value).decode()]
        if kind is torch.dtype:
            return ["dt", str(value).removeprefix("torch.")]
        if kind is torch.Size:
            return ["sz", list(value)]
        if kind is np.ndarray and value.dtype.name in _NUMPY_DTYPES and value.dtype.byteorder in "=|<":
            data = np.ascontiguousarray(value)
            return ["np", [value.dtype.name, list(value.shape), base64.b64encode(data.tobytes()).decode()]]
        if isinstance(value, np.generic) and value.dtype.name in _NUMPY_DTYPES:
            return ["ns", [value.dtype.name, value.item()]]
        raise _Unencodable(f"a {kind.__module__}.{kind.__qualname__}")

    def _tensor(self, tensor: torch.Tensor) -> int:
        known = self._seen.get(id(tensor))
        if known is not None:  # the same tensor twice (tied weights): written once, read back as one
            return known
        if tensor.layout != torch.strided or tensor.is_quantized or tensor.is_nested or tensor.device.type == "meta":
            raise _Unencodable(f"a {tensor.layout} tensor")
        if str(tensor.dtype).removeprefix("torch.") not in _DTYPES:
            raise _Unencodable(f"a {tensor.dtype} tensor")
        if tensor.requires_grad:
            raise _Unencodable("a tensor that requires grad")
        self._seen[id(tensor)] = len(self.tensors)
        self.tensors.append(tensor)
        return len(self.tensors) - 1


def _host_bytes(tensor: torch.Tensor) -> tuple[memoryview, list[int], torch.Tensor]:
    """The tensor's bytes in row-major order, with the (dense) strides they are read back with, and
    the tensor that owns them (kept alive by the caller while the view is used). A permuted tensor
    comes back contiguous, with the same values (elementwise updates of optimizer state give the same
    bits either way)."""
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    nbytes = tensor.numel() * tensor.element_size()
    # A view of the tensor's own memory (a ctypes array over its pointer): ~0.5 us, where going
    # through .view(torch.uint8).numpy() costs ~3 us a tensor, ~1 ms of a snapshot's 210 tensors.
    view = memoryview((ctypes.c_ubyte * nbytes).from_address(tensor.data_ptr())) if nbytes else memoryview(b"")
    return view.cast("B"), list(tensor.stride()), tensor


def _padding(offset: int) -> int:
    return -offset % _ALIGN


def write_tensor_file(obj: Any, path: Path, durable: bool, reuse: bool = False) -> tuple[int, str] | None:
    """Write ``obj`` to ``path`` in this format, hashing every byte as it is written.

    Args:
        obj: the tree to write (a checkpoint dict).
        path: the file; created, or with ``reuse`` overwritten in place (its pages are reused: no new
            memory to fault in on tmpfs) and truncated to the new size.
        durable: fsync before returning.

    Returns:
        ``(size, hash)`` by the manifest's algorithm, or ``None`` (nothing written) where ``obj``
        holds a value this format does not carry.
    """
    encoder = _Encoder()
    try:
        tree = encoder.node(obj)
    except _Unencodable:
        return None
    views: list[memoryview] = []
    entries: list[list[Any]] = []
    offset = 0
    owners: list[torch.Tensor] = []  # host copies of device tensors, alive until written
    for tensor in encoder.tensors:
        view, strides, owner = _host_bytes(tensor)
        owners.append(owner)
        dtype = str(tensor.dtype).removeprefix("torch.")
        entries.append([dtype, list(tensor.shape), strides, offset, len(view), tensor.device.type])
        views.append(view)
        offset += len(view) + _padding(len(view))
    header = json.dumps(
        {"format": FORMAT, "byteorder": sys.byteorder, "tensors": entries, "tree": tree},
        separators=(",", ":"),
        allow_nan=False,
    ).encode()
    start = len(MAGIC) + 8 + len(header)
    prefix = MAGIC + len(header).to_bytes(8, "little") + header + bytes(_padding(start))
    data_start = len(prefix)
    segments = _segments(prefix, views)
    size = data_start + offset
    hasher = new_hasher(threads=write_hash_threads())
    beside = size >= _HASH_BESIDE  # handing a small file to a thread costs more than hashing it in line
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (0 if reuse else os.O_EXCL) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o600)
    hashing: Future[None] | None = None
    try:
        if beside:
            hashing = HASHING.submit(_hash_all, hasher, segments)  # a parked thread: see core/workers.py
        else:
            _hash_all(hasher, segments)
        _write_all(fd, segments)
        if reuse:
            os.ftruncate(fd, size)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
        if hashing is not None:
            wait([hashing])  # the tensors' bytes must outlive their hash, even when the write failed
    if hashing is not None:
        hashing.result()
    return size, hasher.hexdigest()


def _segments(prefix: bytes, views: list[memoryview]) -> list[memoryview]:
    """What is written, in order: small pieces gathered into one buffer, large tensors as they are."""
    segments: list[memoryview] = []
    small = bytearray(prefix)
    for view in views:
        pad = bytes(_padding(len(view)))
        if len(view) < _COALESCE:
            small += view
            small += pad
            continue
        if small:
            segments.append(memoryview(small))
            small = bytearray()
        segments.append(view)
        if pad:
            small += pad
    if small:
        segments.append(memoryview(small))
    return segments


def _hash_all(hasher: Any, segments: list[memoryview]) -> None:
    for segment in segments:
        hasher.update(segment)


def _write_all(fd: int, segments: list[memoryview]) -> None:
    pending = [s for s in segments if len(s)]
    while pending:
        batch = pending[:_IOV_MAX]
        written = os.writev(fd, batch)
        consumed = 0
        for view in batch:
            if written >= len(view):
                written -= len(view)
                consumed += 1
                continue
            batch[consumed] = view[written:]  # a short write: the rest of this view goes first next time
            break
        pending = batch[consumed:] + pending[len(batch) :]
