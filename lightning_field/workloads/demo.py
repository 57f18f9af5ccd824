"""A small, self-contained workload for examples, tests and the default job: no download needed.

The model has dropout and the dataset augments with Python *and* NumPy randomness, so every RNG
stream a real run draws from is exercised, on CPU, in seconds.
"""

from __future__ import annotations

import random
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchdata.stateful_dataloader import StatefulDataLoader


class NoisyRegressionDataset(Dataset):
    """``y = x·w + noise`` with random per-sample jitter from ``random`` and ``numpy``."""

    def __init__(self, size: int = 256, features: int = 16, seed: int = 0, w: torch.Tensor | None = None) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, features, generator=gen)
        drawn = torch.randn(features, 1, generator=gen)
        self.w = drawn if w is None else w  # a validation split shares the training set's function
        self.y = self.x @ self.w + 0.1 * torch.randn(size, 1, generator=gen)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        jitter = random.gauss(0.0, 0.05) + float(np.random.normal(0.0, 0.05))
        return self.x[index] + jitter, self.y[index]


class DemoDataModule(pl.LightningDataModule):
    def __init__(
        self,
        size: int = 256,
        features: int = 16,
        batch_size: int = 8,
        num_workers: int = 0,
        stateful: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage: str) -> None:
        self.train_set = NoisyRegressionDataset(self.hparams["size"], self.hparams["features"], self.hparams["seed"])
        features, seed = self.hparams["features"], self.hparams["seed"]
        self.val_set = NoisyRegressionDataset(64, features, seed + 1, w=self.train_set.w)

    def train_dataloader(self) -> DataLoader:
        loader_cls = StatefulDataLoader if self.hparams["stateful"] else DataLoader
        extra: dict[str, Any] = {"persistent_workers": False} if self.hparams["num_workers"] else {}
        return loader_cls(
            self.train_set,
            batch_size=self.hparams["batch_size"],
            shuffle=True,
            num_workers=self.hparams["num_workers"],
            **extra,
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=32)


class DemoRegressor(pl.LightningModule):
    """A 2-layer MLP with dropout, AdamW and a step LR schedule."""

    def __init__(self, features: int = 16, hidden: int = 32, dropout: float = 0.2, lr: float = 1e-2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams["lr"])
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.9)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class DemoShardedRegressor(DemoRegressor):
    """The demo model with its parameters (and so its optimizer state) sharded by FSDP2 over the
    ``data_parallel`` mesh dimension of Lightning's ``ModelParallelStrategy``; runs on CPU with gloo."""

    def configure_model(self) -> None:
        # Only the sharded variant needs FSDP2: a torch build without distributed support, or one
        # before 2.6 (where fully_shard was not public), still imports the other demo workloads.
        from torch.distributed.fsdp import fully_shard

        assert self.device_mesh is not None, "ModelParallelStrategy sets the device mesh before configure_model"
        mesh = self.device_mesh["data_parallel"]
        for layer in self.net:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(self.net, mesh=mesh)
