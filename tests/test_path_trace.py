"""How many of the package's modules one save and one resume run through, as users run them
(``sys.setprofile``, default settings, snapshots off): issue 45's measure of how readable the two
paths are. Its target is 12 modules for a persistent save and 16 for a resume up to its first batch;
the ceilings below are the counts reached so far, so that the paths only ever get shorter (lower them
as the engine moves into its Lightning-free core). A module counts when any of its functions runs:
the per-step state captures (``state/``), the compat accessors and the helpers (hashing, signing,
events) included."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_field import ManifestCheckpoint, SnapshotConfig

SAVE_CEILING = 45  # 2026-12-07: the step's end from the checkpoint hook to the commit
RESUME_CEILING = 47  # fit(ckpt_path="last") up to the first batch

ADAPTER = ("checkpoint.manifest_checkpoint", "checkpoint.committed", "checkpoint.capture", "checkpoint.io")
POLICIES = (
    "checkpoint.exception_save", "checkpoint.preemption", "checkpoint.stop_points", "checkpoint.no_progress",
    "checkpoint.freshness", "checkpoint.resume_policy", "checkpoint.async_controller", "checkpoint.snapshots",
)  # fmt: skip


def layers(modules: set[str]) -> dict[str, list[str]]:
    """The traced modules by layer (docs/layout.md shows the counts): the Lightning adapter, the
    policies and tiers its hooks run, the per-rank state captures, the compat accessors, and the
    Lightning-free engine (the checkpoint core and ``core/``)."""
    found: dict[str, list[str]] = {"adapter": [], "policies": [], "state": [], "compat": [], "engine": []}
    for module in sorted(m.removeprefix("lightning_field.") for m in modules):
        if module in ADAPTER:
            found["adapter"].append(module)
        elif module in POLICIES:
            found["policies"].append(module)
        elif module.startswith(("state.", "compat.")):
            found[module.partition(".")[0]].append(module)
        else:
            found["engine"].append(module)
    return found


class ModuleTrace:
    """The package's modules whose functions run between :meth:`start` and :meth:`stop`."""

    def __init__(self) -> None:
        self.modules: set[str] = set()
        self._previous: Any = None

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        # Functions only (optimized frames, named by ``def``): a module's or class's body running as it is
        # imported is none, and would count in a fresh process only, not where the suite imported it earlier.
        code = frame.f_code
        if event == "call" and code.co_flags & inspect.CO_OPTIMIZED and not code.co_name.startswith("<"):
            name = frame.f_globals.get("__name__", "")
            if name.startswith("lightning_field"):
                self.modules.add(name)

    def start(self) -> None:
        self._previous = sys.getprofile()
        sys.setprofile(self._profile)

    def stop(self) -> None:
        sys.setprofile(self._previous)


class TraceSave(Callback):
    """On at the end of the step that saves (Lightning runs checkpoint callbacks after all others), off
    at the next batch's start: the save and its commit in between, nothing else of ours."""

    def __init__(self, trace: ModuleTrace, step: int) -> None:
        self.trace, self.step = trace, step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            self.trace.start()

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            self.trace.stop()


class StopAtFirstBatch(Callback):
    def __init__(self, trace: ModuleTrace) -> None:
        self.trace = trace

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        self.trace.stop()


def trainer(root: Path, steps: int, *callbacks: Callback) -> pl.Trainer:
    off = SnapshotConfig(every_n_train_steps=None)
    checkpoint = ManifestCheckpoint(dirpath=root / "ckpts", every_n_train_steps=2, snapshots=off)
    return pl.Trainer(
        default_root_dir=root, max_steps=steps, accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0,
        callbacks=[*callbacks, checkpoint],
    )  # fmt: skip


def test_a_persistent_save_and_a_resume_run_through_no_more_modules_than_they_did(tmp_path: Path) -> None:
    save = ModuleTrace()
    torch.manual_seed(0)  # BoringModel's data is drawn at construction: the same data for the resume
    trainer(tmp_path, 6, TraceSave(save, 4)).fit(BoringModel())
    resume = ModuleTrace()
    resumed = trainer(tmp_path, 8, StopAtFirstBatch(resume))
    torch.manual_seed(0)
    model = BoringModel()
    resume.start()
    try:
        resumed.fit(model, ckpt_path="last")
    finally:
        resume.stop()
    assert resumed.checkpoint_callback is not None and resumed.global_step == 8
    assert save.modules and "lightning_field.checkpoint.commit" in save.modules  # the trace saw the commit
    assert len(save.modules) <= SAVE_CEILING, layers(save.modules)
    assert len(resume.modules) <= RESUME_CEILING, layers(resume.modules)
