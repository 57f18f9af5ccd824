"""The one W&B run of a training run: its identity file and its offline segments.

Lightning's ``WandbLogger`` loses a requeued job's W&B run: the run id lives only in the dead
process, so the restart opens a new run whose history starts at step 0 (Lightning #13524, #4935).
The id is therefore fixed *before* the first ``fit`` and kept beside the checkpoints in
``<run_dir>/field/wandb.json``; every restart continues it. Each attempt writes its offline files
into its own ``<run_dir>/wandb/attempt-<N>/`` (offline segments of one id overwrite each other when
synced, wandb #3841), which ``field wandb sync`` merges in order.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import string
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from lightning_field.core.documents import DocumentFormat, parse_document
from lightning_field.core.events import process_start_unix, read_events
from lightning_field.core.fsio import atomic_write_bytes
from lightning_field.core.launcher_env import env_global_rank
from lightning_field.core.layout import WANDB_RELPATH
from lightning_field.state.secrets import scrub_secrets

SEGMENTS_DIRNAME = "wandb"
"""Under the run directory: one ``attempt-<N>`` folder of wandb files per attempt."""
FORMAT = "lightning_field.wandb/1"
"""The format of ``field/wandb.json``, the run's W&B identity beside the event log: the one thing a
restart needs to continue the run."""
IDENTITY_DOCUMENT = DocumentFormat(title="W&B identity", current=FORMAT, readable=(FORMAT,), required=("run_id",))

_ID_ALPHABET = string.ascii_lowercase + string.digits
_SEGMENT_DIR = re.compile(r"^attempt-(\d+)$")
_OFFLINE_RUN_DIR = re.compile(r"^offline-run-(\d{8}_\d{6})-(.+)$")


# ---------------------------------------------------------------------------------------------- identity
def env_global_zero() -> bool:
    """Whether this process is global rank 0, from the environment alone (the Trainer may not exist
    yet): ``core.distributed.env_global_rank`` says which variables count, and in which order."""
    return env_global_rank() == 0


def new_run_id() -> str:
    """8 lowercase alphanumerics, the form wandb itself generates (ids are unique per project)."""
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(8))


def read_wandb_identity(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The run's ``field/wandb.json`` (run id, project, segments), or None when the run has none.

    Raises ValueError for a file that exists but is not a readable identity, because guessing a new
    id there would silently split the run in two.
    """
    path = Path(run_dir) / WANDB_RELPATH
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise _unreadable_identity(f"{path}: {IDENTITY_DOCUMENT.title} cannot be read ({err})") from err
    data = parse_document(text, IDENTITY_DOCUMENT, path, _unreadable_identity)
    if not data["run_id"]:
        raise _unreadable_identity(f"{path}: {IDENTITY_DOCUMENT.title} has an empty run_id")
    data.setdefault("segments", [])
    return data


def _unreadable_identity(message: str) -> ValueError:
    return ValueError(f"{message}; an unreadable W&B identity: fix or delete it to start a new W&B run")


def write_identity(run_dir: Path, identity: Mapping[str, Any]) -> None:
    path = run_dir / WANDB_RELPATH
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, (json.dumps(identity, indent=2, sort_keys=True) + "\n").encode())


def scrub_config(config: Any) -> dict[str, Any]:
    """The config as plain data with secrets redacted (``state.secrets.scrub_secrets``, the same rule
    the manifests use), so nothing secret reaches W&B, whose config is visible to everyone on the project."""
    if config is None:
        return {}
    if isinstance(config, (DictConfig, ListConfig)):
        config = OmegaConf.to_container(config, resolve=True, throw_on_missing=False)
    if not isinstance(config, Mapping):
        # Lightning's converter takes a Namespace; imported here, as `field wandb sync` reads identities only.
        from lightning_field.compat.lightning import convert_params

        config = convert_params(config)
    scrubbed = scrub_secrets(config)
    if not isinstance(scrubbed, dict):
        raise TypeError(f"config must be a mapping (dict, DictConfig or Namespace), got {type(config).__name__}")
    return scrubbed


def event_log_attempt(run_dir: Path) -> int:
    """The attempt number ``EventLog`` will give this process, without opening it (opening appends an
    ``attempt_start``, and the callbacks that open it later pass the world size this logger cannot know)."""
    events = read_events(run_dir)
    starts = [e for e in events if e.get("event") == "attempt_start"]
    ended = {e.get("attempt") for e in events if e.get("event") == "attempt_end"}
    started = process_start_unix()
    for event in reversed(starts):
        payload = event.get("payload", {})
        then = payload.get("process_start_unix")
        same = payload.get("pid") == os.getpid() and (then is None or started is None or abs(then - started) < 1.0)
        if same and event.get("attempt") not in ended:
            return int(event["attempt"])
    return len(starts) + 1


# ---------------------------------------------------------------------------------------------- segments
def offline_segments(run_dir: str | os.PathLike[str], run_id: str | None = None) -> list[Path]:
    """Every offline run directory wandb wrote for this run, in attempt order (then start time).

    ``run_id`` (default: the one in ``wandb.json``) filters out folders of other runs.
    """
    run_dir = Path(run_dir)
    if run_id is None:
        identity = read_wandb_identity(run_dir)
        run_id = identity["run_id"] if identity else None
    found: list[tuple[int, str, Path]] = []
    root = run_dir / SEGMENTS_DIRNAME
    for attempt_dir in root.glob("attempt-*") if root.is_dir() else []:
        match = _SEGMENT_DIR.match(attempt_dir.name)
        if not match:
            continue
        for run_path in (attempt_dir / "wandb").glob("offline-run-*"):
            named = _OFFLINE_RUN_DIR.match(run_path.name)
            if named and (run_id is None or named.group(2) == run_id) and any(run_path.glob("*.wandb")):
                found.append((int(match.group(1)), named.group(1), run_path))
    return [path for _, _, path in sorted(found)]


def segment_attempts(run_dir: Path, identity: Mapping[str, Any]) -> list[int]:
    numbers = {int(s["attempt"]) for s in identity.get("segments", []) if "attempt" in s}
    root = run_dir / SEGMENTS_DIRNAME
    for attempt_dir in root.glob("attempt-*") if root.is_dir() else []:
        match = _SEGMENT_DIR.match(attempt_dir.name)
        if match:
            numbers.add(int(match.group(1)))
    return sorted(numbers)
