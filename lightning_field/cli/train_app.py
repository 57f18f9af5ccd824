"""``field-train``: the Hydra app that trains a LightningModule with the bundle and resumes by itself.

The run directory is named, not timestamped (``outputs/<task_name>/<run_name>``), so a requeued job
that reruns the same command lands in the same directory and resumes from its newest recoverable
checkpoint. Exit status: 0 when training ran (the summary says whether the target was reached), 2
when the configuration is unusable (nothing is run then).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, cast

import lightning.pytorch as pl
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from lightning.pytorch.loggers import WandbLogger
from omegaconf import DictConfig, OmegaConf, open_dict

from lightning_field.checkpoint.observe import find_manifest_checkpoint
from lightning_field.checkpoint.preemption import TrainingPreempted
from lightning_field.checkpoint.resolver import committed_checkpoints, latest_recoverable
from lightning_field.checkpoint.resume_policy import ResumeMismatchError, short_key
from lightning_field.cli.hydra_app import hydra_main
from lightning_field.core.distributed import end_process_groups
from lightning_field.core.events import read_run_events
from lightning_field.core.launcher_env import env_global_rank
from lightning_field.core.layout import EVIDENCE_RELPATH, FAULT_RELPATH, LAUNCH_RELPATH
from lightning_field.core.storage import basename
from lightning_field.evidence.faults import KillAtStep
from lightning_field.integrations import WandbReview
from lightning_field.integrations.hydra_configs import resolved_dict
from lightning_field.planning.launch import LaunchInputs, launch_estimate, render_launch_estimate
from lightning_field.quality.ledger import goodput_ledger
from lightning_field.quality.time_to_quality import TimeToQuality
from lightning_field.state.provenance import trajectory_config
from lightning_field.state.secrets import scrub_secrets

EXIT_BAD_CONFIG = 2
LAUNCH_CONFIG = "launch_config"


class TrainConfigError(ValueError):
    """The composed configuration cannot be trained; the message names the key."""


def instantiable_entries(section: str, node: Any) -> dict[str, DictConfig]:
    """name -> node for each entry of a callbacks/logger mapping; entries left without ``_target_``
    (e.g. an override of a callback whose group was deselected) are skipped loudly."""
    if node is None:
        return {}
    if not isinstance(node, DictConfig):
        raise TrainConfigError(f"{section} must be a mapping of name -> {{_target_: ...}}, got {node!r}")
    found = {}
    for name, entry in node.items():
        if isinstance(entry, DictConfig) and "_target_" in entry:
            found[str(name)] = entry
        else:
            print(
                f"[field-train] warning: {section}.{name!s} has no _target_ (its config was not selected): ignored",
                file=sys.stderr,
            )
    return found


def build_callbacks(cfg: DictConfig, identity: dict[str, Any], run_dir: Path) -> list[Any]:
    callbacks = []
    for node in instantiable_entries("callbacks", cfg.get("callbacks")).values():
        if node._target_ == "lightning_field.ManifestCheckpoint":
            # Lightning's default would be <logger dir>/<version>/checkpoints, a new directory per
            # attempt; resuming needs one that the next attempt finds again.
            dirpath = node.get("dirpath") or str(run_dir / "checkpoints")
            # instantiate() owns the keyword `config`, so pass it through a partial.
            callbacks.append(instantiate(node, _partial_=True)(config=identity, dirpath=dirpath))
        else:
            callbacks.append(instantiate(node))
    fault = cfg.get("fault") or {}
    step = fault.get("kill_at_step")
    if step is not None:
        problem = kill_step_problem(step)
        if problem:
            raise TrainConfigError(problem)
        record = Path(cfg.paths.output_dir) / FAULT_RELPATH
        if record.exists():
            # Once per run directory: the rerun that resumes must not be killed again, and again.
            print(f"[field-train] fault.kill_at_step={step}: already fired in this run ({record}); not armed again")
        else:
            callbacks.append(KillAtStep(step, record))
    return callbacks


def kill_step_problem(step: Any) -> str | None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        return f"fault.kill_at_step must be a step number >= 1, got {step!r}"
    return None


def validate(cfg: DictConfig) -> str | None:
    """What makes a composed field-train config unrunnable, checked before anything starts."""
    step = (cfg.get("fault") or {}).get("kill_at_step")
    return kill_step_problem(step) if step is not None else None


def build_loggers(cfg: DictConfig, logged_config: dict[str, Any]) -> list[Any]:
    loggers = []
    for node in instantiable_entries("logger", cfg.get("logger")).values():
        # W&B gets the composed run config (secrets scrubbed by the logger); the others need nothing extra.
        if "config" in node:  # instantiate() owns the keyword `config`, so pass it through a partial
            loggers.append(instantiate(node, _partial_=True)(config=logged_config))
        else:
            loggers.append(instantiate(node))
    return loggers


def review_callbacks(loggers: list[Any], callbacks: list[Any]) -> list[Any]:
    """A W&B logger without WandbReview would miss the manifest artifacts and the run summary."""
    wanted = any(isinstance(lg, WandbLogger) for lg in loggers)
    return [WandbReview()] if wanted and not any(isinstance(c, WandbReview) for c in callbacks) else []


def progress_bar(choice: str) -> tuple[list[Any], bool]:
    """(callbacks, enable_progress_bar) for ``progress_bar=auto|rich|tqdm|none``."""
    if choice not in ("auto", "rich", "tqdm", "none"):
        raise TrainConfigError(f"progress_bar must be auto, rich, tqdm or none, got {choice!r}")
    if choice == "none":
        return [], False
    if choice == "auto":
        choice = "rich" if sys.stdout.isatty() else "tqdm"
    # Named explicitly either way: Lightning picks rich by itself whenever it is installed.
    return [RichProgressBar() if choice == "rich" else TQDMProgressBar()], True


def launch_inputs(cfg: DictConfig, model: Any, trainer: Any) -> Any:
    callbacks = cfg.get("callbacks") or {}
    cadence = callbacks.get("checkpoint_cadence") if "_target_" in (callbacks.get("checkpoint_cadence") or {}) else None
    checkpoint = callbacks.get("checkpoint") or {}
    plan = cfg.get("plan") or {}
    flops = getattr(model, "flops_per_batch", None)
    return LaunchInputs(
        params=sum(p.numel() for p in model.parameters()),
        steps=int(trainer.max_steps) if trainer.max_steps and trainer.max_steps > 0 else 0,
        world_size=int(trainer.world_size),
        flops_per_batch=float(flops) if isinstance(flops, (int, float)) else None,
        tokens=plan.get("tokens"),
        device_tflops=plan.get("device_tflops"),
        every_n_train_steps=checkpoint.get("every_n_train_steps"),
        cadence_formula=cadence.formula if cadence is not None else None,
        mtbf_hours=(cadence.mtbf_hours if cadence is not None else None) or plan.get("mtbf_hours"),
        save_seconds=(cadence.save_cost_prior_s if cadence is not None else None) or plan.get("save_seconds"),
        write_gb_per_s=float(plan.get("write_gb_per_s", 0.5)),
        restart_seconds=float(plan.get("restart_seconds", 30.0)),
        price_per_device_hour=plan.get("price_per_device_hour"),
    )


def prepare_rank_launch(cfg: DictConfig, run_dir: Path) -> None:
    """Make the DDP ranks Lightning starts run *this* job in *this* directory.

    Lightning restarts the script with its own arguments plus ``hydra.run.dir``. Under ``-m`` those
    arguments are the whole sweep and ``hydra.run.dir`` is not the job's directory (Lightning
    #16694), so every rank would run its own sweep elsewhere. Instead the ranks compose the job's
    saved config and get the job's directory.
    """
    launch_dir = run_dir / LAUNCH_RELPATH
    launch_dir.mkdir(parents=True, exist_ok=True)
    (launch_dir / f"{LAUNCH_CONFIG}.yaml").write_text(OmegaConf.to_yaml(cfg))
    sys.argv = [sys.argv[0], "--config-path", str(launch_dir), "--config-name", LAUNCH_CONFIG]
    hydra_cfg = cast(DictConfig, HydraConfig.get())  # a DictConfig at run time, typed as its schema
    OmegaConf.set_readonly(hydra_cfg, False)
    with open_dict(hydra_cfg):
        hydra_cfg.run.dir = str(run_dir)
    OmegaConf.set_readonly(hydra_cfg, True)


def end_summary(run_dir: Path, checkpoint_dir: Path | None, printed_ttq: bool) -> str:
    lines = [f"[field-train] run directory: {run_dir}"]
    if not printed_ttq:
        ledger = goodput_ledger(read_run_events(run_dir))
        lines.append(
            f"[field-train] goodput {100 * ledger.goodput:.1f}% of {ledger.elapsed_s:.1f} s,"
            f" {ledger.interruptions} interruption(s)"
        )
    if checkpoint_dir is not None:
        manifests = [e.manifest for e in committed_checkpoints(checkpoint_dir) if e.manifest is not None]
        tested = sum(1 for m in manifests if m.restore_tested)
        last = latest_recoverable(checkpoint_dir)
        lines.append(
            f"[field-train] checkpoints: {checkpoint_dir} ({len(manifests)} committed, {tested} restore-tested);"
            f" resume point: {basename(last) if last else 'none'}  (field ckpt list {checkpoint_dir})"
        )
    bundles = sorted((run_dir / EVIDENCE_RELPATH).glob("*/evidence.json"))
    if bundles:
        lines.append(f"[field-train] evidence bundles: {', '.join(str(b.parent) for b in bundles)}")
    else:
        lines.append(
            "[field-train] evidence: none yet; `field-evidence` with the same model/data overrides restores a"
            " checkpoint and compares the continuation with controlled runs"
        )
    return "\n".join(lines)


def run(cfg: DictConfig) -> int:
    run_dir = Path(cfg.paths.output_dir).resolve()
    rank = env_global_rank()  # the launcher's environment: no process group exists yet
    launching = "LOCAL_RANK" not in os.environ and "RANK" not in os.environ
    environment_before = {k: os.environ[k] for k in LAUNCHER_VARIABLES if k in os.environ}
    try:
        pl.seed_everything(int(cfg.seed), workers=True, verbose=False)
        resolved = resolved_dict(cfg)
        identity = trajectory_config(resolved)
        # Plain lists and dicts, not OmegaConf containers: hparams land in checkpoints and in the
        # restore drill's JSON spec.
        model = instantiate(cfg.model, _convert_="all")
        data = instantiate(cfg.data, _convert_="all") if cfg.get("data") is not None else None
        callbacks = build_callbacks(cfg, identity, run_dir)
        bar_callbacks, bar_enabled = progress_bar(str(cfg.get("progress_bar", "auto")))
        logged = scrub_secrets(resolved)
        loggers = build_loggers(cfg, logged)
        callbacks += review_callbacks(loggers, callbacks)
        strategy = instantiate(cfg.strategy) if cfg.get("strategy") else None
        trainer = instantiate(
            cfg.trainer,
            default_root_dir=str(run_dir),
            callbacks=callbacks + bar_callbacks,
            logger=loggers or False,
            enable_progress_bar=bar_enabled,
            **({"strategy": strategy} if strategy is not None else {}),
        )
    except TrainConfigError as err:
        print(f"field-train: {err}", file=sys.stderr)
        return EXIT_BAD_CONFIG

    checkpoint = find_manifest_checkpoint(trainer)
    checkpoint_dir = Path(checkpoint.dirpath) if checkpoint is not None and checkpoint.dirpath else None
    checkpoint_dir = checkpoint_dir or run_dir / "checkpoints"
    resume_from = latest_recoverable(checkpoint_dir) if checkpoint is not None else None
    if not cfg.get("resume", True) and resume_from is not None:
        print(
            f"field-train: resume=false, but {checkpoint_dir} already holds the recoverable checkpoint"
            f" {basename(resume_from)}; choose another run_name or drop resume=false",
            file=sys.stderr,
        )
        return EXIT_BAD_CONFIG
    if rank == 0:  # the launching process, or rank 0 under torchrun/SLURM
        print(OmegaConf.to_yaml(logged))
        print(render_launch_estimate(launch_estimate(launch_inputs(cfg, model, trainer))))
        where = f"resuming from {resume_from}" if resume_from else "starting fresh"
        print(f"[field-train] run directory {run_dir}: {where}", flush=True)
    if cfg.get("fault", {}).get("kill_at_step") is not None and launching and os.getpgrp() != os.getpid():
        # The drill SIGKILLs its process group: make it this job's ranks only, never the calling shell.
        os.setpgrp()
    if launching and trainer.world_size > 1 and HydraConfig.initialized():
        prepare_rank_launch(cfg, run_dir)
    try:
        trainer.fit(model, datamodule=data, ckpt_path="last" if cfg.get("resume", True) and resume_from else None)
    except ResumeMismatchError as refused:
        if trainer.is_global_zero:
            print(refusal_message(run_dir, refused), file=sys.stderr, flush=True)
        if launching:
            _end_distributed_job(environment_before)
        return EXIT_BAD_CONFIG
    except TrainingPreempted as stop:
        # Exits with PREEMPTED_EXIT_CODE: the launcher or batch script reruns the same command.
        if trainer.is_global_zero:
            print(f"[field-train] {stop} (exit status {stop.code})", flush=True)
        if launching:
            _end_distributed_job(environment_before)
        raise
    if trainer.is_global_zero:
        ttq = any(isinstance(c, TimeToQuality) for c in trainer.callbacks)
        print(end_summary(run_dir, checkpoint_dir if checkpoint is not None else None, ttq), flush=True)
    if launching:
        _end_distributed_job(environment_before)
    return 0


def refusal_message(run_dir: Path, refused: Exception) -> str:
    """A refused resume in a few lines: what differs, then the command-line ways out."""
    differences = getattr(refused, "differences", {}) or {}
    if not differences:
        return f"field-train: {refused}"
    lines = [f"field-train: refusing to resume {run_dir}: its checkpoint was written by a different run"]
    for key, value in sorted(differences.items()):
        if isinstance(value, tuple) and len(value) == 2:
            lines.append(f"  {short_key(key)}: {value[0]!r} (checkpoint) -> {value[1]!r} (this command)")
        else:
            lines += [f"  {short_key(key)}: {change}" for change in value]
    allowed_by = getattr(refused, "allowed_by", "resume.allow_mismatch")  # resume.allow_changed: Trainer settings
    prefix = "trainer." if allowed_by == "resume.allow_changed" else ""
    names = ",".join(short_key(k).removeprefix(prefix) for k in sorted(differences))
    lines.append("  a new run:        add run_name=<new name>")
    if allowed_by:
        lines.append(f"  resume anyway:    add 'callbacks.checkpoint.{allowed_by}=[{names}]'")
    return "\n".join(lines)


LAUNCHER_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")


def _end_distributed_job(environment_before: dict[str, str]) -> None:
    """Leave the process as the job found it. Lightning keeps the process group up and its launcher
    variables (LOCAL_RANK, ...) set after fit; under -m the next job in this process would then take
    itself for a started rank, start no peers, and wait for them forever."""
    end_process_groups()
    for name in LAUNCHER_VARIABLES:
        if name in environment_before:
            os.environ[name] = environment_before[name]
        else:
            os.environ.pop(name, None)


def main() -> None:
    hydra_main("field_train", run, validate=validate)


if __name__ == "__main__":
    main()
