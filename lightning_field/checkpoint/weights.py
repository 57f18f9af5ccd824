"""The model's full weights out of any committed checkpoint, verified first: what ``load_weights``
returns and ``field ckpt export`` writes.

An unsharded checkpoint holds them in ``state.pt`` (``checkpoint["state_dict"]``); a sharded one
spreads them over DCP's ``.distcp`` files, one piece per rank. Here both come back as one full state
dict on the CPU, in one process with no process group: every file that is read is hashed against
the manifest first (and the manifest's signature checked, where a key is set), DCP's ``.metadata``
is built by the unpickler that knows only DCP's records, tensors load with ``weights_only``, and the
non-tensor entries of a DCP checkpoint, which DCP's own planner would fully unpickle, go through the
same untrusted load as ``state.pt``.
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import ReadItem

from lightning_field.checkpoint.load import LOCAL_FILES
from lightning_field.checkpoint.safe_load import (
    UnsafeCheckpointError,
    check_dcp_metadata,
    load_untrusted,
    torch_load_untrusted,
)
from lightning_field.checkpoint.sharded import DCP_METADATA
from lightning_field.checkpoint.sharded_load import dcp_files
from lightning_field.checkpoint.stores import checkpoint_location, describe_error, read_manifest, store_for
from lightning_field.checkpoint.verify import CheckpointCorruptError, refuse_misnamed, verify_against
from lightning_field.core.errors import CheckpointError
from lightning_field.core.manifest import SHARED_STATE_FILE
from lightning_field.core.storage import Location, StorageOptions

COMPILE_SEGMENT = "_orig_mod"
"""The attribute ``torch.compile``'s wrapper keeps the original module under: a segment of every key below it."""

MODEL_KEY = "state_dict"
"""Where a Lightning checkpoint keeps the LightningModule's ``state_dict``, and the DCP entry of a sharded one."""


class UnreadableWeightsError(CheckpointError, RuntimeError):
    """A checkpoint whose files verify, but whose model weights cannot be read from them."""


@dataclass
class ModelWeights:
    """A checkpoint's model ``state_dict`` and where it came from."""

    state_dict: dict[str, Any]
    step: int
    location: Location
    sharded: bool
    renamed: int = 0
    """How many keys ``strip_prefixes`` / ``strip_compile_prefix`` changed."""


def read_model_weights(
    path: str | os.PathLike[str],
    map_location: Any = "cpu",
    trust_pickles: bool = False,
    *,
    strip_prefixes: Iterable[str] = (),
    strip_compile_prefix: bool = False,
    storage_options: StorageOptions | None = None,
) -> ModelWeights:
    """The full model ``state_dict`` of the committed checkpoint at ``path`` (a local directory or an
    fsspec URL), sharded (DCP) or not, verified before a byte of it is loaded.

    ``strip_prefixes``: each removed, in order, from the start of every key that has it (a prefix no key
    has is refused: a typo would otherwise export unchanged keys). ``strip_compile_prefix``: every
    ``_orig_mod.`` segment removed, so a module compiled with ``torch.compile`` loads into the plain one.
    ``map_location``: as ``torch.load``'s; a sharded checkpoint is assembled on the CPU and then moved to
    it, so there it must be a device.

    Raises:
        ManifestError: the manifest is missing or malformed.
        CheckpointCorruptError: its name states another step, a file needed does not match the manifest,
            or the manifest's signature is refused.
        UnsafeCheckpointError: a file would need a full unpickle (nothing of it was run).
        UnreadableWeightsError: the verified files hold no model weights that can be read.
        ValueError: a prefix matches no key, or two keys become one.
    """
    location = checkpoint_location(path)  # an advertised <name>.ckpt: its folder
    store = store_for(location, storage_options)
    manifest = read_manifest(location, store=store)
    refuse_misnamed(location, manifest)
    sharded = SHARED_STATE_FILE not in manifest.files
    if sharded and DCP_METADATA not in manifest.files:
        raise UnreadableWeightsError(
            f"checkpoint {location} holds neither {SHARED_STATE_FILE} nor a sharded model ({DCP_METADATA}):"
            f" its files are {', '.join(sorted(manifest.files)) or 'none'}"
        )
    needed = dcp_files(manifest) if sharded else [SHARED_STATE_FILE]
    with store.local_copy(location, needed) as local:
        # What is loaded is exactly what was hashed: the checkpoint itself on a local disk, else the download.
        report = verify_against(manifest, LOCAL_FILES, local, needed)
        if not report.intact:
            raise CheckpointCorruptError(
                f"checkpoint {location} failed verification:\n  " + "\n  ".join(report.problems)
            )
        if sharded:
            check_dcp_metadata(local / DCP_METADATA, manifest.files, trust_pickles)
            state = _assemble_dcp_model(local, location, trust_pickles)
            state = _moved(state, map_location)
        else:
            state = _model_state_of(
                torch_load_untrusted(local / SHARED_STATE_FILE, map_location, trust_pickles), location
            )
    stripped, renamed = strip_keys(state, strip_prefixes, strip_compile_prefix)
    return ModelWeights(stripped, manifest.step, location, sharded, renamed)


def _model_state_of(checkpoint: Any, location: Location) -> dict[str, Any]:
    state = checkpoint.get(MODEL_KEY) if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict):
        held = ", ".join(sorted(map(str, checkpoint))) if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise UnreadableWeightsError(
            f"checkpoint {location}: {SHARED_STATE_FILE} holds no model {MODEL_KEY!r} (it holds: {held}); a"
            " Checkpointer checkpoint of your own loop keeps each object under the name you gave it"
        )
    return state


class _UntrustedBytesPlanner(dcp.DefaultLoadPlanner):
    """DCP's default load planner over a flat state dict, except for non-tensor entries: DCP's own
    ``load_bytes`` unpickles them with ``weights_only=False``, which would run whatever a writer of the
    checkpoint put there; here they load as untrusted input, as ``state.pt`` does."""

    def __init__(self, shown: Location, trust_pickles: bool) -> None:
        # Flat: the keys are DCP's own flattened names, so no nesting of ours can disagree with its metadata.
        super().__init__(flatten_state_dict=False)
        self._shown = shown
        self._trust_pickles = trust_pickles
        # Kept apart, not put into the planner's state dict: DCP hands back the caller's dict, which the
        # planner's own (re-flattened) copy is not.
        self.non_tensors: dict[str, Any] = {}

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn

        def load(**kwargs: Any) -> Any:
            value.seek(0)  # a refused weights-only attempt has read it; trust_pickles reads it again
            return torch.load(value, map_location="cpu", **kwargs)

        self.non_tensors[fqn] = load_untrusted(load, f"{self._shown} (DCP entry {fqn})", self._trust_pickles)


def _assemble_dcp_model(local: Path, shown: Location, trust_pickles: bool) -> dict[str, Any]:
    """The model entries of the DCP checkpoint in ``local``, every shard's piece put in place in one
    full tensor per entry, in this process (no process group, even where one is running)."""
    reader = dcp.FileSystemReader(local)
    metadata = reader.read_metadata()  # its bytes were hashed and passed check_dcp_metadata
    wanted = _model_entries(metadata, shown)
    try:
        flat = {fqn: _placeholder(metadata.state_dict_metadata[fqn]) for fqn in wanted}
        planner = _UntrustedBytesPlanner(shown, trust_pickles)
        with warnings.catch_warnings():
            # dcp.load says it assumes a single process when there is no process group: that is the intent.
            warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
            dcp.load(flat, storage_reader=reader, planner=planner, no_dist=True)
        flat.update(planner.non_tensors)
    except dcp.CheckpointException as wrapped:  # DCP wraps what its steps raised, per rank (here one)
        cause = next((failure[0] for failure in wrapped.failures.values()), wrapped)
        if isinstance(cause, UnsafeCheckpointError):
            raise cause from None
        raise UnreadableWeightsError(
            f"checkpoint {shown}: its DCP shards cannot be read: {describe_error(cause)}"
        ) from None
    except (RuntimeError, ValueError, OSError, MemoryError) as err:  # an entry the metadata describes impossibly
        raise UnreadableWeightsError(
            f"checkpoint {shown}: its DCP shards cannot be read: {describe_error(err)}"
        ) from err
    state: dict[str, Any] = {}
    for fqn, path in wanted.items():
        _put(state, path, flat[fqn])
    return state


def _model_entries(metadata: Metadata, shown: Location) -> dict[str, tuple[Any, ...]]:
    """DCP's flattened names of the model's entries, each with its path in the saved tree
    (``("state_dict", "net.0.weight")``): a module's keys hold dots, so only DCP's own record splits them."""
    mappings = metadata.planner_data if isinstance(metadata.planner_data, dict) else {}
    wanted = {
        fqn: tuple(path)
        for fqn, path in mappings.items()
        if isinstance(path, (tuple, list))
        and len(path) >= 2
        and path[0] == MODEL_KEY
        and fqn in metadata.state_dict_metadata
    }
    if not wanted:
        raise UnreadableWeightsError(
            f"checkpoint {shown}: its DCP metadata names no {MODEL_KEY!r} entries (it holds:"
            f" {', '.join(sorted({str(p[0]) for p in mappings.values() if p})) or 'no named entries'})"
        )
    return wanted


def _placeholder(storage: Any) -> Any:
    """What DCP loads an entry into: a CPU tensor of the saved size and dtype, or nothing for bytes."""
    if isinstance(storage, TensorStorageMetadata):
        return torch.empty(storage.size, dtype=storage.properties.dtype)
    if isinstance(storage, BytesStorageMetadata):
        return None
    raise ValueError(f"an entry of an unknown kind ({type(storage).__name__})")


def _put(state: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    """``value`` at ``path`` below the model entry: a module's keys are one level, nested dicts (an
    ``_extra_state`` dict) more."""
    target = state
    for part in path[1:-1]:
        target = target.setdefault(part, {})
    target[path[-1]] = value


def _moved(state: dict[str, Any], map_location: Any) -> dict[str, Any]:
    if map_location is None or str(map_location) == "cpu":
        return state
    if not isinstance(map_location, (str, torch.device)):
        raise ValueError(
            f"a sharded checkpoint is assembled on the CPU: map_location must be a device, not {map_location!r}"
        )
    return {key: value.to(map_location) if isinstance(value, torch.Tensor) else value for key, value in state.items()}


def strip_keys(
    state: dict[str, Any], prefixes: Iterable[str] = (), compile_prefix: bool = False
) -> tuple[dict[str, Any], int]:
    """``state`` with each of ``prefixes`` removed, in order, from the start of every key that has it,
    then (``compile_prefix``) every ``_orig_mod`` segment removed; returns it and how many keys changed.

    Raises:
        ValueError: a prefix no key has at its turn, or two keys that become the same.
    """
    prefixes = [p for p in prefixes if p]
    if not prefixes and not compile_prefix:
        return state, 0
    keys = {key: key for key in state}
    for prefix in prefixes:
        if not any(now.startswith(prefix) for now in keys.values()):
            starts = sorted({now.split(".", 1)[0] + "." for now in keys.values()})
            raise ValueError(
                f"no key starts with {prefix!r} (the keys start with {', '.join(starts[:8]) or 'nothing'})"
            )
        keys = {key: now.removeprefix(prefix) for key, now in keys.items()}
    if compile_prefix:
        keys = {key: ".".join(s for s in now.split(".") if s != COMPILE_SEGMENT) for key, now in keys.items()}
    renamed: dict[str, Any] = {}
    first: dict[str, str] = {}
    for key, now in keys.items():
        if not now or now in first:
            clash = f"{first[now]!r} and {key!r} both become {now!r}" if now else f"{key!r} becomes empty"
            raise ValueError(f"stripping the prefixes would lose a key: {clash}")
        first[now] = key
        renamed[now] = state[key]
    return renamed, sum(key != now for key, now in keys.items())
