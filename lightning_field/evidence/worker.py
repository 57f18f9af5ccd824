"""One attempt of one protocol run, in its own process: ``python -m lightning_field.evidence.worker SPEC``.

The spec names the user's model, data, trainer and checkpoint configuration by ``_target_`` (as
Hydra configs), the step to train to, whether to resume from the run's latest recoverable
checkpoint, and where to kill the job, if anywhere. Lightning's DDP launcher re-runs this same
command for the other ranks, so multi-rank runs need nothing extra.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from lightning_field.checkpoint.resolver import latest_recoverable
from lightning_field.checkpoint.stores import LocalStore
from lightning_field.core.distributed import end_process_groups, exit_finished_process
from lightning_field.evidence.faults import KillAtStep, KillDuringSave
from lightning_field.evidence.trace import StepTracer
from lightning_field.state.provenance import trajectory_config

STARTED_UNIX = time.time()  # after the interpreter and torch/Lightning imports: start-up cost ends here

CHECKPOINTS = "checkpoints"
TRACE = "trace"
FINAL_STATE = "final.pt"
KILL_RECORD = "kill.json"


@dataclass
class RunSpec:
    """Everything one attempt needs; written as JSON by the parent, read by the worker."""

    name: str
    run_dir: str
    config: dict[str, Any]
    max_steps: int
    attempt: int = 1
    resume: bool = False
    kill_step: int | None = None
    kill_mode: str = "step"
    state_every_n_steps: int = 1
    launched_unix: float | None = None
    extra_sys_path: list[str] = field(default_factory=list)

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> RunSpec:
        return cls(**json.loads(Path(path).read_text()))


def build_checkpoint(config: dict[str, Any], run_dir: Path, store: LocalStore | None = None) -> Any:
    """The configured checkpoint callback, saving into this run's directory (through ``store``,
    where a drill interrupts saves)."""
    options = dict(config.get("callbacks", {}).get("checkpoint") or {})
    if not options:
        raise ValueError("the configuration has no callbacks.checkpoint: the protocol tests checkpoints")
    extra: dict[str, Any] = {}
    if store is not None:
        storage = dict(options.pop("storage", None) or {})
        if storage.get("store") is not None:
            raise ValueError(
                "callbacks.checkpoint.storage.store is set, and a kill inside a save (evidence.kill_mode=save or"
                " mixed) interrupts the local store: use evidence.kill_mode=step with a store of your own"
            )
        # The store is an object, not a config value: it joins the group's fields, which the callback builds.
        extra["storage"] = {**storage, "store": store}
    options["dirpath"] = str(run_dir / CHECKPOINTS)
    # Every checkpoint of an evidence run is kept: the bundle cites the manifests of all of them.
    options["save_top_k"] = -1
    # The same view of the config that field-train records, so evidence and checkpoints compare.
    # (instantiate() owns the keyword `config`, so it goes through a partial, as does the storage group.)
    return instantiate(OmegaConf.create(options), _partial_=True)(config=trajectory_config(config), **extra)


def run(spec: RunSpec) -> int:
    for entry in reversed(spec.extra_sys_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    config = spec.config
    run_dir = Path(spec.run_dir)
    pl.seed_everything(int(config.get("seed", 0)), workers=bool(config.get("seed_workers", True)), verbose=False)
    model = instantiate(OmegaConf.create(config["model"]))
    # A DataModule, a factory returning one or a train DataLoader, or none (the module's own loaders).
    data = instantiate(OmegaConf.create(config["data"])) if config.get("data") else None
    fit_data = (
        {"datamodule": data}
        if data is None or isinstance(data, pl.LightningDataModule)
        else {"train_dataloaders": data}
    )
    trainer: pl.Trainer | None = None
    kill_record = run_dir / KILL_RECORD
    saving_kill = (
        KillDuringSave(lambda: trainer, spec.kill_step, kill_record)
        if spec.kill_step is not None and spec.kill_mode == "save"
        else None
    )
    checkpoint = build_checkpoint(config, run_dir, store=saving_kill)
    tracer = StepTracer(run_dir / TRACE, spec.attempt, spec.state_every_n_steps, spec.launched_unix)
    tracer.timeline["worker_started_unix"] = STARTED_UNIX
    callbacks: list[Any] = [tracer]
    if spec.kill_step is not None and spec.kill_mode == "step":
        callbacks.append(KillAtStep(spec.kill_step, kill_record))
    callbacks.append(checkpoint)
    trainer = instantiate(
        OmegaConf.create(config["trainer"]),
        default_root_dir=str(run_dir),
        max_steps=spec.max_steps,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    ckpt_path = latest_recoverable(run_dir / CHECKPOINTS) if spec.resume else None
    trainer.fit(model, **fit_data, ckpt_path=str(ckpt_path) if ckpt_path else None)
    if trainer.is_global_zero:
        torch.save(
            {
                "step": trainer.global_step,
                "weights": {k: v.detach().cpu() for k, v in model.state_dict().items()},
                "optimizer": [opt.state_dict() for opt in trainer.optimizers],
                "schedulers": [cfg.scheduler.state_dict() for cfg in trainer.lr_scheduler_configs],
            },
            run_dir / FINAL_STATE,
        )
    end_process_groups()  # every rank is past its collectives; gloo torn down at exit can abort (-6)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m lightning_field.evidence.worker SPEC.json", file=sys.stderr)
        return 2
    return run(RunSpec.read(args[0]))


if __name__ == "__main__":
    exit_finished_process(main())
