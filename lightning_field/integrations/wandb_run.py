"""Weights & Biases for runs that are killed and restarted: one W&B run per training run.

Lightning's ``WandbLogger`` loses a requeued job's W&B run: the run id lives only in the dead
process, so the restart opens a new run whose history starts at step 0 (Lightning #13524, #4935).
Its ``log_model=True`` uploads checkpoints only at the end of a successful ``fit``, so a preempted
run has none (#20425). Offline runs cannot be resumed, and offline segments of one id overwrite
each other when synced (wandb #3841). This module fixes each of those where it starts:

* ``FieldWandbLogger`` fixes the run id *before* the first ``fit`` and keeps it beside the
  checkpoints in ``<run_dir>/field/wandb.json``; every restart continues that run. Each attempt
  writes its offline files into its own ``<run_dir>/wandb/attempt-<N>/``, and an offline segment
  numbers its history rows after the previous segment's, so ``field wandb sync`` can merge them
  into one run in order instead of letting them overwrite each other.
* ``WandbReview`` logs each committed ``ManifestCheckpoint`` as a ``checkpoint-manifest`` artifact
  when it is committed (not at the end), and writes the run's time to quality, goodput,
  interruptions and straggler findings into the W&B summary at the end of every attempt.
* ``read_offline_run`` reads back what wandb really wrote (the ``.wandb`` transaction log), so
  tests and users can check a run without a server.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import secrets
import string
import struct
import time
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities.rank_zero import rank_zero_only, rank_zero_warn
from typing_extensions import override

from lightning_field.checkpoint.manifest_checkpoint import ManifestCheckpoint
from lightning_field.checkpoint.observe import CommitWatcher, find_manifest_checkpoint
from lightning_field.checkpoint.preemption import TrainingPreempted
from lightning_field.compat import wandb as wandb_compat
from lightning_field.compat.lightning import convert_params
from lightning_field.core.events import process_start_unix, read_events, read_jsonl
from lightning_field.core.fsio import atomic_write_bytes
from lightning_field.core.hashing import bytes_digest
from lightning_field.core.layout import PROFILE_RELPATH, WANDB_RELPATH
from lightning_field.core.manifest import MANIFEST_NAME, Manifest, ManifestError, is_checkpoint_dir, read_manifest
from lightning_field.profiling.straggler import StragglerMonitor
from lightning_field.quality.ledger import BUCKETS, goodput_ledger
from lightning_field.quality.time_to_quality import TimeToQuality, quality_summary
from lightning_field.state.secrets import scrub_secrets

log = logging.getLogger(__name__)

"""The run's W&B identity, beside the event log: the one thing a restart needs to continue the run."""
SEGMENTS_DIRNAME = "wandb"
"""Under the run directory: one ``attempt-<N>`` folder of wandb files per attempt."""
FORMAT = "lightning_field.wandb/1"
MANIFEST_ARTIFACT_TYPE = "checkpoint-manifest"
CHECKPOINT_ARTIFACT_TYPE = "checkpoint"
EVIDENCE_ARTIFACT_TYPE = "evidence"
TRANSACTION_LOG_FLUSH_S = 1.0
"""How often wandb writes its buffered records to the ``.wandb`` file. wandb 0.31's default is 15 s,
so a SIGKILL lost up to 15 s of history *and* the artifact records of the checkpoints saved in
that window; 1 s costs one small ``write`` per second."""

_ID_ALPHABET = string.ascii_lowercase + string.digits
_SEGMENT_DIR = re.compile(r"^attempt-(\d+)$")
_OFFLINE_RUN_DIR = re.compile(r"^offline-run-(\d{8}_\d{6})-(.+)$")
_ARTIFACT_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_OWNED_INIT_ARGS = ("id", "version", "resume", "dir", "save_dir", "mode", "log_model")


# ---------------------------------------------------------------------------------------------- identity
def _env_global_zero() -> bool:
    """Whether this process is global rank 0, from the environment alone (the Trainer may not exist yet).

    Lightning's DDP launcher sets ``LOCAL_RANK`` in the processes it starts and nothing in rank 0's
    own process; torchrun and SLURM set ``RANK`` / ``SLURM_PROCID``. ``LOCAL_RANK`` is read before
    ``SLURM_PROCID`` (as Lightning does) because one SLURM task can launch several local ranks, and a
    node rank counts when no global rank is set (node 1's first process has ``LOCAL_RANK=0``).
    """
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        value = os.environ.get(key)
        if value is not None:
            if int(value) != 0:
                return False
            if key == "RANK":
                return True
            break
    node = os.environ.get("NODE_RANK") or os.environ.get("GROUP_RANK")
    return node is None or int(node) == 0


def _new_run_id() -> str:
    """8 lowercase alphanumerics, the form wandb itself generates (ids are unique per project)."""
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(8))


def read_wandb_identity(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The run's ``field/wandb.json`` (run id, project, segments), or None when the run has none.

    Raises ValueError for a file that exists but is not a readable identity, because guessing a new
    id there would silently split the run in two.
    """
    path = Path(run_dir) / WANDB_RELPATH
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: unreadable W&B identity ({err}); fix or delete it to start a new W&B run") from err
    if not isinstance(data, dict) or data.get("format") != FORMAT or not data.get("run_id"):
        raise ValueError(f"{path}: not a {FORMAT} identity (no run_id); fix or delete it to start a new W&B run")
    data.setdefault("segments", [])
    return data


def _write_identity(run_dir: Path, identity: Mapping[str, Any]) -> None:
    path = run_dir / WANDB_RELPATH
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, (json.dumps(identity, indent=2, sort_keys=True) + "\n").encode())


def scrub_config(config: Any) -> dict[str, Any]:
    """The config as plain data with secrets redacted (``state.secrets.scrub_secrets``, the same rule
    the manifests use), so nothing secret reaches W&B, whose config is visible to everyone on the project."""
    if config is None:
        return {}
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(config, (DictConfig, ListConfig)):
            config = OmegaConf.to_container(config, resolve=True, throw_on_missing=False)
    except ImportError:  # hydra-core is a dependency, but a bare install of the logger need not have it
        pass
    scrubbed = scrub_secrets(convert_params(config) if not isinstance(config, Mapping) else config)
    if not isinstance(scrubbed, dict):
        raise TypeError(f"config must be a mapping (dict, DictConfig or Namespace), got {type(config).__name__}")
    return scrubbed


def _event_log_attempt(run_dir: Path) -> int:
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


def _segment_attempts(run_dir: Path, identity: Mapping[str, Any]) -> list[int]:
    numbers = {int(s["attempt"]) for s in identity.get("segments", []) if "attempt" in s}
    root = run_dir / SEGMENTS_DIRNAME
    for attempt_dir in root.glob("attempt-*") if root.is_dir() else []:
        match = _SEGMENT_DIR.match(attempt_dir.name)
        if match:
            numbers.add(int(match.group(1)))
    return sorted(numbers)


def _last_history_step(segments: list[Path]) -> int | None:
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


# ---------------------------------------------------------------------------------------------- the logger
class FieldWandbLogger(WandbLogger):
    """Lightning's ``WandbLogger`` with a run identity that survives requeues, kills and offline mode.

    Args:
        run_dir: the training run's directory, the same on every restart (normally the Trainer's
            ``default_root_dir``, where the event log and checkpoints live). Required: Lightning creates
            the W&B run in ``Trainer.fit`` *before* any callback sees ``default_root_dir``, and the run
            id must be known before the run is created; guessing a directory (the working directory,
            a timestamped Hydra folder) would start a new W&B run on restart, the bug this class fixes.
        project, name, entity, group, tags, notes: as in ``wandb.init``.
        offline: True writes offline segments for ``field wandb sync``; False logs online; None
            follows ``WANDB_MODE`` / ``wandb offline``.
        log_checkpoints: with ``WandbReview``, also log each committed checkpoint's files (type
            "checkpoint"). wandb hashes (MD5) and copies every file in the training process, so this
            costs a second full read and copy of each checkpoint; the manifest alone is always logged.
        config: the composed run config to log (a dict, ``DictConfig`` or ``Namespace``); secrets are
            redacted with the manifests' rule before anything leaves the process.
        **kwargs: other ``wandb.init`` arguments (``job_type``, ``settings``...). ``id``, ``resume``,
            ``dir`` and ``mode`` are this class's to set.

    Only global rank 0 creates or writes the identity, and only it creates a W&B run.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str] | None = None,
        project: str = "lightning-field",
        name: str | None = None,
        entity: str | None = None,
        group: str | None = None,
        tags: list[str] | None = None,
        notes: str | None = None,
        offline: bool | None = None,
        log_checkpoints: bool = False,
        config: Mapping[str, Any] | Any | None = None,
        **kwargs: Any,
    ) -> None:
        if run_dir is None:
            raise ValueError(
                "FieldWandbLogger needs run_dir: the training run's directory, the same on every restart (usually"
                " the Trainer's default_root_dir). The W&B run id is kept there so a requeued job continues the"
                " same W&B run; Lightning creates the run before any callback sees default_root_dir."
            )
        owned = sorted(set(kwargs) & set(_OWNED_INIT_ARGS))
        if owned:
            raise ValueError(
                f"FieldWandbLogger sets {', '.join(owned)} itself (the run id is kept in <run_dir>/{WANDB_RELPATH},"
                " each attempt gets its own directory); pass run_dir and offline instead"
            )
        self.run_dir = Path(run_dir)
        self.offline = offline
        self.log_checkpoints = log_checkpoints
        self.logged_config = scrub_config(config)
        identity = self._load_identity(project, entity)
        self.run_id: str | None = identity["run_id"] if identity else None
        self.attempt: int | None = None
        self.segment_dir: Path | None = None
        self.step_offset: int | None = None
        self._pending_segment: dict[str, Any] | None = None
        super().__init__(
            name=name,
            save_dir=os.fspath(self.run_dir),
            id=self.run_id,
            project=project,
            offline=False,  # WandbLogger's offline=True rewrites os.environ["WANDB_MODE"]; mode is passed instead
            log_model=False,  # it would upload a checkpoint *directory* as a file, and only on success
            entity=entity,
            group=group,
            tags=list(tags) if tags is not None else None,
            notes=notes,
            config=self.logged_config,
            **kwargs,
        )
        init = wandb_compat.init_arguments(self)
        if init.get("anonymous") is None:
            del init["anonymous"]  # wandb 0.31 warns that the setting is deprecated, even as None

    def _load_identity(self, project: str, entity: str | None) -> dict[str, Any] | None:
        identity = read_wandb_identity(self.run_dir)
        if not _env_global_zero():
            return identity  # rank 0 wrote it before launching the other ranks; they only read it
        if identity is None:
            identity = {
                "format": FORMAT,
                "run_id": _new_run_id(),
                "project": project,
                "entity": entity,
                "created_unix": time.time(),
                "segments": [],
            }
            _write_identity(self.run_dir, identity)
        elif identity.get("project") != project:
            rank_zero_warn(
                f"{self.run_dir / WANDB_RELPATH} was written for W&B project {identity.get('project')!r}; logging"
                f" to {project!r} continues run id {identity['run_id']} as a separate run in that project"
            )
        return identity

    @property
    @override
    def save_dir(self) -> str:
        """The run directory, not the attempt's: Lightning puts default checkpoint paths under it, and
        those must not move between attempts or ``ckpt_path="last"`` would find nothing."""
        return os.fspath(self.run_dir)

    @property  # type: ignore[misc]
    @override
    @rank_zero_experiment
    def experiment(self) -> Any:
        """The W&B run; created on first use as a new segment of this run's one W&B run."""
        if wandb_compat.run_pending(self):
            self._prepare_segment()
        run = super().experiment
        pending, self._pending_segment = self._pending_segment, None
        if pending is not None:
            self._start_segment(run, pending)
        return run

    def _prepare_segment(self) -> None:
        import wandb

        if wandb.run is not None:
            if wandb.run.id != self.run_id:
                raise RuntimeError(
                    f"A W&B run ({wandb.run.id}) is already active in this process, and FieldWandbLogger would log"
                    f" into it instead of this training run's W&B run {self.run_id}. Call wandb.finish() first."
                )
            return  # the same run, still open in this process: WandbLogger reuses it
        identity = read_wandb_identity(self.run_dir)
        if identity is None:  # deleted since construction: start again rather than log to a run nobody can find
            init = wandb_compat.init_arguments(self)
            identity = self._load_identity(init["project"], init.get("entity"))
            assert identity is not None
        self.run_id = identity["run_id"]
        wandb_compat.set_run_id(self, self.run_id)
        earlier = _segment_attempts(self.run_dir, identity)
        self.attempt = max(_event_log_attempt(self.run_dir), (earlier[-1] + 1) if earlier else 1)
        last_step = _last_history_step(offline_segments(self.run_dir, self.run_id))
        self.step_offset = last_step + 1 if last_step is not None else 0
        self.segment_dir = self.run_dir / SEGMENTS_DIRNAME / f"attempt-{self.attempt}"
        self.segment_dir.mkdir(parents=True, exist_ok=True)
        segment = {
            "attempt": self.attempt,
            "dir": os.path.relpath(self.segment_dir, self.run_dir),
            "pid": os.getpid(),
            "started_unix": time.time(),
            "step_offset": self.step_offset,
        }
        # Recorded before wandb.init, so an attempt killed during start-up still takes its number.
        identity["segments"].append(segment)
        _write_identity(self.run_dir, identity)
        init = wandb_compat.init_arguments(self)
        settings = init.get("settings")
        if settings is None:
            settings = {}
        if isinstance(settings, dict) and "x_transaction_log_flush_interval" in wandb.Settings.model_fields:
            settings = {"x_transaction_log_flush_interval": TRANSACTION_LOG_FLUSH_S, **settings}
        init.update(id=self.run_id, resume="allow", dir=os.fspath(self.segment_dir), settings=settings)
        if self.offline is not None:
            init["mode"] = "offline" if self.offline else "online"
        self._pending_segment = segment

    def _start_segment(self, run: Any, segment: dict[str, Any]) -> None:
        offline = bool(getattr(run, "offline", False))
        marker = {"field/attempt": segment["attempt"]}
        if offline and self.step_offset:
            # An offline segment cannot ask the server where the run's history ended, so wandb numbers
            # its rows from 0 again, and replaying them after the previous segment repeats `_step` values
            # the run already has (the overwrite of wandb #3841, #5865). Starting one past the previous
            # segment's last row keeps the merged history in order, whatever the server does with a
            # regressing step. The marker merges into this segment's first logged row.
            run.log(marker, step=self.step_offset, commit=False)
        else:
            run.log(marker, commit=False)
        mode = "disabled" if getattr(run, "disabled", False) else "offline" if offline else "online"
        identity = read_wandb_identity(self.run_dir)
        if identity is not None:
            for entry in identity["segments"]:
                if entry.get("attempt") == segment["attempt"] and entry.get("pid") == segment["pid"]:
                    entry["mode"] = mode
                    if mode != "disabled":
                        entry["wandb_dir"] = getattr(run, "dir", None)
            _write_identity(self.run_dir, identity)

    @override
    @rank_zero_only
    def log_hyperparams(self, params: Any) -> None:
        """Lightning logs the module's and datamodule's hparams here: redacted like the config."""
        super().log_hyperparams(scrub_config(params))

    @rank_zero_only
    def mark_preempted(self) -> None:
        """This attempt ends in a preemption: Lightning's ``finalize("failed")`` that follows is
        recorded as ``preempted``, and W&B is told the run is preempting (not crashed)."""
        self._preempted = True
        run = wandb_compat.current_run(self)
        if run is not None and hasattr(run, "mark_preempting"):
            with contextlib.suppress(Exception):  # reporting must not turn a safe stop into a crash
                run.mark_preempting()

    @override
    @rank_zero_only
    def finalize(self, status: str) -> None:
        if getattr(self, "_preempted", False) and status == "failed":
            status = "preempted"
        super().finalize(status)
        if self.attempt is None:
            return
        identity = read_wandb_identity(self.run_dir)
        if identity is None:
            return
        for entry in identity["segments"]:
            if entry.get("attempt") == self.attempt and entry.get("pid") == os.getpid():
                entry.update(status=status, finalized_unix=time.time())
        _write_identity(self.run_dir, identity)


# ---------------------------------------------------------------------------------------------- the review callback
def _find_wandb_logger(trainer: pl.Trainer) -> WandbLogger | None:
    loggers = [lg for lg in trainer.loggers if isinstance(lg, WandbLogger)]
    return next((lg for lg in loggers if isinstance(lg, FieldWandbLogger)), loggers[0] if loggers else None)


def _artifact_name(prefix: str, key: str) -> str:
    return _ARTIFACT_NAME_UNSAFE.sub("_", f"{prefix}-{key}")


def _files_digest(manifest: Manifest) -> str:
    """One hash over every file's name and hash: equal digests mean identical checkpoint bytes."""
    lines = "".join(f"{name}\t{entry.hash}\n" for name, entry in sorted(manifest.files.items()))
    return bytes_digest(lines.encode())


def manifest_metadata(manifest: Manifest, path: str | os.PathLike[str]) -> dict[str, Any]:
    """What a ``checkpoint-manifest`` artifact says about its checkpoint, searchable in W&B."""
    code = manifest.provenance.get("code", {}) or {}
    return {
        "checkpoint": manifest.name,
        "path": os.fspath(path),
        "step": manifest.step,
        "epoch": manifest.epoch,
        "kind": manifest.kind,
        "recoverable": manifest.recoverable,
        "missing": list(manifest.missing),
        "restore_tested": manifest.restore_tested,
        "world_size": manifest.world_size,
        "hash_algorithm": manifest.hash_algorithm,
        "files": {name: {"size": e.size, "hash": e.hash, "rank": e.rank} for name, e in sorted(manifest.files.items())},
        "files_digest": _files_digest(manifest),
        "config_hash": (manifest.provenance.get("config") or {}).get("hash"),
        "git_commit": code.get("git_commit"),
        "git_dirty": code.get("git_dirty"),
        "save_seconds": manifest.save_seconds,
        "created_unix": manifest.created_unix,
        "format": manifest.format,
    }


def field_summary(
    run_dir: str | os.PathLike[str],
    quality: Mapping[str, Any] | None = None,
    straggler: StragglerMonitor | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """The ``field/`` summary of a run, from what it left on disk (all attempts) and live callbacks.

    * Time to quality, whenever ``TimeToQuality`` ran in any attempt (its ``run_start`` event): the
      ``field/time_to_target_*`` keys are always present and null until the target is reached, so a
      missing target reads as "not reached", never as "not measured". ``quality``: a final
      ``TimeToQuality.summary`` to reuse, so W&B and ``time_to_quality.json`` agree to the digit.
    * Goodput, interruptions and lost steps, whenever the run has an event log.
    * Straggler flags (every attempt's ``straggler`` events) and MFU, whenever ``StragglerMonitor`` ran;
      ``field/mfu`` is null where the device's peak FLOP/s is unknown (CPUs).
    """
    run_dir = Path(run_dir)
    now = time.time() if now is None else now
    events = read_events(run_dir)
    out: dict[str, Any] = {"field/run_dir": os.fspath(run_dir)}
    if events:
        ledger = goodput_ledger(events, now=now)
        run_start = next((e for e in events if e.get("event") == "run_start"), None)
        if quality is None and run_start is not None:
            p = run_start.get("payload", {})
            quality = quality_summary(
                events, p["monitor"], float(p["target"]), p.get("mode", "min"), p.get("price_per_device_hour"),
                p.get("deadline_s"), now, ledger,
            )  # fmt: skip
        goodput = (quality or {}).get("goodput") or {
            "goodput": ledger.goodput,
            "elapsed_s": ledger.elapsed_s,
            "buckets_s": ledger.buckets,
            "interruptions": ledger.interruptions,
            "lost_steps": ledger.lost_steps,
            "attempts": ledger.attempts,
        }
        out["field/goodput"] = goodput["goodput"]
        out["field/elapsed_s"] = goodput["elapsed_s"]
        for bucket in BUCKETS:
            out[f"field/goodput/{bucket}_s"] = goodput["buckets_s"].get(bucket)
        out["field/interruptions"] = goodput["interruptions"]
        out["field/lost_steps"] = goodput["lost_steps"]
        out["field/attempts"] = len(goodput["attempts"])
    if quality:
        reached = quality.get("reached") or {}
        so_far = quality.get("so_far") or {}
        out.update(
            {
                "field/monitor": quality.get("monitor"),
                "field/target": quality.get("target"),
                "field/target_reached": bool(reached),
                "field/target_step": reached.get("step"),
                "field/time_to_target_s": reached.get("wall_s"),
                "field/time_to_target_device_hours": reached.get("device_hours"),
                "field/time_to_target_cost": reached.get("cost"),
                "field/device_hours": so_far.get("device_hours"),
                "field/cost": so_far.get("cost"),
            }
        )
        deadline = quality.get("deadline_s")
        if deadline is not None:
            # Reached: whether in time. Not reached: missed once the clock is past it, else still open (null).
            passed = (so_far.get("wall_s") or 0.0) > deadline
            out["field/deadline_met"] = quality.get("deadline_met") if reached else (False if passed else None)
    out.update(_straggler_summary(run_dir, events, straggler))
    return out


def _straggler_summary(run_dir: Path, events: list[dict[str, Any]], monitor: StragglerMonitor | None) -> dict[str, Any]:
    reports_file = run_dir / PROFILE_RELPATH / "reports.jsonl"
    flagged_events = [e for e in events if e.get("event") == "straggler"]
    if monitor is None and not flagged_events and not reports_file.is_file():
        return {}
    flags = [f for e in flagged_events for f in e.get("payload", {}).get("flagged", [])]
    if monitor is not None:
        flags += [vars(f) for report in monitor.reports for f in report.flagged]
    named = sorted({(int(f["rank"]), str(f.get("host")), str(f["section"])) for f in flags})
    latest: Mapping[str, Any] | None = monitor.report.to_dict() if monitor is not None and monitor.report else None
    if latest is None and reports_file.is_file():
        reports = read_jsonl(reports_file)
        latest = reports[-1] if reports else None
    mfus = [r["mfu"] for r in ((latest or {}).get("throughput") or {}).get("per_rank", []) if r.get("mfu") is not None]
    mfus.sort()
    median = None
    if mfus:
        mid = len(mfus) // 2
        median = mfus[mid] if len(mfus) % 2 else (mfus[mid - 1] + mfus[mid]) / 2
    return {
        "field/straggler_flags": len(named),
        "field/straggler_flagged": [f"rank {r} ({host}): {section}" for r, host, section in named],
        "field/mfu": median,
    }


class WandbReview(Callback):
    """Review a run in W&B as it goes: checkpoint manifests when committed, the run's economics at the end.

    Add it to a Trainer that has a ``FieldWandbLogger`` (any ``WandbLogger`` works, without the
    restart-safe identity) and a ``ManifestCheckpoint``:

    * each commit is logged, when it happens, as an artifact ``manifest-<run id>`` of type
      ``checkpoint-manifest`` (aliases ``step-<N>``, ``latest``; ``preempted`` for a preemption save)
      holding ``manifest.json`` and, as metadata, step, recoverable, missing, restore_tested, the hash
      algorithm, every file's hash and their digest, and the config hash. With the logger's
      ``log_checkpoints=True`` the checkpoint's files follow as ``checkpoint-<run id>`` (type
      "checkpoint"). A restarted attempt logs the checkpoint it resumed from again (alias
      ``resumed-from``), so a commit whose record died with the killed process is still there.
    * at the end of ``fit``, and after an exception, ``field_summary`` goes into the run summary.
    * its state in each checkpoint carries the W&B run id; restoring a checkpoint of another W&B run
      warns, because its history would then continue a run it does not belong to.
    """

    def __init__(self) -> None:
        self._logger: WandbLogger | None = None
        self._checkpoint: ManifestCheckpoint | None = None
        self._commits = CommitWatcher()
        self._logged: dict[str, bool] = {}  # checkpoint path -> its restore_tested when logged
        self._run_dir: Path | None = None
        self._finished = False

    # ------------------------------------------------------------------ setup and identity
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._logger = _find_wandb_logger(trainer)
        if self._logger is None:
            raise ValueError(
                "WandbReview reviews a run in W&B, but the Trainer has no WandbLogger: pass"
                " Trainer(logger=FieldWandbLogger(run_dir=...)) or remove WandbReview"
            )
        self._checkpoint = find_manifest_checkpoint(trainer)
        self._commits.reset()
        self._logged.clear()
        self._finished = False
        self._run_dir = Path(trainer.default_root_dir)
        if self._checkpoint is None:
            rank_zero_warn("WandbReview: the Trainer has no ManifestCheckpoint, so no checkpoint manifests are logged")
        logger = self._logger
        if isinstance(logger, FieldWandbLogger) and logger.run_dir.resolve() != self._run_dir.resolve():
            rank_zero_warn(
                f"FieldWandbLogger(run_dir={os.fspath(logger.run_dir)!r}) is not the Trainer's default_root_dir"
                f" ({os.fspath(self._run_dir)!r}): the W&B identity and the event log live in different places;"
                " restart with the same two directories"
            )

    def _run_id(self) -> str | None:
        logger = self._logger
        if isinstance(logger, FieldWandbLogger):
            return logger.run_id
        return logger.version if logger is not None else None

    @override
    def state_dict(self) -> dict[str, Any]:
        logger = self._logger
        return {
            "wandb_run_id": self._run_id(),
            "wandb_project": logger.name if logger is not None else None,
            "attempt": logger.attempt if isinstance(logger, FieldWandbLogger) else None,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved, current = state_dict.get("wandb_run_id"), self._run_id()
        if saved and current and saved != current:
            where = (
                f"{os.fspath(self._logger.run_dir / WANDB_RELPATH)}"
                if isinstance(self._logger, FieldWandbLogger)
                else "the WandbLogger"
            )
            rank_zero_warn(
                f"The checkpoint being restored was logged to W&B run {saved!r}, but this run logs to {current!r}"
                f" (from {where}). Its history continues in {current!r}; if that is wrong, restore"
                f" {WANDB_RELPATH} from the run that wrote the checkpoint (run_id {saved!r}) before resuming."
            )

    # ------------------------------------------------------------------ commits
    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        resumed = trainer.ckpt_path
        if trainer.is_global_zero and resumed and is_checkpoint_dir(resumed):
            self._log_manifest(trainer, Path(resumed), extra_aliases=["resumed-from"])

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        committed = self._commits.new_commit(self._checkpoint, trainer)
        if committed is not None and trainer.is_global_zero:
            self._log_manifest(trainer, Path(committed[0]))

    def _log_manifest(self, trainer: pl.Trainer, path: Path, extra_aliases: list[str] | None = None) -> None:
        key = os.fspath(path)
        if key in self._logged and not extra_aliases:
            return
        try:
            manifest = read_manifest(path)
        except ManifestError as err:
            rank_zero_warn(f"WandbReview: not logging {path}: {err}")
            return
        aliases = [f"step-{manifest.step}", "latest", *(extra_aliases or [])]
        if self._checkpoint is not None and self._checkpoint.preempted_checkpoint == key:
            aliases.append("preempted")
        if manifest.restore_tested:
            aliases.append("restore-tested")
        try:
            self._log_artifacts(path, manifest, aliases)
        except Exception as err:  # W&B trouble (disk, service) must never stop the training it reports on
            log.exception("WandbReview could not log checkpoint %s", path)
            rank_zero_warn(f"WandbReview could not log checkpoint {path} to W&B: {type(err).__name__}: {err}")
            return
        self._logged[key] = manifest.restore_tested

    def _log_artifacts(self, path: Path, manifest: Manifest, aliases: list[str]) -> None:
        import wandb

        assert self._logger is not None
        run = self._logger.experiment
        run_id = getattr(run, "id", None) or self._run_id() or "run"
        metadata = manifest_metadata(manifest, path)
        artifact = wandb.Artifact(
            name=_artifact_name("manifest", run_id), type=MANIFEST_ARTIFACT_TYPE, metadata=metadata
        )
        artifact.add_file(os.fspath(path / MANIFEST_NAME), name=MANIFEST_NAME)
        run.log_artifact(artifact, aliases=aliases)
        if getattr(self._logger, "log_checkpoints", False):
            files = wandb.Artifact(
                name=_artifact_name("checkpoint", run_id), type=CHECKPOINT_ARTIFACT_TYPE, metadata=metadata
            )
            # "mutable" copies into wandb's staging area: retention may delete the checkpoint before an
            # offline run is synced, and the upload must still find the bytes the manifest names.
            files.add_dir(os.fspath(path), policy="mutable")
            run.log_artifact(files, aliases=aliases)
        run.summary.update(
            {
                "field/checkpoint/name": manifest.name,
                "field/checkpoint/step": manifest.step,
                "field/checkpoint/recoverable": manifest.recoverable,
                "field/checkpoint/restore_tested": manifest.restore_tested,
            }
        )

    def _relog_restore_tested(self, trainer: pl.Trainer) -> None:
        """A restore drill marks a manifest after its commit was logged: log the marked version too."""
        for key, tested in list(self._logged.items()):
            if tested or not is_checkpoint_dir(key):
                continue
            try:
                if read_manifest(key).restore_tested:
                    self._logged.pop(key)
                    self._log_manifest(trainer, Path(key))
            except ManifestError:
                continue

    # ------------------------------------------------------------------ the summary
    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if isinstance(exception, TrainingPreempted):
            # The attempt's time-to-quality summary belongs in this run's review, whichever of the
            # two callbacks Lightning calls first.
            ttq = next((c for c in trainer.callbacks if isinstance(c, TimeToQuality)), None)
            if ttq is not None:
                ttq.finish_attempt(trainer)
            if isinstance(self._logger, FieldWandbLogger):
                self._logger.mark_preempted()
        self._finish(trainer)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # After every on_fit_end, so TimeToQuality's final summary is written; before ManifestCheckpoint's
        # teardown (checkpoint callbacks run last), so the ledger counts this attempt as running until now.
        if stage == "fit":
            self._finish(trainer)

    def _finish(self, trainer: pl.Trainer) -> None:
        if self._finished or not trainer.is_global_zero or self._logger is None or self._run_dir is None:
            return
        self._finished = True
        last = self._checkpoint.last_committed if self._checkpoint is not None else None
        if last is not None:
            self._log_manifest(trainer, Path(last[0]))
        self._relog_restore_tested(trainer)
        ttq = next((c for c in trainer.callbacks if isinstance(c, TimeToQuality)), None)
        monitor = next((c for c in trainer.callbacks if isinstance(c, StragglerMonitor)), None)
        final = ttq.summary if ttq is not None and ttq.summary.get("final") else None
        try:
            summary = field_summary(self._run_dir, quality=final, straggler=monitor)
            self._logger.experiment.summary.update(_json_safe(summary))
        except Exception as err:  # as above: reporting must not turn a finished fit into a failed one
            log.exception("WandbReview could not write the run summary")
            rank_zero_warn(f"WandbReview could not write the W&B summary: {type(err).__name__}: {err}")


def _json_safe(value: Any) -> Any:
    """NaN/inf become null: W&B's summary is JSON, and a NaN there breaks its readers."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------- evidence
def _checkpoint_payload(path: Path, root: Path) -> bool:
    """A checkpoint's state file inside a bundle (its manifest is evidence; its tensors are not)."""
    if path.name == MANIFEST_NAME:
        return False
    parent = path.parent
    while parent != root and root in parent.parents:
        if is_checkpoint_dir(parent):
            return True
        parent = parent.parent
    return False


def log_evidence_bundle(run: Any, bundle_dir: str | os.PathLike[str], aliases: list[str] | None = None) -> Any:
    """Log an evidence bundle (``field-evidence``'s output) to ``run``: an artifact and its plots.

    The artifact ``evidence-<bundle id>`` (type "evidence") holds ``evidence.json``, ``evidence.md``,
    the plots and the raw logs and manifest copies the evidence cites, but not checkpoint state files
    (their manifests and hashes are the evidence). Its metadata carries the verdict and the gate
    (passed, failed conditions, each critical condition), so runs can be filtered by them in W&B.
    Each ``*.png`` is logged as ``evidence/<name>`` ``wandb.Image``. ``run``: a W&B run or a WandbLogger.

    Returns the logged ``wandb.Artifact``.
    """
    import wandb

    from lightning_field.evidence.bundle import EVIDENCE_JSON

    if isinstance(run, WandbLogger):
        run = run.experiment
    bundle_dir = Path(bundle_dir)
    path = bundle_dir / EVIDENCE_JSON
    try:
        evidence = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{bundle_dir} is not an evidence bundle: {EVIDENCE_JSON} is missing (it is written last, so the"
            " bundle is incomplete or the path is wrong)"
        ) from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: unreadable evidence ({err})") from err
    gate = evidence.get("gate") or {}
    metadata = {
        "format": evidence.get("format"),
        "id": evidence.get("id"),
        "created": evidence.get("created"),
        "verdict": evidence.get("verdict"),
        "summary": evidence.get("summary"),
        "gate_passed": gate.get("passed"),
        "gate_failed": list(gate.get("failed") or []),
        "critical_conditions": {c["name"]: c["passed"] for c in evidence.get("critical_conditions") or []},
        "config_hash": (evidence.get("tested_configuration") or {}).get("config_hash"),
    }
    artifact = wandb.Artifact(
        name=_artifact_name("evidence", str(evidence.get("id") or bundle_dir.name)),
        type=EVIDENCE_ARTIFACT_TYPE,
        metadata=metadata,
    )
    for file in sorted(p for p in bundle_dir.rglob("*") if p.is_file()):
        if not _checkpoint_payload(file, bundle_dir):
            artifact.add_file(os.fspath(file), name=file.relative_to(bundle_dir).as_posix())
    run.log_artifact(artifact, aliases=["latest", *(aliases or [])])
    verdict = metadata["verdict"]
    images = {
        f"evidence/{png.stem}": wandb.Image(os.fspath(png), caption=f"{png.name}: verdict {verdict}")
        for png in sorted(bundle_dir.glob("*.png"))
    }
    if images:
        run.log(images)
    run.summary.update({"field/evidence/verdict": verdict, "field/evidence/gate_passed": gate.get("passed")})
    return artifact


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
    from wandb.proto import wandb_internal_pb2

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
            record = wandb_internal_pb2.Record()
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
        target = target.get(key)  # type: ignore[assignment]
        if not isinstance(target, dict):
            return
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
