"""A BoringModel training job whose ``training_step`` raises at one step, every attempt alike.

Run again and again in the same run directory with ``ckpt_path="last"`` it is a crash loop: with
ManifestCheckpoint the no-progress guard ends it (exit status 77), with plain ModelCheckpoint
(``--checkpoint plain``) every attempt redoes the same steps and fails at the same one.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_field import ManifestCheckpoint, ResumeConfig, SnapshotConfig, TimeToQuality


class FailsAtStep(BoringModel):
    """Raises ``RuntimeError`` in training step ``fail_at`` (1-based: after ``fail_at - 1`` steps), in
    ``training_step`` or, with ``in_optimizer_step``, once its optimizer step began (no resume point
    can then be saved at the step reached: the next attempt redoes the steps since the last commit)."""

    def __init__(self, fail_at: int | None, in_optimizer_step: bool = False) -> None:
        super().__init__()
        self.fail_at = fail_at
        self.in_optimizer_step = in_optimizer_step

    def _fail_here(self) -> None:
        if self.fail_at is not None and self.trainer.global_step + 1 == self.fail_at:
            raise RuntimeError(f"injected failure in training step {self.fail_at}")

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> dict[str, torch.Tensor]:
        if not self.in_optimizer_step:
            self._fail_here()
        return super().training_step(batch, batch_idx)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.in_optimizer_step:
            self._fail_here()


class SayTrainStart(Callback):
    """Print the step training starts from (after the resume's load): the plain control's attempts."""

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        print(f"TRAIN-START step={trainer.global_step}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--fail-at-step", type=int, default=None, help="training step (1-based) that raises")
    p.add_argument("--fail-in-optimizer-step", action="store_true", help="fail after the optimizer step began")
    p.add_argument("--max-steps", type=int, default=40)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--checkpoint", choices=["manifest", "plain"], default="manifest")
    p.add_argument("--max-failed-attempts", type=int, default=3, help="ManifestCheckpoint argument; 0: None (off)")
    p.add_argument("--no-snapshots", action="store_true")
    p.add_argument("--devices", type=int, default=1, help="CPU ranks (DDP over gloo beyond 1)")
    p.add_argument("--code-dir", default=None, help="ManifestCheckpoint(code_dir); default: no git repository")
    p.add_argument("--allow-code-change", action="store_true", help="ResumeConfig(allow_mismatch=['code'])")
    p.add_argument("--time-to-quality", action="store_true", help="add TimeToQuality (progress events)")
    args = p.parse_args()

    pl.seed_everything(7)
    ckpt_dir = os.path.join(args.root, "checkpoints")
    callbacks: list[Callback] = [SayTrainStart()]
    if args.time_to_quality:
        callbacks.append(TimeToQuality(monitor="val_loss", target=0.0, progress_every_s=0.01))
    if args.checkpoint == "manifest":
        checkpoint = ManifestCheckpoint(
            dirpath=ckpt_dir, every_n_train_steps=args.every, save_top_k=-1, save_last=True,
            snapshots=SnapshotConfig(every_n_train_steps=None if args.no_snapshots else "auto"),
            resume=ResumeConfig(max_failed_attempts=args.max_failed_attempts or None,
                                allow_mismatch=["code"] if args.allow_code_change else []),
            # No git repository: the code identity stays put while the checkout around the test changes.
            code_dir=args.code_dir or tempfile.gettempdir(),
        )  # fmt: skip
        callbacks.append(checkpoint)
    else:
        callbacks.append(ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=args.every, save_top_k=-1,
                                         save_last=True))  # fmt: skip
    trainer = pl.Trainer(
        default_root_dir=args.root, accelerator="cpu", devices=args.devices, max_steps=args.max_steps,
        callbacks=callbacks,
        logger=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        limit_val_batches=0, deterministic=True,
    )  # fmt: skip
    trainer.fit(FailsAtStep(args.fail_at_step, args.fail_in_optimizer_step), ckpt_path="last")
    print(f"FINISHED at step {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
