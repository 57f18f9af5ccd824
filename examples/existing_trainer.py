"""An ordinary Lightning script, and the few lines that add lightning_field to it.

    python examples/existing_trainer.py                     # the recommended run: ~3 min to target on 2 CPU cores
    python examples/existing_trainer.py --tiny              # a smoke run: seconds
    python examples/existing_trainer.py --root runs/x       # killed? run the same command again: it resumes

It trains a byte-level GPT (``lightning_field.workloads.char_gpt``) on the Python standard library's own
source, read from this interpreter's installation: no download. Everything below is plain
Lightning except the lines marked ``# + lightning_field``: an atomic, verified checkpoint that holds
the RNG and data position (so a rerun after a kill continues exactly), time to the target
validation loss across restarts, throughput and straggler reports, and a checkpoint interval
tuned from the measured save cost.

``--max-steps`` also sets the length of the cosine LR schedule, so it is part of the run's
configuration: resuming with a different value is refused with a diff naming ``max_steps``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.loggers import CSVLogger

from lightning_field import CheckpointCadence, ManifestCheckpoint, StragglerMonitor, TimeToQuality  # + lightning_field
from lightning_field.workloads.char_gpt import (
    RECOMMENDED_TARGET_VAL_LOSS,
    TINY_DATA,
    TINY_MODEL,
    TINY_TARGET_VAL_LOSS,
    CharGPT,
)
from lightning_field.workloads.stdlib_text import StdlibTextDataModule


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-steps", type=int, default=None, help="optimizer steps (default: 1000, or 40 with --tiny)")
    p.add_argument("--tiny", action="store_true", help="a 1-layer model on 200 kB of text, for smoke tests")
    p.add_argument("--root", type=Path, default=Path("runs/char_gpt"), help="run directory (logs, checkpoints)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", type=float, default=None, help="target val_loss in nats per byte")
    p.add_argument("--val-every", type=int, default=None, help="validate every N steps (default: 25, or 5 with --tiny)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> pl.Trainer:
    args = parse_args(argv)
    data_kwargs: dict[str, Any] = dict(TINY_DATA) if args.tiny else {}
    model_kwargs: dict[str, Any] = dict(TINY_MODEL) if args.tiny else {}
    if args.max_steps is not None:
        model_kwargs["max_steps"] = args.max_steps
    target = (
        args.target if args.target is not None else (TINY_TARGET_VAL_LOSS if args.tiny else RECOMMENDED_TARGET_VAL_LOSS)
    )
    val_every = args.val_every or (5 if args.tiny else 25)

    pl.seed_everything(args.seed, workers=True)
    datamodule = StdlibTextDataModule(seed=args.seed, **data_kwargs)
    model = CharGPT(**model_kwargs)
    print(datamodule.corpus_info.describe(), flush=True)

    trainer = pl.Trainer(
        default_root_dir=args.root,
        max_steps=model.hparams.max_steps,
        val_check_interval=val_every,
        logger=CSVLogger(args.root, name="logs"),  # logs/version_N/metrics.csv, one per attempt
        enable_progress_bar=not args.tiny,
        callbacks=[
            ManifestCheckpoint(  # + lightning_field
                dirpath=args.root / "checkpoints", every_n_train_steps=5 if args.tiny else 100, save_last=True
            ),
            CheckpointCadence(mtbf_hours=6, max_steps=10 if args.tiny else 250),  # + lightning_field
            TimeToQuality(monitor="val_loss", target=target, mode="min"),  # + lightning_field
            StragglerMonitor(report_interval_s=5 if args.tiny else 60),  # + lightning_field
        ],
    )
    trainer.fit(model, datamodule=datamodule, ckpt_path="last")  # + lightning_field: ckpt_path="last"
    return trainer


if __name__ == "__main__":
    main()
