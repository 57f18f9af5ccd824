"""``RestoreDrill``: prove, while training continues, that the checkpoints being written restore.

Every ``every_n_checkpoints`` commits, the live run records what happens in the step right after
the checkpoint (the batch's bytes, the loss, the weights after the update). A separate process then
loads that checkpoint into a fresh model, replays the step, and compares. A pass marks the
checkpoint's manifest ``restore_tested: true`` with the drill's record; a failure is logged as an
error, written to the event log and sent to the run's loggers as a metric. Training never waits
for a drill: the process is polled between batches, and only the end of ``fit`` waits for the last.

The post-update weights are what catch damage to the optimizer state: the replayed loss depends
only on the weights, but the update depends on the optimizer's moments too.

A drill loads a private hard-linked copy of its checkpoint, made the moment the commit is seen:
with ``save_top_k=1`` the next save removes the checkpoint, usually before a drill process has even
started. Committed files are never changed in place (saves and manifest updates are renames), so
the links keep exactly the committed bytes, at no cost in disk until retention removes the original;
which is why, when the outcome is evidence the release record needs (the newest pass, or a mismatch),
renaming the copy back puts the very checkpoint that was committed in its place.

The drill process is ``drill_replay.py``; starting and stopping it, and what its result means and
where that is recorded, is ``drill_runs.py``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_field.checkpoint.manifest_checkpoint import ManifestCheckpoint
from lightning_field.checkpoint.observe import CommitWatcher, field_run_dir, find_manifest_checkpoint
from lightning_field.compat import lightning as internals
from lightning_field.core.layout import DRILLS_RELPATH
from lightning_field.core.manifest import ManifestError, read_manifest
from lightning_field.core.storage import as_location, basename
from lightning_field.evidence.digest import batch_digest, parameter_norms, weights_digest
from lightning_field.evidence.drill_runs import (
    ERROR,
    MISMATCH,
    RunningDrill,
    drill_record,
    exit_without_result,
    record_beside_checkpoint,
    release,
    release_superseded,
    same_checkpoint,
    start_drill,
    stop_drill,
)
from lightning_field.evidence.trace import loss_value

log = logging.getLogger(__name__)

# Next to the checkpoint, so a hard link never crosses filesystems. The ".tmp-" prefix hides it from
# resolvers and listings, and has the next run's ManifestCheckpoint delete it if this process dies.
PROTECTED_PREFIX = ".tmp-drill-"


class RestoreDrillError(ValueError):
    """The drill cannot be set up for this run; the message says what to pass instead."""


def _target_config(obj: Any, hparams: Mapping[str, Any], what: str, option: str) -> dict[str, Any]:
    cls = type(obj)
    if cls.__module__ == "__main__":
        raise RestoreDrillError(
            f"RestoreDrill cannot rebuild the {what} {cls.__name__}: it is defined in the main script, which a"
            f" drill process cannot import. Move it to a module, or pass RestoreDrill({option}={{'_target_': ...}})."
        )
    config = {"_target_": f"{cls.__module__}.{cls.__qualname__}", **dict(hparams)}
    try:
        json.dumps(config)
    except TypeError as err:
        raise RestoreDrillError(
            f"RestoreDrill cannot rebuild the {what} from its hparams ({err}); pass RestoreDrill({option}=...)"
        ) from None
    return config


class RestoreDrill(Callback):
    """Restore-test every ``every_n_checkpoints``-th committed checkpoint in a separate process.

    Args:
        every_n_checkpoints: 0 turns drills off (the default). Each drilled checkpoint is hard-linked
            into a private copy next to it when it commits, so retention (``save_top_k``) cannot
            remove it before its drill has run; the copy is deleted once the drill is recorded, or
            put back in the checkpoint's place where retention removed it and the drill passed (with
            no newer pass) or found a mismatch. Retention keeps the newest drill-passed checkpoint
            until a newer one passes, and every failed one, for the release record.
        model, data: Hydra-style configs (``{"_target_": ..., **kwargs}``) that rebuild the module and
            datamodule in the drill process. Default: the classes of the live objects and their
            ``hparams`` (so both must call ``save_hyperparameters`` and live in importable modules).
        accelerator: where the drill runs; default the live run's device type. A different device
            changes floating-point results, so then set ``rtol`` above 0.
        rtol: 0 compares the loss and the weights bit for bit; above 0, the loss and per-tensor
            weight norms within this relative tolerance.
        timeout_s: a drill still running after this long is killed and counted as failed.
        wait_at_end: let the end of ``fit`` wait for drills in flight so their outcome is recorded.

    Raises:
        ValueError: ``every_n_checkpoints`` or ``rtol`` below 0.
        RestoreDrillError: at ``fit``, when the drill cannot be set up for this run (no
            ``ManifestCheckpoint``, several ranks, a module or datamodule it cannot rebuild).

    Example::

        from lightning_field import ManifestCheckpoint, RestoreDrill

        trainer = Trainer(callbacks=[RestoreDrill(every_n_checkpoints=5),
                                     ManifestCheckpoint(dirpath="ckpts", every_n_train_steps=500)])
    """

    def __init__(
        self,
        every_n_checkpoints: int = 0,
        model: Mapping[str, Any] | None = None,
        data: Mapping[str, Any] | None = None,
        accelerator: str | None = None,
        rtol: float = 0.0,
        timeout_s: float = 600.0,
        wait_at_end: bool = True,
    ) -> None:
        if every_n_checkpoints < 0:
            raise ValueError(f"every_n_checkpoints must be >= 0, got {every_n_checkpoints}")
        if rtol < 0:
            raise ValueError(f"rtol must be >= 0, got {rtol}")
        self.every_n_checkpoints = every_n_checkpoints
        self.model = dict(model) if model else None
        self.data = dict(data) if data else None
        self.accelerator = accelerator
        self.rtol = rtol
        self.timeout_s = timeout_s
        self.wait_at_end = wait_at_end
        self.results: list[dict[str, Any]] = []
        self.failures = 0  # replays that differed from the live run
        self.errors = 0  # drills that could not replay at all
        self._checkpoint: ManifestCheckpoint | None = None
        self._recipe: dict[str, Any] = {}
        self._drill_dir: Path | None = None
        self._commits_seen = 0
        self._commits = CommitWatcher()
        self._armed: dict[str, Any] | None = None
        self._armed_copy: Path | None = None
        self._running: list[RunningDrill] = []
        self._unprotected_warned = False

    @property
    def running(self) -> list[RunningDrill]:
        """The drills started and not yet finished (a copy), each with its process."""
        return list(self._running)

    @property
    def enabled(self) -> bool:
        return self.every_n_checkpoints > 0

    # ------------------------------------------------------------------ setup
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if not self.enabled or stage != "fit":
            return
        self._checkpoint = find_manifest_checkpoint(trainer)
        if self._checkpoint is None:
            raise RestoreDrillError("RestoreDrill needs a lightning_field.ManifestCheckpoint among the callbacks")
        if trainer.world_size > 1:
            raise RestoreDrillError(
                f"RestoreDrill replays a step in one process; this run has {trainer.world_size} ranks. Use"
                " field-evidence (trainer=ddp_cpu) to test multi-rank restores."
            )
        model = self.model or _target_config(pl_module, pl_module.hparams, "module", "model")
        datamodule = internals.trainer_datamodule(trainer)
        if self.data is None and datamodule is None:
            raise RestoreDrillError("RestoreDrill needs a LightningDataModule (or data=...) to replay a step")
        data = self.data
        if data is None:
            assert datamodule is not None  # refused just above otherwise
            data = _target_config(datamodule, datamodule.hparams, "datamodule", "data")
        root = trainer.strategy.root_device
        device = root.type
        self._recipe = {
            "model": model,
            "data": data,
            "trainer": {
                "accelerator": self.accelerator or ("gpu" if device == "cuda" else device),
                # The drill shares the live run's device rather than defaulting to the first GPU.
                "devices": [root.index] if device == "cuda" and self.accelerator is None else 1,
                "precision": str(trainer.precision),
                "accumulate_grad_batches": trainer.accumulate_grad_batches,
                "gradient_clip_val": trainer.gradient_clip_val,
                "gradient_clip_algorithm": trainer.gradient_clip_algorithm,
                "deterministic": torch.are_deterministic_algorithms_enabled(),
                "max_epochs": trainer.max_epochs,
                "limit_train_batches": trainer.limit_train_batches,
                # Compared on resume with the checkpoint's (state/trainer_settings.py), validation or not.
                "val_check_interval": internals.val_check_interval(trainer),
                "check_val_every_n_epoch": trainer.check_val_every_n_epoch,
                # A validation after the checkpoint's step is replayed too (its random draws precede the step).
                "limit_val_batches": trainer.limit_val_batches,
            },
            "threads": torch.get_num_threads(),
            "rtol": self.rtol,
            "sys_path": [p for p in sys.path if p],
        }
        self._drill_dir = field_run_dir(trainer) / DRILLS_RELPATH
        self._unprotected_warned = False
        dirpath = self._checkpoint.dirpath
        store = self._checkpoint.store_at(dirpath) if dirpath is not None else None
        if store is not None and not hasattr(store, "linked_copy") and self._checkpoint.save_top_k != -1:
            self._warn_unprotected(f"the store of {dirpath} ({type(store).__name__}) cannot make linked copies")

    # ------------------------------------------------------------------ the live side of a drill
    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        committed = self._commits.new_commit(self._checkpoint, trainer)
        if committed is None:
            return
        path, step = committed
        self._commits_seen += 1
        if self._commits_seen % self.every_n_checkpoints == 0 and self._armed is None:
            # The checkpoint holds the state right before this batch: this batch is the one to replay.
            options = self._checkpoint.storage_options if self._checkpoint else None
            try:
                created = read_manifest(path, options).created_unix
            except ManifestError as err:
                log.warning("Restore drill for %s (step %d) skipped: its manifest cannot be read (%s)", path, step, err)
                return
            token = os.urandom(3).hex()
            # Now, before the next save can let retention remove it.
            self._armed_copy = self._protect(path, token)
            self._armed = {
                "checkpoint": path,
                "step": step,
                "created_unix": created,
                "position": [trainer.current_epoch, batch_idx],
                "batch": batch_digest(batch),
                "token": token,
            }

    def _protect(self, checkpoint: str, token: str) -> Path | None:
        """A private hard-linked copy of ``checkpoint`` for its drill, or None (warned) if none can be made."""
        assert self._checkpoint is not None
        store = self._checkpoint.store_at(checkpoint)
        linked_copy = getattr(store, "linked_copy", None)
        if linked_copy is None:
            self._warn_unprotected(f"the store of {checkpoint} ({type(store).__name__}) cannot make linked copies")
            return None
        location = as_location(checkpoint)
        try:
            return Path(linked_copy(location, f"{PROTECTED_PREFIX}{basename(location)}-{token}"))
        except OSError as err:
            self._warn_unprotected(f"hard-linking {checkpoint} failed ({err})")
            return None

    def _warn_unprotected(self, why: str) -> None:
        if self._unprotected_warned:
            return
        self._unprotected_warned = True
        keep = self._checkpoint.save_top_k if self._checkpoint is not None else None
        log.warning(
            "RestoreDrill cannot keep checkpoints for their drills: %s. Drills load the checkpoints themselves,"
            " and with save_top_k=%s a checkpoint may be removed before its drill has run; such a drill is"
            " reported as skipped. Use save_top_k=-1, or a local dirpath, to drill every checkpoint.",
            why,
            keep,
        )

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        armed = self._armed
        if armed is not None:
            armed.setdefault("loss", loss_value(outputs))
            if trainer.global_step == armed["step"] + 1:
                armed["weights"] = weights_digest(pl_module)
                armed["norms"] = parameter_norms(pl_module)
                self._armed = None
                self._launch(armed)
        self._poll(trainer)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._disarm()  # the final checkpoint has no next step in this run to compare with
        if self.wait_at_end:
            for running in list(self._running):
                remaining = self.timeout_s - (time.monotonic() - running.started)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    running.process.wait(timeout=max(remaining, 0.0))
            self._poll(trainer, final=True)
        for running in self._running:
            # Not waited for: an unfinished drill says nothing about its checkpoint either way.
            stop_drill(running)
            log.warning(
                "Restore drill for %s (step %d) abandoned: training ended before it finished",
                running.checkpoint,
                running.step,
            )
            events = self._checkpoint.events if self._checkpoint else None
            if events is not None and trainer.is_global_zero:
                events.emit(
                    "restore_drill",
                    step=running.step,
                    payload={"checkpoint": running.checkpoint, "outcome": "abandoned"},
                )
        self._running = []

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # A preempted attempt (TrainingPreempted) has seconds to leave, and Lightning calls neither
        # on_train_end nor teardown after an exception: stop the drills here, unwaited.
        self.teardown(trainer, pl_module, "fit")

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._disarm()
        for running in self._running:
            stop_drill(running)
        self._running = []

    def _disarm(self) -> None:
        self._armed = None
        if self._armed_copy is not None:
            shutil.rmtree(self._armed_copy, ignore_errors=True)
            self._armed_copy = None

    def _launch(self, armed: dict[str, Any]) -> None:
        assert self._drill_dir is not None
        protected, self._armed_copy = self._armed_copy, None
        name = f"{Path(armed['checkpoint']).name}-{armed['token']}"
        work = self._drill_dir / name
        work.mkdir(parents=True, exist_ok=True)
        source = str(protected) if protected is not None else armed["checkpoint"]
        spec = {**self._recipe, "checkpoint": source, "expected": armed, "work_dir": str(work)}
        options = self._checkpoint.storage_options if self._checkpoint else None
        self._running.append(start_drill(spec, work, self._recipe["sys_path"], protected, options))

    def _poll(self, trainer: pl.Trainer, final: bool = False) -> None:
        for running in list(self._running):
            overdue = time.monotonic() - running.started > self.timeout_s
            if running.process.poll() is None and not (overdue or final):
                continue
            if running.process.poll() is None:
                stop_drill(running)
                result = {"outcome": ERROR, "error": f"drill did not finish within {self.timeout_s:.0f} s"}
            elif running.result_path.is_file():
                result = json.loads(running.result_path.read_text())
            else:
                result = {"outcome": ERROR, "error": exit_without_result(running)}
            self._running.remove(running)
            try:
                self._record(trainer, running, result)
            finally:
                release(running)  # after the record, which may have put the copy back as the checkpoint

    def _record(self, trainer: pl.Trainer, running: RunningDrill, result: dict[str, Any]) -> None:
        current = same_checkpoint(running)
        record = drill_record(running, result, current)
        self.results.append(record)
        if record["outcome"] == MISMATCH:
            self.failures += 1
        elif record["outcome"] == ERROR:
            self.errors += 1
        if trainer.is_global_zero:
            if record_beside_checkpoint(running, record, current, self._checkpoint) and record["passed"]:
                release_superseded(self._checkpoint)
            events = self._checkpoint.events if self._checkpoint else None
            if events is not None:
                events.emit("restore_drill", step=running.step, payload=record)
            metrics = {
                "field/restore_drill_passed": float(record["passed"]),
                "field/restore_drill_failures": float(self.failures),
                "field/restore_drill_errors": float(self.errors),
            }
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"commits_seen": self._commits_seen, "failures": self.failures}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._commits_seen = int(state_dict.get("commits_seen", 0))
        self.failures = int(state_dict.get("failures", 0))
