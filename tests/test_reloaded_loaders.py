"""``reload_dataloaders_every_n_epochs``: a resume compares the data of the same epoch, and continues exactly.

A user's curriculum builds each epoch's train loader anew (``reload_dataloaders_every_n_epochs=1``), its
data depending on the epoch. The data identity a checkpoint records is that of the loaders it was
trained on; a resume compares it with the loaders the resumed epoch is built with. Comparing epoch 0's
data with epoch 2's refused a valid resume.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_field import ManifestCheckpoint


class Curriculum(pl.LightningModule):
    """Each epoch's training data is new: drawn from a generator seeded by the epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader:
        x = torch.randn(32, 4, generator=torch.Generator().manual_seed(100 + self.current_epoch))
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, shuffle=True)


class Interrupt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: pl.Trainer, *_: Any) -> None:
        if trainer.global_step == self.step:
            raise KeyboardInterrupt


def _fit(root: Path, *callbacks: Callback, resume: bool = False, plain: bool = False) -> dict[str, torch.Tensor]:
    pl.seed_everything(3, verbose=False)
    model = Curriculum()
    kind = ModelCheckpoint if plain else ManifestCheckpoint
    settings = {} if plain else {"snapshot_every_n_train_steps": None}
    checkpoint = kind(dirpath=root / "ckpts", every_n_train_steps=3, **settings)
    trainer = pl.Trainer(
        max_epochs=4, reload_dataloaders_every_n_epochs=1, default_root_dir=root, logger=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[checkpoint, *callbacks],
    )  # fmt: skip
    trainer.fit(model, ckpt_path="last" if resume else None)
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("killed_at", [10, 12], ids=["mid-epoch-2", "at-the-end-of-epoch-2"])
def test_a_run_that_rebuilds_its_loaders_each_epoch_resumes_exactly_where_it_was_refused(
    tmp_path: Path, killed_at: int
) -> None:
    uninterrupted = _fit(tmp_path / "uninterrupted")
    plain = _fit(tmp_path / "plain", plain=True)
    assert all(torch.equal(uninterrupted[name], tensor) for name, tensor in plain.items()), "not plain Lightning's run"
    with pytest.raises(SystemExit):  # Lightning's way out of a KeyboardInterrupt
        _fit(tmp_path / "run", Interrupt(killed_at))
    resumed = _fit(tmp_path / "run", resume=True)  # was: data.fingerprint (checkpoint) != (this run), refused
    for name, tensor in uninterrupted.items():
        assert torch.equal(resumed[name], tensor), f"{name} differs from the uninterrupted run's"
