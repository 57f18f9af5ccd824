"""Checkpoint files are loaded as untrusted input: ``torch.load(weights_only=True)``, always.

A hash proves that a file matches its manifest, not who wrote the manifest: anyone who can write
the checkpoint directory (a shared bucket, a shared filesystem) can rewrite both together, and a
full unpickle of their file runs their code on every rank that resumes. So nothing here unpickles
arbitrary objects. The types a Lightning checkpoint legitimately holds beyond tensors and plain
containers (Lightning's ``AttributeDict`` hparams, OmegaConf configs saved by
``save_hyperparameters``) are allowed for the load, not process-wide; a type a user's module or
callback saves can be allowed with ``torch.serialization.add_safe_globals``. A file that still
needs anything else is refused, naming the types, unless the user opted into ``trust_pickles``.
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import logging
import os
import pickle
import re
import sys
import typing
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from omegaconf import DictConfig, ListConfig, base, nodes

from lightning_field.core.errors import CheckpointError
from lightning_field.core.member_paths import member_name_problem

log = logging.getLogger(__name__)

CHECKPOINT_SAFE_TYPES: tuple[Any, ...] = (
    DictConfig,
    ListConfig,
    base.ContainerMetadata,
    base.Metadata,
    nodes.AnyNode,
    nodes.StringNode,
    nodes.IntegerNode,
    nodes.FloatNode,
    nodes.BooleanNode,
    nodes.BytesNode,
    nodes.PathNode,
    # OmegaConf records each node's declared type: these are the types themselves, never called
    # with data (the weights-only unpickler still refuses to call anything not allowed).
    typing.Any,
    dict,
    list,
    int,
    float,
    str,
    bool,
    bytes,
    collections.defaultdict,
)
"""What a Lightning checkpoint may hold beyond what ``weights_only`` allows by itself (Lightning's own
types too: :data:`LIGHTNING_SAFE_TYPES`)."""

ATTRIBUTE_DICT = "lightning.fabric.utilities.data.AttributeDict"
"""Lightning's container of ``save_hyperparameters``' values."""

LIGHTNING_SAFE_TYPES: tuple[str, ...] = (ATTRIBUTE_DICT,)
"""Lightning's types a checkpoint may hold (``save_hyperparameters``' container), by name: allowed from
Lightning itself where this process imported it, else imported when a file names one, so the core's
loads never import Lightning for files that hold none of them."""

TRUST_PICKLES_HINT = (
    "ManifestCheckpoint(resume=ResumeConfig(trust_pickles=True))"
    " (from Hydra: callbacks.checkpoint.resume.trust_pickles=true)"
)


class UnsafeCheckpointError(CheckpointError, RuntimeError):
    """A checkpoint file needs full unpickling, which could run code that whoever wrote it chose."""


def lightning_type(qualified: str, import_it: bool) -> Any:
    """One of Lightning's types, by its qualified name: from its module where this process imported it
    (or ``import_it``, where Lightning is installed), else None. Only a process that imported Lightning
    can hold one, so a writer asks without importing; a reader imports it when a file names it."""
    module_name, _, name = qualified.rpartition(".")
    module = sys.modules.get(module_name)
    if module is None and import_it:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # Lightning is not installed: the file stays refused, naming the type
            return None
    return getattr(module, name, None)


@contextlib.contextmanager
def allowed_types(named: str = "") -> Iterator[None]:
    """:data:`CHECKPOINT_SAFE_TYPES` allowed for a weights-only load, only while the context lasts
    (types the user registered with ``torch.serialization.add_safe_globals`` stay allowed too), and
    those of :data:`LIGHTNING_SAFE_TYPES` already imported or ``named`` (an earlier refusal's text)."""
    lightning = [lightning_type(qualified, qualified in named) for qualified in LIGHTNING_SAFE_TYPES]
    with torch.serialization.safe_globals([*CHECKPOINT_SAFE_TYPES, *(t for t in lightning if t is not None)]):
        yield


def _names_a_missing_lightning_type(refusal: str) -> bool:
    """Whether the unpickler refused a global of :data:`LIGHTNING_SAFE_TYPES` that was not allowed
    because Lightning was not imported yet (a retry with it imported may load the file)."""
    return any(
        lightning_type(qualified, import_it=False) is None and re.search(rf"GLOBAL {re.escape(qualified)}\b", refusal)
        for qualified in LIGHTNING_SAFE_TYPES
    )


def load_untrusted(load: Callable[..., Any], shown: str | os.PathLike[str], trust_pickles: bool, **kwargs: Any) -> Any:
    """``load(weights_only=True, **kwargs)`` (``torch.load`` or a strategy's load) with the
    checkpoint types allowed; ``shown`` names the file in a refusal.

    Raises:
        UnsafeCheckpointError: the file names a type outside the allowed ones, and
            ``trust_pickles`` is off. Nothing of the file was executed.
    """
    try:
        try:
            with allowed_types():
                return load(weights_only=True, **kwargs)
        except pickle.UnpicklingError as err:
            if not _names_a_missing_lightning_type(str(err)):
                raise
            with allowed_types(named=str(err)):  # a type of Lightning's, not imported yet
                return load(weights_only=True, **kwargs)
    except pickle.UnpicklingError as err:
        if not trust_pickles:
            raise UnsafeCheckpointError(refusal(shown, err)) from None
        log.warning("%s needs full unpickling; loading it because trust_pickles=True", shown)
        return load(weights_only=False, **kwargs)


def torch_load_untrusted(path: str | os.PathLike[str], map_location: Any = None, trust_pickles: bool = False) -> Any:
    """One checkpoint file, as :func:`load_untrusted` says.

    The file is memory-mapped (``mmap=True``): verification has just read it into the page cache,
    so tensors are backed by those pages instead of being copied out of them a second time, and the
    copy into the model's own parameters is the only one. (Pages are private: writes to a loaded
    tensor never reach the file, and the mapping outlives a later deletion of the checkpoint.)
    """
    # Step snapshots are raw tensor files (checkpoint/tensor_file.py): no pickle at all to refuse.
    from lightning_field.checkpoint.tensor_file_reader import is_tensor_file, read_tensor_file

    if is_tensor_file(path):
        return read_tensor_file(path, map_location)
    return load_untrusted(
        lambda **kw: torch.load(path, map_location=map_location, mmap=True, **kw), path, trust_pickles
    )


def refusal(shown: str | os.PathLike[str], err: BaseException, registrable: bool = True) -> str:
    """Why a file is refused, with what it needs and the ways out (registering the type where
    ``registrable``: torch's allow-list applies to ``torch.load``, not to DCP's metadata)."""
    reason = _unpickler_reason(str(err))
    match = re.search(r"GLOBAL ([\w.]+)", reason)
    named = match.group(1) if match else None
    register = f"[{named}]" if named else "[TheType]"
    return (
        f"{shown} cannot be loaded without a full unpickle ({reason}), and a full unpickle runs whatever"
        " code the file's writer chose: a checkpoint in storage others can write is never loaded that way."
        + (
            f" If {named or 'the type'} is a class of yours, safe to build from data, allow it before the load:"
            f" torch.serialization.add_safe_globals({register})."
            if registrable
            else ""
        )
        + f" If you trust everyone who can write this checkpoint, opt in: {TRUST_PICKLES_HINT}."
    )


def _unpickler_reason(message: str) -> str:
    """The weights-only unpickler's own words from torch's message ("Unsupported global: GLOBAL
    a.b.C was not an allowed global", "Can only SETITEMS for dict ..."), which is the only place
    torch reports what it refused, without the advice around them (which suggests the full unpickle)."""
    marker = "WeightsUnpickler error:"
    if marker in message:
        return re.split(r"\n\n|\. Please ", message.split(marker, 1)[1].strip(), maxsplit=1)[0].strip().rstrip(".")
    boilerplate = ("Weights only load failed", "Check the documentation", "Please file an issue")
    paragraphs = [p.strip() for p in message.split("\n\n") if p.strip()]
    kept = [p.removeprefix("WeightsUnpickler error:").strip() for p in paragraphs if not p.startswith(boilerplate)]
    return " ".join(kept).rstrip(".") or "the unpickler gave no reason"


# What torch DCP's ``.metadata`` pickle names (torch.distributed.checkpoint.metadata and the
# filesystem reader's storage records); DCP itself reads it with a plain ``pickle.load``.
_DCP_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath"},
    "collections": {"OrderedDict"},
}


class _DcpMetadataUnpickler(pickle.Unpickler):
    """Builds only DCP's metadata records: a pickle can call nothing it cannot name, and every name
    goes through :meth:`find_class`."""

    def find_class(self, module: str, name: str) -> Any:
        if name in _DCP_CLASSES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"Unsupported global: GLOBAL {module}.{name} is not part of DCP's metadata")


def check_dcp_metadata(path: os.PathLike[str], listed: Iterable[str], trust_pickles: bool) -> None:
    """Before DCP unpickles ``path`` (a sharded checkpoint's ``.metadata``): it must build from DCP's
    own record types alone, and every file it points reads at must be one the manifest lists
    (``listed``), so hashed, and a plain name inside the checkpoint.

    Raises:
        UnsafeCheckpointError: naming the file and what it holds or points at.
    """
    if trust_pickles:
        return
    try:
        with open(path, "rb") as raw:
            metadata = _DcpMetadataUnpickler(raw).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError) as err:
        raise UnsafeCheckpointError(refusal(path, pickle.UnpicklingError(str(err)), registrable=False)) from None
    known = set(listed)
    for info in dict(getattr(metadata, "storage_data", None) or {}).values():
        name = getattr(info, "relative_path", None)
        if member_name_problem(name) is not None or name not in known:
            raise UnsafeCheckpointError(
                f"{path} points reads at {name!r}, which is not a file of this checkpoint's manifest:"
                " a forged .metadata could make DCP read outside the verified files"
            )
