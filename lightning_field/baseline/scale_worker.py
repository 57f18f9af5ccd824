"""One rank count of a scaling study: ``python -m lightning_field.baseline.scale_worker SPEC``.

The parent (``field scale``) writes a JSON spec per rank count; this job trains the demo regressor
for a fixed number of optimizer steps with Lightning's DDP launcher on CPU over gloo. The launcher
re-runs this same command for the other ranks, so a spec is all each rank needs.

Why the workload is shaped the way it is:

* the dataset returns each sample's index and has no per-sample random jitter, and the loader's
  ``DistributedSampler`` does not shuffle, so rank ``r`` reads the indices ``r, r+N, r+2N, ...``:
  the first optimizer step covers samples ``0..E-1`` at *every* rank count, which is what makes
  the step-1 gradients comparable;
* dropout is 0 and every rank runs one intra-op thread, so the only difference between rank counts
  is the number of processes (and the reduction order), not randomness or thread pools;
* the same ``ProfiledDDPStrategy`` is used at every rank count, 1 included, so the 1-rank baseline
  pays the same wrapper overhead and its gradient all-reduce is timed the same way.

Each rank writes ``rank-NNNNN.json`` (per-step wall, data wait, exposed communication, samples, the
indices of its first step); rank 0 also writes ``grad-step1.pt``, the flattened gradient of the first
optimizer step after the all-reduce and any accumulation.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, default_collate
from typing_extensions import override

from lightning_field.checkpoint import lightning_internals as internals
from lightning_field.demo import DemoRegressor, NoisyRegressionDataset
from lightning_field.profiling.comm import CommTimer, ProfiledDDPStrategy

GRADIENT_FILE = "grad-step1.pt"


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.json"


@dataclass
class ScaleRunSpec:
    """One rank count of the study; written by the parent, read by every rank."""

    out_dir: str
    ranks: int
    per_rank_batch: int
    accumulation: int
    steps: int
    dataset_size: int
    features: int = 16
    hidden: int = 32
    seed: int = 0
    stall_rank: int | None = None
    stall_s: float = 0.0

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> ScaleRunSpec:
        return cls(**json.loads(Path(path).read_text()))


class IndexedRegression(Dataset):
    """The demo regression data without its per-sample jitter, plus each sample's index.

    The jitter draws from the process's RNG in the order samples are read, which differs between
    rank counts; without it, sample ``i`` is the same tensor at every rank count."""

    def __init__(self, size: int, features: int, seed: int) -> None:
        base = NoisyRegressionDataset(size, features, seed)
        self.x, self.y = base.x, base.y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.x[index], self.y[index], index


class ScaleData(pl.LightningDataModule):
    """Unshuffled batches of ``per_rank_batch``; on ``stall_rank`` every batch takes ``stall_s`` longer."""

    def __init__(self, spec: ScaleRunSpec) -> None:
        super().__init__()
        self.spec = spec

    def setup(self, stage: str) -> None:
        self.train_set = IndexedRegression(self.spec.dataset_size, self.spec.features, self.spec.seed)

    def _collate(self, samples: list[Any]) -> Any:
        # An injected input-pipeline stall: the loader of one rank sleeps per batch.
        trainer = self.trainer
        if self.spec.stall_rank is not None and trainer is not None and trainer.global_rank == self.spec.stall_rank:
            time.sleep(self.spec.stall_s)
        return default_collate(samples)

    def train_dataloader(self) -> DataLoader:
        # An explicit unshuffled sampler (Lightning's own injection is switched off in the Trainer):
        # rank r reads r, r+N, r+2N, ..., so the first step's samples are 0..E-1 at every rank count.
        trainer = self.trainer
        world, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        sampler = DistributedSampler(self.train_set, num_replicas=world, rank=rank, shuffle=False, drop_last=True)
        return DataLoader(
            self.train_set, batch_size=self.spec.per_rank_batch, sampler=sampler, collate_fn=self._collate
        )


class ScaleRegressor(DemoRegressor):
    """The demo MLP (dropout 0) on ``(x, y, index)`` batches."""

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y, _ = batch
        return nn.functional.mse_loss(self(x), y)


class ScaleClock(Callback):
    """Per optimizer step on this rank: wall time, data wait, exposed gradient communication, samples.

    Wall time runs from the end of the previous optimizer step to the end of this one, so it includes
    the fetch of this step's batches; data wait is the time inside the loader's ``next()``; exposed
    communication is what ``ProfiledDDPStrategy``'s bucket timer measured from the last gradient
    bucket becoming ready to its all-reduce finishing (time this rank spent waiting for its peers
    or the network). Compute is the remainder. Nothing synchronises: these are host clocks only.
    """

    def __init__(self, spec: ScaleRunSpec) -> None:
        self.spec = spec
        self.rows: list[dict[str, Any]] = []
        self.first_indices: list[int] = []
        self._comm: CommTimer | None = None
        self._last = 0.0
        self._fetch_started: float | None = None
        self._data_s = 0.0
        self._samples = 0
        self._step = -1

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        internals.install_fetch_hook(trainer, "before", self._before_fetch)
        internals.install_fetch_hook(trainer, "after", self._after_fetch)

    def _before_fetch(self) -> None:
        self._fetch_started = time.perf_counter()

    def _after_fetch(self) -> None:
        if self._fetch_started is not None:
            self._data_s += time.perf_counter() - self._fetch_started
            self._fetch_started = None

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        strategy = trainer.strategy
        self._comm = strategy.comm_timer if isinstance(strategy, ProfiledDDPStrategy) else None
        self._last = time.perf_counter()

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step != self._step:
            self._step = trainer.global_step
            if self._comm is not None:
                self._comm.begin_step(self._step)
        self._samples += int(batch[0].shape[0])
        if trainer.global_step == 0:
            self.first_indices.extend(int(i) for i in batch[2].tolist())

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self._step:
            return  # accumulating: the optimizer step is not done yet
        now = time.perf_counter()
        self.rows.append(
            {"step": self._step, "wall_s": now - self._last, "data_s": self._data_s, "samples": self._samples}
        )
        self._last, self._data_s, self._samples = now, 0.0, 0

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        exposed: dict[int, float] = {}
        if self._comm is not None:
            self._comm.begin_step(-1)  # releases the last step's buckets to ``completed()``
            exposed = {s["step"]: s["exposed_s"] or 0.0 for s in self._comm.completed()}
        for row in self.rows:
            row["comm_s"] = exposed.get(row["step"], 0.0)
            row["comm_measured"] = row["step"] in exposed
            row["compute_s"] = max(row["wall_s"] - row["data_s"] - row["comm_s"], 0.0)
        record = {
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "per_rank_batch": self.spec.per_rank_batch,
            "accumulation": trainer.accumulate_grad_batches,
            "first_step_indices": self.first_indices,
            "steps": self.rows,
        }
        Path(self.spec.out_dir, rank_file(trainer.global_rank)).write_text(json.dumps(record))


class GradientCapture(Callback):
    """Saves the first optimizer step's gradient on rank 0, after the all-reduce and accumulation.

    ``on_before_optimizer_step`` runs after the closure's backward (and so after DDP's all-reduce of
    the last micro-batch), before the optimizer changes anything: the gradient the step will apply."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @override
    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if trainer.global_step != 0 or not trainer.is_global_zero:
            return
        grads = [p.grad.detach().reshape(-1).clone() for p in pl_module.parameters() if p.grad is not None]
        torch.save(torch.cat(grads), self.path)


def run(spec: ScaleRunSpec) -> int:
    torch.set_num_threads(1)  # one thread per rank: the study scales processes, not intra-op threads
    out = Path(spec.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pl.seed_everything(spec.seed, verbose=False)  # same initial weights at every rank count
    model = ScaleRegressor(features=spec.features, hidden=spec.hidden, dropout=0.0)
    trainer = pl.Trainer(
        default_root_dir=str(out),
        accelerator="cpu",
        devices=spec.ranks,
        strategy=ProfiledDDPStrategy(process_group_backend="gloo"),
        max_steps=spec.steps,
        accumulate_grad_batches=spec.accumulation,
        limit_val_batches=0,
        use_distributed_sampler=False,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ScaleClock(spec), GradientCapture(out / GRADIENT_FILE)],
    )
    trainer.fit(model, datamodule=ScaleData(spec))
    # Lightning leaves the gloo group up; torn down by interpreter exit instead, its threads can
    # abort the process ("terminate called without an active exception", exit -6) after the work
    # is done. Every rank reaches this line, so the collective teardown is safe.
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m lightning_field.baseline.scale_worker SPEC.json", file=sys.stderr)
        return 2
    return run(ScaleRunSpec.read(args[0]))


if __name__ == "__main__":
    sys.exit(main())
