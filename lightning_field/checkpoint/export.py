"""A model's weights written for inference: one file a user's plain code loads, written atomically.

``safetensors`` (``safetensors.torch.load_file``) or ``torch`` (``torch.load(path, weights_only=True)``),
from the verified state dict of :func:`~lightning_field.checkpoint.weights.read_model_weights`. The file is
written under a hidden temporary name beside its destination, fsynced, and renamed into place: a crash or
a refusal leaves the destination as it was, never half-written.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from lightning_field.core.errors import CheckpointError
from lightning_field.core.fsio import fsync_dir

FORMATS = ("safetensors", "torch")


class ExportRefusedError(CheckpointError, ValueError):
    """The weights cannot be written in the format asked for (the reason names the keys)."""


@dataclass
class Written:
    """What an export wrote."""

    path: Path
    tensors: int
    tensor_bytes: int
    file_bytes: int
    untied: list[str]
    """Keys whose tensor shared its memory with an earlier key's (tied weights): written as copies, since
    safetensors stores every name's bytes apart and refuses shared ones."""


def write_weights(state: dict[str, Any], out: str | os.PathLike[str], fmt: str, step: int) -> Written:
    """Write ``state`` (a model ``state_dict``) to ``out`` in ``fmt``, atomically.

    Raises:
        ExportRefusedError: a value safetensors cannot hold (not a tensor, sparse), or an unknown format.
        OSError: ``out`` is a directory, its directory is missing, or the file could not be written (nothing is
            left under ``out``'s name or beside it).
    """
    if fmt not in FORMATS:
        raise ExportRefusedError(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")
    path = Path(out)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "a directory: name the file to write", str(path))
    if not path.parent.is_dir():
        # Checked first: safetensors reports a missing directory as its own serialization error.
        raise FileNotFoundError(errno.ENOENT, "its directory does not exist", str(path.parent))
    untied: list[str] = []
    if fmt == "safetensors":
        tensors, untied = _safetensors_ready(state)

        def write(tmp: Path) -> None:
            try:
                # "format": "pt" is what Hugging Face loaders check before reading a file as torch tensors.
                save_file(tensors, tmp, metadata={"format": "pt", "step": str(step)})
            except OSError:
                raise
            except Exception as err:  # safetensors' own refusal (a dtype it lacks): its words, as a refusal
                raise ExportRefusedError(f"safetensors cannot write these weights: {err}") from err
    else:
        tensors = {key: value for key, value in state.items() if isinstance(value, torch.Tensor)}

        def write(tmp: Path) -> None:
            with open(tmp, "xb") as file:
                torch.save(dict(state), file)

    _write_atomically(path, write)
    return Written(
        path=path,
        tensors=len(tensors),
        tensor_bytes=sum(t.numel() * t.element_size() for t in tensors.values()),
        file_bytes=path.stat().st_size,
        untied=untied,
    )


def _safetensors_ready(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """``state`` as safetensors takes it: dense, contiguous tensors, none sharing memory with another."""
    not_tensors = [key for key, value in state.items() if not isinstance(value, torch.Tensor)]
    sparse = [key for key, value in state.items() if isinstance(value, torch.Tensor) and value.layout != torch.strided]
    if not_tensors or sparse:
        named = ", ".join(repr(key) for key in (not_tensors + sparse)[:5])
        more = f" and {len(not_tensors) + len(sparse) - 5} more" if len(not_tensors) + len(sparse) > 5 else ""
        raise ExportRefusedError(
            f"safetensors holds only dense tensors, and the state dict has other values at {named}{more};"
            " write it with --format torch"
        )
    tensors: dict[str, torch.Tensor] = {}
    untied: list[str] = []
    seen: set[tuple[torch.device, int]] = set()
    for key, value in state.items():
        dense = value.detach().contiguous()
        storage = (dense.device, dense.untyped_storage().data_ptr())
        if dense.numel() and storage in seen:
            dense = dense.clone()
            untied.append(key)
        seen.add(storage)
        tensors[key] = dense
    return tensors, untied


def _write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """``write`` a hidden file beside ``path``, fsync it, rename it into place, fsync the directory."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # left by a crashed export of this process id
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)
