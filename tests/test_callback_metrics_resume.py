"""A resume puts back what ``trainer.callback_metrics`` held at the save: an epoch that ends without a
validation (``check_val_every_n_epoch=2``) still hands the last validation's values to the monitors
that read them at its end, as in the uninterrupted run.

Lightning's BoringModel with ``ReduceLROnPlateau(monitor="val_loss")`` stepped every epoch: stopped
mid-epoch after the first validation, then resumed with ``ckpt_path="last"``, beside the same stop and
resume through plain Lightning's ``ModelCheckpoint``, and an uninterrupted run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from conftest import assert_bitwise_equal
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from torch.utils.data import DataLoader, TensorDataset

from lightning_field import ManifestCheckpoint, ResumeMismatchError
from lightning_field.state.rank_tracking import RankStateTracker
from lightning_field.state.rng import capture_rng_state

BATCHES, EPOCHS, STOP_AT = 4, 4, 10  # validation after epochs 1 and 3 (0-based); stopped inside epoch 2


class PlateauOnValidation(BoringModel):
    """BoringModel whose learning rate halves when ``val_loss`` stops improving, checked every epoch."""

    def val_dataloader(self) -> DataLoader:
        # BoringModel's draws its data from the global generator when Lightning first builds it, at the
        # first validation: a resumed run builds it at its own first one, from another point of the stream.
        return DataLoader(TensorDataset(torch.randn(64, 32, generator=torch.Generator().manual_seed(1))), batch_size=2)

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        out = super().validation_step(batch[0], batch_idx)
        self.log("val_loss", out["x"])
        return out

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0, factor=0.5)
        # Not strict: epoch 0 ends before any validation, and Lightning skips the step there with a warning.
        config = {"scheduler": plateau, "monitor": "val_loss", "strict": False}
        return {"optimizer": optimizer, "lr_scheduler": config}


class EpochEnds(Callback):
    """The learning rate and the monitored value each epoch's end leaves."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[float, float | None]] = {}

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        val = trainer.callback_metrics.get("val_loss")
        lr = trainer.optimizers[0].param_groups[0]["lr"]
        self.seen[trainer.current_epoch] = (lr, None if val is None else float(val))


def fit(root: Path, checkpoint: Callback, max_steps: int = -1, resume: bool = False) -> tuple[BoringModel, EpochEnds]:
    pl.seed_everything(0)
    model, ends = PlateauOnValidation(), EpochEnds()
    trainer = pl.Trainer(
        default_root_dir=root, max_epochs=EPOCHS, max_steps=max_steps, limit_train_batches=BATCHES,
        limit_val_batches=2, check_val_every_n_epoch=2, accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, callbacks=[checkpoint, ends],
    )  # fmt: skip
    trainer.fit(model, ckpt_path="last" if resume else None)
    return model, ends


@pytest.mark.slow  # six short fits, in-process
def test_a_resume_in_an_epoch_without_validation_hands_its_end_the_last_validations_value_as_uninterrupted(
    tmp_path: Path,
) -> None:
    reference, reference_ends = fit(tmp_path / "reference", ManifestCheckpoint(dirpath=tmp_path / "reference-ckpt"))
    assert reference_ends.seen[2][1] == reference_ends.seen[1][1]  # epoch 2's end reads epoch 1's validation
    resumed_epochs = range(STOP_AT // BATCHES, EPOCHS)

    def ours() -> ManifestCheckpoint:
        return ManifestCheckpoint(dirpath=tmp_path / "ours", every_n_train_steps=2, snapshot_every_n_train_steps=None)

    fit(tmp_path / "ours", ours(), max_steps=STOP_AT)
    resumed, resumed_ends = fit(tmp_path / "ours", ours(), resume=True)
    assert resumed_ends.seen == {e: reference_ends.seen[e] for e in resumed_epochs}
    assert_bitwise_equal(resumed.state_dict(), reference.state_dict())

    def plain() -> ModelCheckpoint:
        return ModelCheckpoint(dirpath=tmp_path / "plain-ckpt", every_n_train_steps=2, save_last=True, save_top_k=-1)

    fit(tmp_path / "plain", plain(), max_steps=STOP_AT)
    _, plain_ends = fit(tmp_path / "plain", plain(), resume=True)
    # Plain Lightning: epoch 2 ends with no val_loss, its plateau step is skipped, the learning rate parts ways.
    assert plain_ends.seen[2][1] is None and plain_ends.seen != {e: reference_ends.seen[e] for e in resumed_epochs}


@pytest.mark.parametrize("hostile", ["not a mapping", {"callback_metrics": [1.0]}, {"callback_metrics": {"x": 1.0}},
                                     {"callback_metrics": {3: torch.tensor(1.0)}}])  # fmt: skip
def test_a_rank_files_malformed_callback_metrics_are_refused_by_name_before_training(hostile: object) -> None:
    with pytest.raises(ResumeMismatchError, match="ck/epoch=0-step=4: its rank file's epoch_metrics entry"):
        RankStateTracker().load({"rng": capture_rng_state(), "epoch_metrics": hostile}, {}, "ck/epoch=0-step=4")
