"""``field preflight``: data checks, a tiny overfit, a single-device baseline and the fit, as one verdict.

The method puts the baseline first: before a distributed run is investigated, the data and labels
are checked, the model must be able to memorise a few batches, and the step time, memory and loss
trajectory of one device are measured. "The model state fits" is a separate finding from any
claim about using more devices efficiently, so the fit is reported from the real model and
optimizer state, not from a formula.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import lightning.pytorch as pl
import torch
from typing_extensions import override

from lightning_field.baseline.check_result import CheckResult
from lightning_field.baseline.data_checks import check_data
from lightning_field.baseline.overfit import tiny_overfit
from lightning_field.baseline.preflight_report import render_report, write_report
from lightning_field.profiling.throughput import batch_counts, peak_memory_bytes
from lightning_field.profiling.timers import SECTIONS, FetchClock, SectionHooks, SectionTimer

__all__ = [
    "PreflightConfigError",
    "PreflightSettings",
    "StepClock",
    "baseline",
    "device_memory_bytes",
    "measure_fit",
    "render_report",
    "run_preflight",
    "write_report",
]

BREAKDOWN = tuple(s for s in SECTIONS if s != "checkpoint")  # preflight saves no checkpoints


class PreflightConfigError(ValueError):
    """The preflight settings cannot be run; the message names the setting."""


@dataclass
class PreflightSettings:
    """Mirrored by ``conf/lightning_field/preflight/default.yaml``."""

    sample_batches: int = 50  # batches of each split the data checks read
    num_classes: int | None = None  # default: the model's ``num_classes`` attribute, when it has one
    label_key: str | None = None  # default: the last tuple element, or a labels/label/y/target key
    ignore_index: int | None = -100
    overfit_batches: int = 2
    overfit_max_steps: int = 200
    overfit_target_ratio: float = 0.1
    overfit_lr: float | None = None
    baseline_steps: int = 30  # measured steps on the configured single device (after warmup)
    baseline_warmup_steps: int = 3
    state_fraction: float = 0.6  # of device memory the persistent state may take; the rest is activations

    def validate(self) -> None:
        for name in ("sample_batches", "overfit_batches", "overfit_max_steps", "baseline_steps"):
            if getattr(self, name) < 1:
                raise PreflightConfigError(f"preflight.{name} must be >= 1 (a step budget of zero tests nothing)")
        if self.baseline_warmup_steps < 0:
            raise PreflightConfigError("preflight.baseline_warmup_steps must be >= 0")
        if not 0 < self.overfit_target_ratio < 1:
            raise PreflightConfigError(
                f"preflight.overfit_target_ratio must be in (0, 1), got {self.overfit_target_ratio}"
            )
        if not 0 < self.state_fraction <= 1:
            raise PreflightConfigError(f"preflight.state_fraction must be in (0, 1], got {self.state_fraction}")


class StepClock(SectionHooks):
    """Per step: wall time from one batch's end to the next (data loading included), the loss, the batch
    size, and the profiling timers' split into data wait, forward, backward and optimizer.

    The sections come from the same ``SectionTimer`` that ``StragglerMonitor`` uses (CUDA events read
    late on GPU, ``perf_counter`` on CPU), so the preflight baseline and a profiled run agree on terms.
    """

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self._last: float | None = None
        self._fetch = FetchClock()
        self._sections: dict[int, dict[str, float]] = {}
        self._timer: SectionTimer | None = None  # set up with the Trainer's device

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._timer = SectionTimer(trainer.strategy.root_device)
        self._fetch.install(trainer)

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        assert self._timer is not None
        self._timer.begin_step(len(self.steps))
        self._timer.add_host("data", self._fetch.take())
        self._timer.start("forward")

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        assert self._timer is not None
        self._timer.stop("optimizer")
        self._timer.end_step()
        now = time.perf_counter()
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        samples, tokens = batch_counts(batch)
        self.steps.append(
            {
                "step": trainer.global_step,
                "seconds": None if self._last is None else now - self._last,
                # Kept as a tensor: reading it here would synchronise the device inside the timed step.
                "loss": loss.detach() if isinstance(loss, torch.Tensor) else None,
                "samples": samples,
                "tokens": tokens,
            }
        )
        self._last = now

    @property
    def uses_cuda_events(self) -> bool:
        """Whether the sections were timed with CUDA events (else ``perf_counter``)."""
        return self._timer is not None and self._timer.cuda

    def losses(self) -> list[tuple[int, float | None]]:
        """(step, loss) per step, read once training is over."""
        return [(s["step"], None if s["loss"] is None else float(s["loss"])) for s in self.steps]

    def sections(self) -> dict[int, dict[str, float]]:
        """Seconds per section for each batch (by position), read once training is over."""
        if self._timer is not None:
            if self._timer.cuda:
                torch.cuda.synchronize()  # training is over: nothing is left to overlap with
            self._sections.update({t.step: t.seconds for t in self._timer.completed()})
        return self._sections


def _tensor_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def device_memory_bytes(device: torch.device) -> tuple[int | None, str]:
    """(bytes, source) of the memory the persistent state competes for on ``device``."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory), "torch.cuda.get_device_properties"
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")), "host RAM (os.sysconf)"
    except (ValueError, OSError):
        return None, "unknown"


def measure_fit(
    model: pl.LightningModule, optimizer: torch.optim.Optimizer, device: torch.device, fraction: float
) -> dict[str, Any]:
    """Persistent state measured from the live model and its optimizer after real steps."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    optim = _tensor_bytes(optimizer.state_dict()["state"])
    total = params + grads + optim
    memory, source = device_memory_bytes(device)
    fits = None if memory is None else total <= fraction * memory
    return {
        "params_bytes": params,
        "grads_bytes": grads,
        "optimizer_bytes": optim,
        "state_bytes": total,
        "basis": "measured: parameters, gradients (one per trainable parameter) and optimizer state after real steps",
        "device": str(device),
        "device_memory_bytes": memory,
        "device_memory_source": source,
        "state_fraction": fraction,
        "fits": fits,
    }


def baseline(
    model: pl.LightningModule, datamodule: Any, trainer_kwargs: dict[str, Any], settings: PreflightSettings
) -> tuple[dict[str, Any], pl.Trainer]:
    """Step time (median, p90), throughput, peak memory and loss trajectory over a few real steps."""
    clock = StepClock()
    steps = settings.baseline_warmup_steps + settings.baseline_steps
    trainer = pl.Trainer(
        **{
            **trainer_kwargs,
            "max_steps": steps,
            "max_epochs": -1,
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "limit_val_batches": 0,
            "num_sanity_val_steps": 0,
            "callbacks": [clock],
        },
    )
    trainer.fit(model, datamodule=datamodule)
    timed = [s for s in clock.steps[settings.baseline_warmup_steps :] if s["seconds"] is not None]
    first_timed = len(clock.steps) - len(timed)
    per_batch = clock.sections()
    split = [per_batch[i] for i in range(first_timed, len(clock.steps)) if i in per_batch]
    seconds = sorted(float(s["seconds"]) for s in timed)
    if not seconds:
        raise PreflightConfigError("the baseline measured no steps: the training data yields too few batches")
    median = statistics.median(seconds)
    p90 = seconds[min(len(seconds) - 1, int(0.9 * len(seconds)))]
    samples = sum(int(s["samples"]) for s in timed)
    tokens = [s["tokens"] for s in timed]
    peak, peak_source = peak_memory_bytes(trainer.strategy.root_device)
    return {
        "device": str(trainer.strategy.root_device),
        "steps_measured": len(seconds),
        "warmup_steps": settings.baseline_warmup_steps,
        "step_s_median": median,
        "step_s_p90": p90,
        "samples_per_s": samples / sum(seconds),
        "tokens_per_s": sum(tokens) / sum(seconds) if all(t is not None for t in tokens) else None,
        "peak_memory_bytes": peak,
        "peak_memory_source": peak_source,
        # Medians per section, so they need not add up to the median step.
        "breakdown_s": {name: statistics.median(t.get(name, 0.0) for t in split) for name in BREAKDOWN}
        if split
        else None,
        "breakdown_source": "lightning_field.profiling.SectionTimer ("
        + ("CUDA events" if clock.uses_cuda_events else "perf_counter")
        + f"), {len(split)} steps",
        "loss": clock.losses(),
        "step_seconds": [(s["step"], s["seconds"]) for s in clock.steps if s["seconds"] is not None],
    }, trainer


def _take(loader: Any, n: int) -> list[Any]:
    batches = []
    for batch in loader:
        batches.append(batch)
        if len(batches) == n:
            break
    return batches


def run_preflight(
    model: pl.LightningModule, datamodule: Any, trainer_kwargs: dict[str, Any], settings: PreflightSettings
) -> dict[str, Any]:
    """Every check, in order; the report is plain data (``preflight_report`` renders and writes it)."""
    settings.validate()
    datamodule.setup("fit")
    train_loader = datamodule.train_dataloader()
    val_loader = _val_loader(datamodule)
    num_classes = settings.num_classes if settings.num_classes is not None else getattr(model, "num_classes", None)
    data: list[CheckResult] = check_data(
        train_loader,
        val_loader,
        num_classes=num_classes,
        sample_batches=settings.sample_batches,
        label_key=settings.label_key,
        ignore_index=settings.ignore_index,
    )
    # A data fault (a label out of range, ...) can make training itself raise. That is a finding to
    # report next to the data check that explains it, not a crash that hides the table.
    overfit, overfit_error = _attempt(
        lambda: tiny_overfit(
            model,
            _take(train_loader, settings.overfit_batches),
            max_steps=settings.overfit_max_steps,
            target_ratio=settings.overfit_target_ratio,
            lr=settings.overfit_lr,
        )
    )
    measured_trainer, baseline_error = _attempt(lambda: baseline(model, datamodule, trainer_kwargs, settings))
    measured, trainer = measured_trainer if measured_trainer is not None else (None, None)
    fit = None
    if trainer is not None:
        fit = measure_fit(model, trainer.optimizers[0], trainer.strategy.root_device, settings.state_fraction)
    failed = [r.name for r in data if not r.passed and r.severity == "error"]
    if overfit is None or not overfit.passed:
        failed.append("tiny_overfit")
    if measured is None:
        failed.append("baseline")
    if fit is not None and fit["fits"] is False:
        failed.append("fit")
    return {
        "passed": not failed,
        "failed": failed,
        "settings": asdict(settings),
        "num_classes": num_classes,
        "data_checks": [asdict(r) for r in data],
        "overfit": asdict(overfit) if overfit is not None else {"passed": False, "detail": overfit_error},
        "baseline": measured if measured is not None else {"error": baseline_error},
        "fit": fit,
    }


def _attempt(work: Callable[[], Any]) -> tuple[Any, str | None]:
    try:
        return work(), None
    except PreflightConfigError:
        raise
    except Exception as err:  # reported as the failed check it is
        return None, f"raised {type(err).__name__}: {err}"


def _val_loader(datamodule: Any) -> Any:
    try:
        return datamodule.val_dataloader()
    except (NotImplementedError, AttributeError, pl.utilities.exceptions.MisconfigurationException):
        return None
