"""A multi-rank job for the straggler tests: steps of a known length, one rank slowed in data or compute.

Each rank writes its flagged list and stop status to result-rank<N>.json at the end;
rank 0 also dumps every report as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import lightning.pytorch as pl
import torch
from torch.utils.data import default_collate
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_field import ManifestCheckpoint
from lightning_field.core.distributed import end_process_groups, exit_finished_process
from lightning_field.profiling import ProfiledDDPStrategy, StragglerMonitor
from lightning_field.workloads.demo import DemoDataModule, DemoRegressor


def this_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


class TimedRegressor(DemoRegressor):
    """The demo MLP plus a fixed amount of 'compute' per step (a sleep: steady even on a busy machine)."""

    def __init__(self, base_s: float, slow_rank: int, slow_s: float) -> None:
        super().__init__()
        self.base_s, self.slow_rank, self.slow_s = base_s, slow_rank, slow_s

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        time.sleep(self.base_s + (self.slow_s if self.global_rank == self.slow_rank else 0.0))
        return super().training_step(batch, batch_idx)


class StallingData(DemoDataModule):
    """Collating a batch takes ``stall_s`` longer on one rank: its input pipeline is the bottleneck."""

    def __init__(self, stall_rank: int, stall_s: float) -> None:
        super().__init__(size=4096)
        self.stall_rank, self.stall_s = stall_rank, stall_s

    def _collate(self, samples):  # type: ignore[no-untyped-def]
        if this_rank() == self.stall_rank:
            time.sleep(self.stall_s)
        return default_collate(samples)

    def train_dataloader(self):  # type: ignore[no-untyped-def]
        return StatefulDataLoader(self.train_set, batch_size=8, shuffle=True, collate_fn=self._collate)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--kind", choices=["none", "data", "compute"], default="none")
    p.add_argument("--slow-rank", type=int, default=1)
    p.add_argument("--slow-s", type=float, default=0.02)
    p.add_argument("--base-s", type=float, default=0.04)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--interval-s", type=float, default=0.25)
    p.add_argument("--policy", default="warn")
    p.add_argument("--profiled-strategy", action="store_true")
    args = p.parse_args()

    torch.set_num_threads(1)
    pl.seed_everything(0)
    monitor = StragglerMonitor(report_interval_s=args.interval_s, policy=args.policy)
    checkpoint = ManifestCheckpoint(dirpath=os.path.join(args.root, "checkpoints"), every_n_train_steps=1000)
    strategy = ProfiledDDPStrategy() if args.profiled_strategy else "ddp"
    trainer = pl.Trainer(
        default_root_dir=args.root, max_steps=args.steps, accelerator="cpu", devices=args.devices, strategy=strategy,
        logger=False, enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
        callbacks=[monitor, checkpoint],
    )  # fmt: skip
    compute_s = args.slow_s if args.kind == "compute" else 0.0
    data_s = args.slow_s if args.kind == "data" else 0.0
    trainer.fit(TimedRegressor(args.base_s, args.slow_rank, compute_s), datamodule=StallingData(args.slow_rank, data_s))
    flagged = sorted({(f.rank, f.section) for r in monitor.reports for f in r.flagged})
    first = next((i for i, r in enumerate(monitor.reports) if r.flagged), None)
    # One file per rank: ranks share the launcher's stdout, where their lines can interleave mid-line.
    result = {"rank": trainer.global_rank, "reports": len(monitor.reports), "flagged": flagged, "first": first,
              "stopped": monitor.stopped_for is not None, "step": trainer.global_step}  # fmt: skip
    with open(os.path.join(args.root, f"result-rank{trainer.global_rank}.json"), "w") as f:
        json.dump(result, f)
    if trainer.is_global_zero:
        with open(os.path.join(args.root, "reports.json"), "w") as f:
            json.dump([r.to_dict() for r in monitor.reports], f, default=str)
    end_process_groups()  # after every rank's collectives: gloo torn down at exit can abort


if __name__ == "__main__":
    main()
    exit_finished_process(0)
