"""A user's script as they write it: Lightning's BoringModel, a checkpoint callback, ``fit``, and
code after ``fit`` that must only run on a finished model. It signals itself during step 4."""

from __future__ import annotations

import os
import signal
import sys

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_field import ManifestCheckpoint


class SignalAtStep(Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == 3:
            os.kill(os.getpid(), signal.SIGTERM)


if __name__ == "__main__":
    root, which = sys.argv[1], sys.argv[2]
    pl.seed_everything(7)  # BoringModel draws its dataset at random: the same data in every attempt
    kind = ManifestCheckpoint if which == "manifest" else ModelCheckpoint
    checkpoint = kind(dirpath=os.path.join(root, "ckpts"), every_n_train_steps=10, save_last=True)
    trainer = pl.Trainer(
        default_root_dir=root,
        max_steps=8,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[checkpoint, SignalAtStep()],
    )
    trainer.fit(BoringModel(), ckpt_path="last")
    print(f"AFTER-FIT at step {trainer.global_step}", flush=True)
