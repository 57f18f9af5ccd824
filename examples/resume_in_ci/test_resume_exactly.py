"""Exact resume as a test in your own suite: copy this file next to your tests.

Each check trains a few steps, kills the run for real (SIGKILL) at the named positions, resumes it
from its latest recoverable checkpoint and compares every batch, RNG stream, weight and optimizer
state with two uninterrupted runs. It fails with the first step and component that diverged.

    pip install lightning-field
    pytest -m resume            # just these checks (the fixture marks them)
    pytest -m resume --field-keep   # keep the evidence of a failing check in field-evidence-failures/

The module and the data are named by import path, or are module-level classes and functions like
the ones below: each run is its own process, which imports them by name.
"""

from __future__ import annotations

import random

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class NoisyRegression(Dataset):
    """A map-style dataset whose augmentation draws Python randomness in ``__getitem__``."""

    def __init__(self, size: int = 64) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, 8, generator=generator)
        self.y = self.x.sum(dim=1, keepdim=True)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index] * random.uniform(0.9, 1.1), self.y[index]


class Regressor(pl.LightningModule):
    """An ordinary user module: AdamW, OneCycleLR sized by estimated_stepping_batches, dropout."""

    def __init__(self, hidden: int = 16, lr: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Dropout(0.1), nn.Linear(hidden, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        return loss

    def configure_optimizers(self) -> dict:
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        total = int(self.trainer.estimated_stepping_batches)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=self.hparams.lr, total_steps=total)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class RegressionData(pl.LightningDataModule):
    def __init__(self, batch_size: int = 8, num_workers: int = 0) -> None:
        super().__init__()
        self.batch_size, self.num_workers = batch_size, num_workers

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            NoisyRegression(), batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )  # fmt: skip


def test_the_regressor_resumes_exactly_mid_epoch_and_at_an_epoch_end(field_evidence) -> None:
    # 64 samples / 8 per batch = 8 steps per epoch; 12 steps cross one epoch end.
    evidence = field_evidence(Regressor, RegressionData, steps=12, kill_at=["mid-epoch", "epoch-end"])
    assert evidence.verdict == "exact"


def test_python_randomness_in_two_loader_workers_resumes_exactly(field_evidence) -> None:
    field_evidence(Regressor, RegressionData, data_kwargs={"num_workers": 2})


@pytest.mark.skipif(not torch.distributed.is_available(), reason="needs torch.distributed (gloo)")
def test_the_regressor_resumes_exactly_on_two_ddp_ranks(field_evidence) -> None:
    field_evidence(Regressor, RegressionData, devices=2)
