"""Provenance: which code, config, data, model and environment produced a checkpoint.

Recorded in the manifest so a resume into a different run is refused with a readable diff instead
of silently continuing somebody else's experiment. Secrets never enter it.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import os
import platform
import random
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lightning_field._version import __version__
from lightning_field.core.hashing import IDENTITY_ALGORITHM, new_hasher
from lightning_field.core.manifest import CodeProvenance, ConfigProvenance, DataProvenance, ModelProvenance
from lightning_field.state.provenance_compare import stable_hash
from lightning_field.state.rng import capture_rng_state, restore_rng_state
from lightning_field.state.secrets import scrub_secrets
from lightning_field.state.streams import stream_manifest


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.decode(errors="replace")


def _git_diff_hash(cwd: Path) -> str | None:
    """Hash of ``git diff HEAD``, streamed so a large diff costs time, not memory; None when clean."""
    try:
        proc = subprocess.Popen(["git", "diff", "HEAD"], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    except OSError:
        return None
    hasher = new_hasher(IDENTITY_ALGORITHM)
    seen = 0
    assert proc.stdout is not None
    with proc.stdout:
        while chunk := proc.stdout.read(1 << 20):
            hasher.update(chunk)
            seen += len(chunk)
    proc.wait()
    return hasher.hexdigest() if seen and proc.returncode == 0 else None


def source_dir(obj: Any) -> str | None:
    """The folder that defines the class of ``obj`` (a LightningModule): where the user's code is."""
    try:
        return str(Path(inspect.getfile(type(obj))).resolve().parent)
    except (TypeError, OSError):
        return None


def lightning_version() -> str | None:
    """Lightning's version: the imported package's own where this process runs it, else the installed
    distribution's (a loop without a Trainer records it without importing Lightning), else None."""
    module = sys.modules.get("lightning")
    if module is not None:
        return str(module.__version__)
    try:
        return importlib.metadata.version("lightning")
    except importlib.metadata.PackageNotFoundError:
        return None


def code_provenance(source: str | os.PathLike[str] | None = None, model: Any = None) -> CodeProvenance:
    """Versions of the stack and, when the user's code is in git, the commit and a hash of its diff.

    The code is found in this order: ``source`` if given; else the git repository of the folder that
    defines ``model``'s class, then of the main script, then of the working directory. The model's
    own folder comes first so that every entry point (a console script in a venv's ``bin``,
    ``python -m``, the user's own script or Hydra app) names the same code for the same model.
    """

    info: CodeProvenance = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning_field": __version__,
    }
    lightning = lightning_version()
    if lightning is not None:
        info["lightning"] = lightning
    if source is not None:
        candidates = [source]
    else:
        main = getattr(sys.modules.get("__main__"), "__file__", None)
        candidates = [c for c in (source_dir(model) if model is not None else None, main, os.getcwd()) if c]
    for candidate in candidates:
        where = Path(candidate).resolve()
        where = where if where.is_dir() else where.parent
        commit = _git(["rev-parse", "HEAD"], where)
        if commit:
            diff_hash = _git_diff_hash(where)
            info["git_commit"] = commit.strip()
            info["git_dirty"] = diff_hash is not None
            info["git_diff_hash"] = diff_hash
            break
    return info


# Trainer arguments that say how long a run goes or how it is watched, not which trajectory it
# follows: changing them must not make the resume check refuse the run's own checkpoints.
TRAINER_NOT_TRAJECTORY = (
    "max_steps",
    "max_epochs",
    "max_time",
    "limit_val_batches",
    "val_check_interval",
    "check_val_every_n_epoch",
    "log_every_n_steps",
    "enable_progress_bar",
    "enable_model_summary",
    "default_root_dir",
    "enable_checkpointing",
    "callbacks",
    "logger",
)
TRAJECTORY_SECTIONS = ("model", "data", "seed", "trainer", "strategy")


def trajectory_config(resolved: Mapping[str, Any]) -> dict[str, Any]:
    """The one view of a composed config that defines the training trajectory: the model, the data,
    the seed, the trainer's trajectory arguments and a configured strategy object.

    ``field-train`` records it in every manifest (so the resume check compares it), ``field-evidence``
    records the same view in its runs' manifests, and ``field evidence check`` and the release record
    compare those hashes: one view, so a checkpoint and the evidence about it agree when, and only
    when, they describe the same training. How a run is watched, stored or interrupted (callbacks,
    loggers, paths, fault drills, run names) is not part of it.
    """
    view: dict[str, Any] = {}
    for key in TRAJECTORY_SECTIONS:
        value = resolved.get(key)
        if key == "strategy" and not (isinstance(value, Mapping) and value.get("_target_")):
            continue  # a strategy named by trainer.strategy is already in the trainer's arguments
        if value is None:
            continue
        if key == "trainer" and isinstance(value, Mapping):
            value = {k: v for k, v in value.items() if k not in TRAINER_NOT_TRAJECTORY}
        view[key] = value
    return view


def config_provenance(config: Any) -> ConfigProvenance:
    resolved = scrub_secrets(config if config is not None else {})
    return {"resolved": resolved, "hash": stable_hash(resolved)}


def _sample_bytes(sample: Any) -> bytes:
    if isinstance(sample, torch.Tensor):
        return sample.detach().cpu().contiguous().numpy().tobytes()
    if isinstance(sample, Mapping):
        return b"".join(_sample_bytes(v) for _, v in sorted(sample.items(), key=lambda kv: str(kv[0])))
    if isinstance(sample, (list, tuple)):
        return b"".join(_sample_bytes(v) for v in sample)
    if hasattr(sample, "tobytes"):
        return sample.tobytes()
    return repr(sample).encode()


def data_provenance(datamodule: Any, train_loader: Any) -> DataProvenance:
    """The datamodule's own ``fingerprint()`` if it has one, else the dataset's type, length and a few
    samples; for a stream also what it reads (``streams.stream_manifest``: shards, library, workers).

    Sampling three fixed indices keeps this cheap for large datasets while still catching a swapped
    or regenerated dataset. Random transforms would make sample bytes unstable, so those are hashed
    with every RNG pinned.
    """
    own = getattr(datamodule, "fingerprint", None)
    if callable(own):
        return {"source": "datamodule.fingerprint", "fingerprint": str(own())}
    dataset = getattr(train_loader, "dataset", None)
    if dataset is None:
        return {"source": "none", "fingerprint": None}
    info: DataProvenance = {"source": "sampled", "type": f"{type(dataset).__module__}.{type(dataset).__qualname__}"}
    try:
        length = len(dataset)
    except TypeError:
        length = None
    info["length"] = length
    if length and hasattr(dataset, "__getitem__"):
        saved = capture_rng_state()
        try:
            h = new_hasher(IDENTITY_ALGORITHM)
            for index in sorted({0, length // 2, length - 1}):
                random.seed(index)
                np.random.seed(index)
                torch.manual_seed(index)
                h.update(_sample_bytes(dataset[index]))
            info["sample_hash"] = h.hexdigest()
        except Exception as err:  # a dataset that cannot be indexed still gets a fingerprint
            info["sample_hash"] = None
            info["sample_error"] = f"{type(err).__name__}: {err}"
        finally:
            restore_rng_state(saved)
    info["fingerprint"] = stable_hash({k: v for k, v in info.items() if k != "source"})
    stream = stream_manifest(train_loader)
    if stream is not None:
        # Compared shard by shard on resume; outside the fingerprint, so that an allowed shard
        # change (ResumeConfig(allow_mismatch=["data.stream..."])) is not refused again through it.
        info["stream"] = stream
    return info


# Up to this many tensors, a manifest lists every name and shape, so that a resume into a changed
# model can say what changed; beyond it (rare, and large) only the hash is kept.
MAX_LISTED_SHAPES = 4096


def architecture_shapes(state_dict: Mapping[str, Any]) -> dict[str, list[int]]:
    """Name -> shape of every tensor in a model state dict (global shapes for DTensors)."""
    return {k: list(v.shape) for k, v in state_dict.items() if isinstance(v, torch.Tensor)}


def model_provenance(state_dict: Mapping[str, Any]) -> ModelProvenance:
    """Parameter count, dtypes, and an architecture hash from state-dict keys and shapes (not values)."""
    shapes = architecture_shapes(state_dict)
    dtypes = sorted({str(v.dtype) for v in state_dict.values() if isinstance(v, torch.Tensor)})
    count = sum(int(v.numel()) for v in state_dict.values() if isinstance(v, torch.Tensor))
    info: ModelProvenance = {"parameters": count, "dtypes": dtypes, "architecture_hash": stable_hash(shapes)}
    if len(shapes) <= MAX_LISTED_SHAPES:
        info["shapes"] = shapes
    return info


def architecture_differences(saved: Mapping[str, Any], current: Mapping[str, list[int]], limit: int = 8) -> list[str]:
    """What changed between a checkpoint's model (its manifest's ``provenance.model``) and the current
    model's shapes: tensors added, removed and reshaped; empty when the architecture is the same."""
    if saved.get("architecture_hash") in (None, stable_hash(dict(current))):
        return []
    before = saved.get("shapes")
    if not isinstance(before, Mapping):
        return ["the architecture hash differs (the checkpoint lists no shapes to compare)"]
    found = [f"added {k} {current[k]}" for k in current if k not in before]
    found += [f"removed {k} {before[k]}" for k in before if k not in current]
    found += [f"reshaped {k}: {before[k]} -> {current[k]}" for k in current if k in before and before[k] != current[k]]
    shown = found[:limit]
    if len(found) > limit:
        shown.append(f"... and {len(found) - limit} more")
    return shown


def environment_provenance(trainer: Any) -> dict[str, Any]:
    devices = []
    if torch.cuda.is_available():
        devices = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {
        "host": socket.gethostname(),
        "accelerator": type(trainer.accelerator).__name__,
        "devices": devices,
        "num_nodes": trainer.num_nodes,
        "precision": str(trainer.precision),
        "strategy": type(trainer.strategy).__name__,
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
    }
