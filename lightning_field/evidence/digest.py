"""Digests of the things a resumed run must reproduce: batches, RNG streams, weights, optimizer state.

A digest is a short hash of the exact bytes, so two runs are compared bit for bit without storing
their tensors. Each component is hashed separately, which is what lets a comparison say *which*
part of the state diverged first (data order, RNG, weights, optimizer) instead of only that the
loss moved.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from torchmetrics import Metric

from lightning_field.core.hashing import new_hasher
from lightning_field.state.rng import capture_rng_state, rng_digest

DIGEST_CHARS = 16


def _update(h: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        tensor = value.detach()
        h.update(f"T{tensor.dtype}{tuple(tensor.shape)}".encode())
        if tensor.numel():
            flat = tensor.cpu().contiguous().reshape(-1)
            h.update(flat.view(torch.uint8).numpy().tobytes())
    elif isinstance(value, Mapping):
        h.update(b"{")
        for key in sorted(value, key=repr):
            h.update(repr(key).encode())
            _update(h, value[key])
        h.update(b"}")
    elif isinstance(value, (list, tuple)):
        h.update(b"[")
        for item in value:
            _update(h, item)
        h.update(b"]")
    else:
        h.update(repr(value).encode())


def value_digest(value: Any) -> str:
    """Hash of every tensor's dtype, shape and bytes and every other leaf's ``repr``, in a stable order."""
    h = new_hasher()
    _update(h, value)
    return h.hexdigest()[:DIGEST_CHARS]


def batch_digest(batch: Any) -> str:
    """The batch's bytes: equal digests mean the same samples, in the same order, with the same augmentation."""
    return value_digest(batch)


def weights_digest(module: torch.nn.Module) -> str:
    return value_digest(module.state_dict())


def optimizer_digest(trainer: pl.Trainer) -> str:
    """Every optimizer's state and param groups (learning rates included)."""
    return value_digest([opt.state_dict() for opt in trainer.optimizers])


def scheduler_digest(trainer: pl.Trainer) -> str:
    """Every LR scheduler's own state (its step count, its schedule), apart from the optimizer's:
    a scheduler restored wrongly shows here a step before the learning rate it sets does."""
    return value_digest([config.scheduler.state_dict() for config in trainer.lr_scheduler_configs])


def metric_state_digest(module: torch.nn.Module) -> str | None:
    """The accumulated state of every torchmetrics ``Metric`` in the module (None without any).

    These states are not in ``state_dict`` (torchmetrics registers them non-persistent), yet an
    epoch-level metric computed after a resume depends on them."""
    states = {name: m.metric_state for name, m in module.named_modules() if isinstance(m, Metric)}
    return value_digest(states) if states else None


def rng_state_digest(generators: Mapping[str, torch.Generator] | None = None) -> str:
    """Every global RNG stream of this process plus the named generators the run registered."""
    state = capture_rng_state(generators)
    if not state["generators"]:
        return rng_digest(state)
    return value_digest([rng_digest(state), state["generators"]])


def parameter_norms(module: torch.nn.Module) -> dict[str, float]:
    """Per-tensor L2 norms in float64: comparable across devices where bitwise digests cannot be."""
    return {name: float(t.detach().double().norm()) for name, t in module.state_dict().items() if t.is_floating_point()}
