"""Deliberately flawed workloads that the resume evidence must catch (imported by _target_ in child runs).

Each one is a realistic bug, not a contrived one: state kept in a plain attribute, a checkpoint
callback that forgets the RNG, randomness drawn from an unseeded generator.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from lightning_field import ManifestCheckpoint
from lightning_field.state.rank_tracking import RankStateTracker
from lightning_field.workloads.demo import DemoRegressor


class HiddenStateRegressor(DemoRegressor):
    """Keeps a step counter in a plain attribute that scales the loss: it is in no state_dict."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls = 0

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.calls += 1
        return super().training_step(batch, batch_idx) * (1.0 + 0.01 * self.calls)


class NondeterministicRegressor(DemoRegressor):
    """Perturbs its inputs with a generator seeded from the OS: no two processes draw alike."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.noise = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        x = x + 0.05 * torch.randn(x.shape, generator=self.noise)
        return super().training_step((x, y), batch_idx)


class RngForgettingTracker(RankStateTracker):
    """Saves each rank's RNG state but never puts it back."""

    def before_fetch(self) -> None:
        return


class RngForgettingCheckpoint(ManifestCheckpoint):
    """A checkpoint callback whose RNG restore is broken: it saves the RNG state but never puts it back."""

    def make_rank_tracker(self, generators: Any) -> RankStateTracker:
        return RngForgettingTracker(generators)


class ScatterRegressor(DemoRegressor):
    """Sums features into buckets with ``index_add_``: on CUDA the atomic adds land in a different
    order each run, so two identical runs differ in the last bits (ordinary GPU nondeterminism)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.repeat(1, 64).t()  # many rows per bucket, so many concurrent atomic adds
        buckets = torch.zeros(4, x.shape[0], device=x.device, dtype=x.dtype)
        index = torch.arange(wide.shape[0], device=x.device) % 4
        pooled = buckets.index_add_(0, index, wide).t().sum(dim=1, keepdim=True)
        return self.net(x) + 1e-3 * pooled
