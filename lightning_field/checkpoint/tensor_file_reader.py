"""Reading the raw tensor file (:mod:`~lightning_field.checkpoint.tensor_file`) as untrusted input.

Every field is checked before it is used: the header's size against the file's, each tensor's dtype
against the ones the format carries, its shape, size and offset against the bytes there are, every
tree node's tag against the few the writer emits. Nothing in the file names code, so nothing is run;
anything not as the writer writes it is a :class:`~lightning_field.checkpoint.tensor_file.TensorFileError`
naming the file.
"""

from __future__ import annotations

import base64
import json
import math
import mmap
import os
import sys
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from lightning_field.checkpoint.safe_load import ATTRIBUTE_DICT, UnsafeCheckpointError, lightning_type
from lightning_field.checkpoint.tensor_file import (
    _DTYPES,
    _MAX_DEPTH,
    _MAX_HEADER,
    _NUMPY_DTYPES,
    FORMAT,
    MAGIC,
    TensorFileError,
    _padding,
)

__all__ = ["is_tensor_file", "read_tensor_file"]


def is_tensor_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` starts as this format does (a ``torch.save`` zip starts ``PK``)."""
    with open(path, "rb") as file:
        return file.read(len(MAGIC)) == MAGIC


def read_tensor_file(path: str | os.PathLike[str], map_location: Any = None) -> Any:
    """The tree written by :func:`write_tensor_file`; tensors are backed by a private memory map of
    the file (writes to them never reach it), on the CPU or moved to ``map_location``.

    Raises:
        TensorFileError: naming ``path``, where anything in it is not as this format writes it.
    """
    shown = str(path)
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        lead = file.read(len(MAGIC) + 8)
        if len(lead) < len(MAGIC) + 8 or lead[: len(MAGIC)] != MAGIC:
            raise TensorFileError(f"{shown}: not a lightning_field tensor file (its first bytes are not {MAGIC!r})")
        length = int.from_bytes(lead[len(MAGIC) :], "little")
        if length > min(size - len(lead), _MAX_HEADER):
            raise TensorFileError(f"{shown}: its header claims {length} bytes, more than the file holds")
        try:
            header = json.loads(file.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
            raise TensorFileError(f"{shown}: its header is not JSON ({err})") from None
        data_start = len(lead) + length
        data_start += _padding(data_start)
        buffer = _mapped(file, size) if size > data_start else bytearray()
    decoder = _Decoder(shown, header, buffer, data_start, size, _device_for(map_location))
    return decoder.tree()


def _mapped(file: Any, size: int) -> Any:
    return mmap.mmap(file.fileno(), size, access=mmap.ACCESS_COPY)


def _device_for(map_location: Any) -> torch.device | None:
    if map_location is None or callable(map_location):
        return None  # a (storage, location) function: tensors stay on the CPU, where they were read
    return torch.device(map_location)


class _Decoder:
    def __init__(
        self, shown: str, header: Any, buffer: Any, data_start: int, size: int, device: torch.device | None
    ) -> None:
        self.shown, self.buffer, self.device = shown, buffer, device
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise self.error(f"its header names format {_named(header, 'format')}, not {FORMAT!r}")
        if header.get("byteorder") != sys.byteorder:
            raise self.error(f"its byte order {_named(header, 'byteorder')} is not this machine's ({sys.byteorder!r})")
        entries = header.get("tensors")
        if not isinstance(entries, list):
            raise self.error("its header lists no tensors")
        self.entries = [self._entry(index, entry, data_start, size) for index, entry in enumerate(entries)]
        self.built: dict[int, torch.Tensor] = {}
        self.root = header.get("tree")

    def error(self, what: str) -> TensorFileError:
        return TensorFileError(f"{self.shown}: {what}")

    def _entry(
        self, index: int, entry: Any, data_start: int, size: int
    ) -> tuple[torch.dtype, list[int], list[int], int]:
        if not (isinstance(entry, list) and len(entry) == 6):
            raise self.error(f"tensor {index}'s entry is not [dtype, shape, strides, offset, size, device]")
        dtype_name, shape, strides, offset, nbytes, _device = entry
        dtype = _DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None
        if dtype is None:
            raise self.error(f"tensor {index} has dtype {dtype_name!r}, which this format does not carry")
        if not (_ints(shape) and _ints(strides) and len(shape) == len(strides) and all(d >= 0 for d in shape)):
            raise self.error(f"tensor {index}'s shape {shape!r} and strides {strides!r} do not describe a tensor")
        if not (type(offset) is int and type(nbytes) is int and offset >= 0 and nbytes >= 0):
            raise self.error(f"tensor {index}'s offset {offset!r} and size {nbytes!r} are not byte counts")
        if strides != _contiguous_strides(shape) or nbytes != math.prod(shape) * dtype.itemsize:
            raise self.error(f"tensor {index}'s {nbytes} bytes with strides {strides} are not a dense {shape} tensor")
        if data_start + offset + nbytes > size:
            raise self.error(f"tensor {index} ends at byte {data_start + offset + nbytes}, past the file's {size}")
        return dtype, shape, strides, data_start + offset

    def tensor(self, index: Any) -> torch.Tensor:
        if type(index) is not int or not 0 <= index < len(self.entries):
            raise self.error(f"the tree names tensor {index!r}, which the header does not list")
        if index in self.built:
            return self.built[index]
        dtype, shape, _, offset = self.entries[index]
        count = math.prod(shape)
        if count:
            tensor = torch.frombuffer(self.buffer, dtype=dtype, count=count, offset=offset).view(shape)
        else:
            tensor = torch.empty(shape, dtype=dtype)
        if self.device is not None and self.device.type != "cpu":
            tensor = tensor.to(self.device)
        self.built[index] = tensor
        return tensor

    def tree(self) -> Any:
        try:
            return self.node(self.root, 0)
        except RecursionError:
            raise self.error("its tree is nested too deeply") from None

    def node(self, node: Any, depth: int) -> Any:
        if node is None or type(node) in (bool, int, float, str):
            return node
        if depth > _MAX_DEPTH:
            raise self.error("its tree is nested too deeply")
        if not (type(node) is list and len(node) == 2 and type(node[0]) is str):
            raise self.error(f"its tree holds {_short(node)}, not a [tag, value] node")
        tag, value = node
        build = _BUILDERS.get(tag)
        if build is None:
            raise self.error(f"its tree holds a node tagged {tag!r}, which this format does not write")
        try:
            return build(self, value, depth + 1)
        except (TensorFileError, UnsafeCheckpointError):
            raise
        except (TypeError, ValueError, KeyError, IndexError, OverflowError, AttributeError) as err:
            raise self.error(f"its {tag!r} node {_short(value)} is malformed ({err})") from None


def _pairs(decoder: _Decoder, value: Any, depth: int) -> list[tuple[Any, Any]]:
    if type(value) is not list or not all(type(p) is list and len(p) == 2 for p in value):
        raise TypeError("not a list of [key, value] pairs")
    pairs = [(decoder.node(k, depth), decoder.node(v, depth)) for k, v in value]
    for key, _ in pairs:
        hash(key)  # a list or dict as a key is refused here (TypeError)
    return pairs


def _items(decoder: _Decoder, value: Any, depth: int) -> list[Any]:
    if type(value) is not list:
        raise TypeError("not a list")
    return [decoder.node(item, depth) for item in value]


def _special_float(decoder: _Decoder, value: Any, depth: int) -> float:
    if value not in ("nan", "inf", "-inf"):
        raise ValueError("not nan, inf or -inf")
    return float(value)


def _numpy_array(decoder: _Decoder, value: Any, depth: int) -> np.ndarray:
    dtype, shape, data = value
    if dtype not in _NUMPY_DTYPES or not _ints(shape) or any(d < 0 for d in shape) or type(data) is not str:
        raise ValueError("not [dtype, shape, base64]")
    raw = base64.b64decode(data, validate=True)
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


def _numpy_scalar(decoder: _Decoder, value: Any, depth: int) -> Any:
    dtype, item = value
    if dtype not in _NUMPY_DTYPES or type(item) not in (bool, int, float):
        raise ValueError("not [dtype, value]")
    return np.dtype(dtype).type(item)


def _attribute_dict(decoder: _Decoder, value: Any, depth: int) -> Any:
    kind = lightning_type(ATTRIBUTE_DICT, import_it=True)
    if kind is None:  # a well-formed file whose type cannot be built here: refused, not called malformed
        raise UnsafeCheckpointError(
            f"{decoder.shown} holds Lightning's {ATTRIBUTE_DICT}, and Lightning is not installed here"
        )
    return kind(_pairs(decoder, value, depth))


def _dtype(decoder: _Decoder, value: Any, depth: int) -> torch.dtype:
    if value not in _DTYPES:
        raise ValueError("not a dtype this format carries")
    return _DTYPES[value]


_BUILDERS: dict[str, Callable[[_Decoder, Any, int], Any]] = {
    "T": lambda decoder, value, depth: decoder.tensor(value),
    "d": lambda decoder, value, depth: dict(_pairs(decoder, value, depth)),
    "od": lambda decoder, value, depth: OrderedDict(_pairs(decoder, value, depth)),
    "ad": _attribute_dict,
    "l": _items,
    "t": lambda decoder, value, depth: tuple(_items(decoder, value, depth)),
    "f": _special_float,
    "b": lambda decoder, value, depth: base64.b64decode(value, validate=True),
    "dt": _dtype,
    "sz": lambda decoder, value, depth: torch.Size(value) if _ints(value) else _fail("not a list of sizes"),
    "np": _numpy_array,
    "ns": _numpy_scalar,
}


def _fail(why: str) -> Any:
    raise ValueError(why)


def _ints(values: Any) -> bool:
    return type(values) is list and all(type(v) is int for v in values)


def _contiguous_strides(shape: list[int]) -> list[int]:
    strides, running = [], 1
    for dim in reversed(shape):
        strides.append(running)
        running *= max(dim, 1)
    return strides[::-1]


def _named(header: Any, key: str) -> str:
    return repr(header.get(key)) if isinstance(header, dict) else "nothing"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
