"""``FieldWandbLogger``: a WandbLogger that continues one W&B run across every restart.

It picks up the run identity (``wandb_identity``) before wandb creates the run, writes each
attempt's offline files into a segment of its own, numbers an offline segment's history after the
previous one's, and records a preempted attempt as ``preempted`` rather than ``failed``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities.rank_zero import rank_zero_only, rank_zero_warn
from typing_extensions import override

from lightning_field.compat import wandb as wandb_compat
from lightning_field.core.layout import WANDB_RELPATH
from lightning_field.integrations.wandb_identity import (
    FORMAT,
    SEGMENTS_DIRNAME,
    env_global_zero,
    event_log_attempt,
    new_run_id,
    offline_segments,
    read_wandb_identity,
    scrub_config,
    segment_attempts,
    write_identity,
)
from lightning_field.integrations.wandb_offline import last_history_step

TRANSACTION_LOG_FLUSH_S = 1.0
"""How often wandb writes its buffered records to the ``.wandb`` file. wandb 0.31's default is 15 s,
so a SIGKILL lost up to 15 s of history *and* the artifact records of the checkpoints saved in
that window; 1 s costs one small ``write`` per second."""
_OWNED_INIT_ARGS = ("id", "version", "resume", "dir", "save_dir", "mode", "log_model")


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

    Raises:
        ValueError: ``run_dir`` is not given, or a ``wandb.init`` argument this logger owns (``id``,
            ``resume``, ``dir``, ``mode``, ...) is passed.

    Example::

        from lightning_field import FieldWandbLogger, ManifestCheckpoint, WandbReview

        root = "runs/exp1"  # the same directory on every restart
        trainer = Trainer(default_root_dir=root, logger=FieldWandbLogger(run_dir=root, project="my-project"),
                          callbacks=[WandbReview(), ManifestCheckpoint(dirpath=f"{root}/ckpts")])
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
        # LightningCLI follows **kwargs into WandbLogger's signature and writes every one of its
        # arguments out, so a config file hands the owned ones back as None: only a value set clashes.
        for name in [k for k in _OWNED_INIT_ARGS if k in kwargs and kwargs[k] is None]:
            del kwargs[name]
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
        if not env_global_zero():
            return identity  # rank 0 wrote it before launching the other ranks; they only read it
        if identity is None:
            identity = {
                "format": FORMAT,
                "run_id": new_run_id(),
                "project": project,
                "entity": entity,
                "created_unix": time.time(),
                "segments": [],
            }
            write_identity(self.run_dir, identity)
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

    @property
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
        import wandb  # wandb takes ~1 s to import: only runs that log to W&B pay it

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
        earlier = segment_attempts(self.run_dir, identity)
        self.attempt = max(event_log_attempt(self.run_dir), (earlier[-1] + 1) if earlier else 1)
        last_step = last_history_step(offline_segments(self.run_dir, self.run_id))
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
        write_identity(self.run_dir, identity)
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
            write_identity(self.run_dir, identity)

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
        write_identity(self.run_dir, identity)
