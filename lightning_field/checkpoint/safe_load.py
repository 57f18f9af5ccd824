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
import logging
import os
import pickle
import re
import typing
from collections.abc import Callable, Iterator
from typing import Any

import torch
from lightning.fabric.utilities.data import AttributeDict
from omegaconf import DictConfig, ListConfig, base, nodes

log = logging.getLogger(__name__)

CHECKPOINT_SAFE_TYPES: tuple[Any, ...] = (
    AttributeDict,
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
"""What a Lightning checkpoint may hold beyond what ``weights_only`` allows by itself."""

TRUST_PICKLES_HINT = "ManifestCheckpoint(trust_pickles=True) (from Hydra: callbacks.checkpoint.trust_pickles=true)"


class UnsafeCheckpointError(RuntimeError):
    """A checkpoint file needs full unpickling, which could run code that whoever wrote it chose."""


def unsafe_globals(path: str | os.PathLike[str]) -> list[str]:
    """The classes and functions ``path`` names that a weights-only load would refuse, found by
    reading its pickle's opcodes, never by unpickling; ``[]`` where it needs none."""
    with allowed_types():
        return list(torch.serialization.get_unsafe_globals_in_checkpoint(os.fspath(path)))


@contextlib.contextmanager
def allowed_types() -> Iterator[None]:
    """:data:`CHECKPOINT_SAFE_TYPES` allowed for a weights-only load, only while the context lasts
    (types the user registered with ``torch.serialization.add_safe_globals`` stay allowed too)."""
    with torch.serialization.safe_globals(list(CHECKPOINT_SAFE_TYPES)):
        yield


def load_untrusted(
    load: Callable[..., Any], shown: str | os.PathLike[str], trust_pickles: bool, **kwargs: Any
) -> Any:
    """``load(weights_only=True, **kwargs)`` (``torch.load`` or a strategy's load) with the
    checkpoint types allowed; ``shown`` names the file in a refusal.

    Raises:
        UnsafeCheckpointError: the file names a type outside the allowed ones, and
            ``trust_pickles`` is off. Nothing of the file was executed.
    """
    try:
        with allowed_types():
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
    return load_untrusted(
        lambda **kw: torch.load(path, map_location=map_location, mmap=True, **kw), path, trust_pickles
    )


def refusal(shown: str | os.PathLike[str], err: BaseException) -> str:
    """Why a file is refused, with what it needs and both ways out."""
    reason = _unpickler_reason(str(err))
    match = re.search(r"GLOBAL ([\w.]+)", reason)
    named = match.group(1) if match else None
    register = f"[{named}]" if named else "[TheType]"
    return (
        f"{shown} cannot be loaded without a full unpickle ({reason}), and a full unpickle runs whatever"
        " code the file's writer chose: a checkpoint in storage others can write is never loaded that way."
        f" If {named or 'the type'} is a class of yours, safe to build from data, allow it before the load:"
        f" torch.serialization.add_safe_globals({register}). If you trust everyone who can write this"
        f" checkpoint, opt in: {TRUST_PICKLES_HINT}."
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
