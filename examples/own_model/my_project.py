"""Your own LightningModule and DataModule, run by every lightning_field app without a YAML file.

Their constructors share nothing with the shipped models: ``model._target_=`` selects the class
with its own defaults, and only the keys you give are passed on (type-checked against the
signature first). From this directory:

    field-train    model._target_=my_project.MyModule data._target_=my_project.MyData run_name=mine
    field-evidence model._target_=my_project.MyModule data._target_=my_project.MyData model.width=32
    field preflight model._target_=my_project.MyModule data._target_=my_project.MyData
    field scale --ranks 1,2 model._target_=my_project.MyModule data._target_=my_project.MyData
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class MyModule(pl.LightningModule):
    """A small regressor: ``width`` hidden units, plain SGD at ``lr``."""

    def __init__(self, width: int = 16, lr: float = 1e-2, features: int = 8) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(features, width), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(width, 1)
        )

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


class MyData(pl.LightningDataModule):
    """``n`` samples of a noisy linear target, split 80/20, in plain shuffled DataLoaders."""

    def __init__(self, n: int = 320, batch_size: int = 32, features: int = 8) -> None:
        super().__init__()
        self.n, self.batch_size, self.features = n, batch_size, features

    def setup(self, stage: str) -> None:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(self.n, self.features, generator=g)
        y = x @ torch.linspace(-1, 1, self.features).unsqueeze(1) + 0.1 * torch.randn(self.n, 1, generator=g)
        cut = self.n * 4 // 5
        self.train_set, self.val_set = TensorDataset(x[:cut], y[:cut]), TensorDataset(x[cut:], y[cut:])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size)
