"""Tiny overfit: can the model and its loss drive the loss on a few fixed batches close to zero?

Why: a model that cannot memorise one or two batches will not learn from a million, and the reason
is almost always one of three bugs that a full run hides for hours: a learning rate far off, labels
that do not line up with the inputs, or a loss computed from tensors cut off from the parameters (a
``.detach()``, ``.item()``, ``torch.no_grad()`` or a NumPy round trip). This check trains a deep copy
of the module (the user's module, its parameters and optimizer are untouched) with its own
``configure_optimizers`` and ``training_step``, no ``Trainer``, and fails with a hint naming the
likely bug, telling the detached-graph case apart explicitly.

One step is one optimizer update on all the fixed batches (gradients averaged over them), so the
recorded loss is the whole fixed set's loss before that update and the curve is not noisy from
cycling through batches. The learning rate is held at the optimizer's base value (``initial_lr``
when a scheduler set one, else ``lr``, or the ``lr`` override): schedulers are not stepped, since a
warm-up would only slow a test that asks whether the model *can* fit. Training mode stays on
(dropout included): the check tests the model as it trains. The global RNG state is restored after.
"""

from __future__ import annotations

import copy
import inspect
import math
import random
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from torch.optim import Optimizer

from lightning_field.compat.lightning import detached_trainer

DETACHED_HINT = (
    "detached graph: the loss does not reach the trained parameters. Look for .detach(), .item(), .data,"
    " torch.no_grad()/inference_mode or a NumPy round trip between the model's output and the loss, and for"
    " parameters created outside the module (not registered, so not optimized)"
)


@dataclass
class OverfitResult:
    """The verdict and the evidence behind it.

    ``steps`` is the number of optimizer updates taken (to reach the target, or all of ``max_steps``);
    ``curve`` has the fixed set's loss before each update plus the final one; ``ratio`` is
    ``final_loss / initial_loss``. ``detached`` is True when the graph from loss to parameters is cut.
    """

    passed: bool
    steps: int
    initial_loss: float
    final_loss: float
    ratio: float
    target_ratio: float
    lr: float
    curve: list[float] = field(default_factory=list)
    detached: bool = False
    hint: str | None = None
    detail: str = ""


def _first_optimizer(configured: Any) -> Optimizer:
    """The first optimizer from any of the return forms ``configure_optimizers`` may use."""
    if isinstance(configured, Optimizer):
        return configured
    if isinstance(configured, Mapping) and "optimizer" in configured:
        return _first_optimizer(configured["optimizer"])
    if isinstance(configured, Sequence) and configured:
        return _first_optimizer(configured[0])  # [opt, ...], ([opts], [scheds]) or [{"optimizer": ...}, ...]
    raise ValueError(
        f"tiny_overfit found no optimizer in configure_optimizers()'s return value ({type(configured).__name__})"
    )


def _loss_of(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping) and isinstance(output.get("loss"), torch.Tensor):
        return output["loss"]
    raise ValueError(
        "tiny_overfit needs training_step to return the loss: a tensor or a dict with a 'loss' tensor, got"
        f" {type(output).__name__}"
    )


def _takes_batch_idx(module: pl.LightningModule) -> bool:
    params = list(inspect.signature(module.training_step).parameters.values())
    return len(params) >= 2 or any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)


def _copy_module(model: pl.LightningModule) -> pl.LightningModule:
    """A deep copy without the attached Trainer (copying it would copy the loop, loggers and data)."""
    with detached_trainer(model):
        return copy.deepcopy(model)


def tiny_overfit(
    model: pl.LightningModule,
    batches: list[Any],
    *,
    max_steps: int = 200,
    target_ratio: float = 0.1,
    lr: float | None = None,
    seed: int = 0,
) -> OverfitResult:
    """Train a copy of ``model`` on ``batches`` until loss <= ``target_ratio`` x the initial loss.

    ``batches`` must already be on the module's device. Raises ``ValueError`` naming the parameter
    for ``max_steps <= 0``, ``target_ratio`` outside (0, 1), an empty ``batches`` or ``lr <= 0``, and
    for modules with manual optimization (their ``training_step`` steps its own optimizers).
    """
    if max_steps <= 0:
        raise ValueError(f"tiny_overfit max_steps must be > 0 (a step budget of zero cannot overfit), got {max_steps}")
    if not 0.0 < target_ratio < 1.0:
        raise ValueError(
            f"tiny_overfit target_ratio must be in (0, 1), a fraction of the initial loss; got {target_ratio}"
        )
    if not batches:
        raise ValueError("tiny_overfit batches must hold at least one fixed batch, got none")
    if lr is not None and not lr > 0:
        raise ValueError(f"tiny_overfit lr must be > 0 (or None for the optimizer's own), got {lr}")
    if not model.automatic_optimization:
        raise ValueError("tiny_overfit supports automatic optimization only: this module steps its own optimizers")

    # Not Lightning's isolate_rng, which restores nothing when its body raises (lightning 2.6), and the
    # training below raises ValueError for a bad training_step: the finally restores the RNGs either way.
    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # training_step's self.log() warns once per call without a Trainer; logging is irrelevant here.
        warnings.filterwarnings("ignore", message=".*self.log\\(\\).*")
        torch.manual_seed(seed)
        try:
            return _train(_copy_module(model), batches, max_steps, target_ratio, lr)
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


def _train(
    module: pl.LightningModule, batches: list[Any], max_steps: int, target_ratio: float, lr: float | None
) -> OverfitResult:
    module.train()
    optimizer = _first_optimizer(module.configure_optimizers())
    for group in optimizer.param_groups:
        group["lr"] = lr if lr is not None else group.get("initial_lr", group["lr"])
    base_lr = float(optimizer.param_groups[0]["lr"])
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    with_batch_idx = _takes_batch_idx(module)
    curve: list[float] = []

    def result(passed: bool, steps: int, **extra: Any) -> OverfitResult:
        initial, final = curve[0], curve[-1]
        ratio = final / initial if initial > 0 and math.isfinite(final) else math.nan
        return OverfitResult(passed, steps, initial, final, ratio, target_ratio, base_lr, list(curve), **extra)

    for step in range(max_steps + 1):
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for i, batch in enumerate(batches):
            loss = _loss_of(module.training_step(batch, i) if with_batch_idx else module.training_step(batch))
            if loss.dim() != 0:
                raise ValueError(f"tiny_overfit needs a scalar loss from training_step, got shape {list(loss.shape)}")
            total += float(loss.detach())
            if step == 0 and not loss.requires_grad:
                curve.append(float(loss.detach()))
                return result(
                    False,
                    0,
                    detached=True,
                    hint=DETACHED_HINT,
                    detail="detached graph: the loss from training_step has requires_grad=False, so backward()"
                    " cannot reach any parameter",
                )
            if step < max_steps:
                (loss / len(batches)).backward()
        mean = total / len(batches)
        curve.append(mean)
        if not math.isfinite(mean):
            return result(
                False,
                step,
                hint="learning rate: the loss became non-finite; lower lr (try /10), check the inputs for NaN/Inf"
                " (check_data), and clip gradients",
                detail=f"loss became {mean} at step {step}",
            )
        if step == 0 and mean <= 0:
            return result(
                False,
                0,
                hint="the ratio criterion needs a positive initial loss; use a loss bounded below by 0",
                detail=f"initial loss {mean:.4g} is not positive, so a relative target is meaningless",
            )
        if step > 0 and mean <= target_ratio * curve[0]:
            return result(
                True,
                step,
                detail=f"loss {curve[0]:.4g} -> {mean:.4g} (x{mean / curve[0]:.3f} <= {target_ratio}) in {step} steps",
            )
        if step == max_steps:
            break
        if step == 0:
            with_grad = [p for p in params if p.grad is not None and bool(p.grad.detach().abs().sum() > 0)]
            if not with_grad:
                return result(
                    False,
                    0,
                    detached=True,
                    hint=DETACHED_HINT,
                    detail=f"detached graph: after backward() all {len(params)} optimized parameters have a None or"
                    " zero gradient",
                )
        optimizer.step()

    final = curve[-1]
    initial = curve[0]
    if final >= initial:
        hint = (
            f"learning rate: the loss did not fall ({initial:.4g} -> {final:.4g}); if it rose or oscillated lower lr"
            f" (now {base_lr:g}, try /10); if it stayed flat, check label alignment (labels shifted or shuffled"
            " against inputs, the wrong label key) and that the model's output reaches the loss"
        )
    else:
        hint = (
            f"learning rate: the loss fell only to x{final / initial:.3f} of the start in {max_steps} steps; try a"
            f" larger lr (now {base_lr:g}, try x3-x10) or more steps; a plateau far above zero points to label"
            " alignment (labels that do not follow from the inputs cannot be memorised) or too small a model"
        )
    return result(
        False,
        max_steps,
        hint=hint,
        detail=f"loss {initial:.4g} -> {final:.4g} (x{final / initial:.3f}, target x{target_ratio}) in {max_steps}"
        " steps",
    )
