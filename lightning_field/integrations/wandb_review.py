"""``WandbReview``: every committed checkpoint as a W&B artifact when it commits, and the run's
time to quality, goodput, interruptions and stragglers in the W&B summary after every attempt.

Lightning's ``log_model=True`` uploads checkpoints only at the end of a successful ``fit``, so a
preempted run has none (#20425); this logs each ``ManifestCheckpoint`` commit as it happens.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from typing_extensions import override

from lightning_field.checkpoint.manifest_checkpoint import ManifestCheckpoint
from lightning_field.checkpoint.observe import CommitWatcher, find_manifest_checkpoint
from lightning_field.checkpoint.preemption import TrainingPreempted
from lightning_field.compat.lightning import trainer_callbacks
from lightning_field.core.hashing import bytes_digest
from lightning_field.core.layout import WANDB_RELPATH
from lightning_field.core.manifest import MANIFEST_NAME, Manifest, ManifestError, is_checkpoint_dir, read_manifest
from lightning_field.integrations.wandb_logger import FieldWandbLogger
from lightning_field.profiling.straggler import StragglerMonitor
from lightning_field.quality.run_summary import field_summary
from lightning_field.quality.time_to_quality import TimeToQuality

log = logging.getLogger(__name__)

MANIFEST_ARTIFACT_TYPE = "checkpoint-manifest"
CHECKPOINT_ARTIFACT_TYPE = "checkpoint"
_ARTIFACT_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


# ---------------------------------------------------------------------------------------------- the review callback
def _find_wandb_logger(trainer: pl.Trainer) -> WandbLogger | None:
    loggers = [lg for lg in trainer.loggers if isinstance(lg, WandbLogger)]
    return next((lg for lg in loggers if isinstance(lg, FieldWandbLogger)), loggers[0] if loggers else None)


def artifact_name(prefix: str, key: str) -> str:
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

    Example::

        from lightning_field import FieldWandbLogger, ManifestCheckpoint, WandbReview

        trainer = Trainer(default_root_dir=root, logger=FieldWandbLogger(run_dir=root),
                          callbacks=[WandbReview(), ManifestCheckpoint(dirpath=f"{root}/ckpts")])
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
        import wandb  # wandb takes ~1 s to import: only runs that log to W&B pay it

        assert self._logger is not None
        run = self._logger.experiment
        run_id = getattr(run, "id", None) or self._run_id() or "run"
        metadata = manifest_metadata(manifest, path)
        artifact = wandb.Artifact(
            name=artifact_name("manifest", run_id), type=MANIFEST_ARTIFACT_TYPE, metadata=metadata
        )
        artifact.add_file(os.fspath(path / MANIFEST_NAME), name=MANIFEST_NAME)
        run.log_artifact(artifact, aliases=aliases)
        if getattr(self._logger, "log_checkpoints", False):
            files = wandb.Artifact(
                name=artifact_name("checkpoint", run_id), type=CHECKPOINT_ARTIFACT_TYPE, metadata=metadata
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
            ttq = next((c for c in trainer_callbacks(trainer) if isinstance(c, TimeToQuality)), None)
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
        ttq = next((c for c in trainer_callbacks(trainer) if isinstance(c, TimeToQuality)), None)
        monitor = next((c for c in trainer_callbacks(trainer) if isinstance(c, StragglerMonitor)), None)
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
