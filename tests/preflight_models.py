"""A small classifier and its data, with faults to seed, for the preflight tests (importable by _target_)."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(pl.LightningModule):
    """``detach=True`` computes the loss on detached logits: it cannot learn anything."""

    def __init__(self, features: int = 16, hidden: int = 32, dropout: float = 0.0, lr: float = 0.01,
                 num_classes: int = 4, detach: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.save_hyperparameters()
        self.num_classes = num_classes
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self.net(x)
        if self.hparams.detach:
            logits = logits.detach().requires_grad_()
        return nn.functional.cross_entropy(logits, y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


class ClassificationData(pl.LightningDataModule):
    """``fault``: none | label_out_of_range | nan_input | duplicates (val holds copies of train samples)."""

    def __init__(self, size: int = 256, features: int = 16, batch_size: int = 16, num_workers: int = 0,
                 stateful: bool = True, seed: int = 0, fault: str = "none") -> None:  # fmt: skip
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage: str) -> None:
        gen = torch.Generator().manual_seed(self.hparams.seed)
        n, f = self.hparams.size, self.hparams.features
        x, vx = torch.randn(n, f, generator=gen), torch.randn(64, f, generator=gen)
        y, vy = torch.randint(0, 4, (n,), generator=gen), torch.randint(0, 4, (64,), generator=gen)
        if self.hparams.fault == "label_out_of_range":
            y[7] = 9
        elif self.hparams.fault == "nan_input":
            x[5, 3] = float("nan")
        elif self.hparams.fault == "duplicates":
            vx[:3], vy[:3] = x[:3], y[:3]
        self.train_set, self.val_set = TensorDataset(x, y), TensorDataset(vx, vy)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=False)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)


class NoisyStepClassifier(Classifier):
    """Functional dropout inside the step, which no module switch reaches: its gradients cannot match
    across rank counts, and a scaling study has to say why."""

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(nn.functional.dropout(x, 0.2, training=True)), y)
