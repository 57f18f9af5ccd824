"""One rank count of a scaling study: ``python -m lightning_field.baseline.scale_worker SPEC``.

The parent (``field scale``) writes a JSON spec per rank count; this job builds the workload from
its config (``_target_`` dicts, composed by the parent from the same groups as ``field-train``) and
trains it for a fixed number of optimizer steps with Lightning's DDP launcher. The launcher re-runs
this same command for the other ranks, so a spec is all each rank needs.

Why the study controls the data and the model the way it does:

* the loader is rebuilt over the workload's own dataset and collate function, with a
  ``DistributedSampler`` that does not shuffle, so rank ``r`` reads the indices ``r, r+N, r+2N, ...``:
  the first optimizer step covers samples ``0..E-1`` at *every* rank count, which is what makes the
  step-1 gradients comparable. The sampler records the indices each rank was handed, so the study
  checks this instead of assuming it;
* dropout modules are switched off (``p=0``, stated in the record) and every rank runs one intra-op
  thread, so the only difference between rank counts is the number of processes and the reduction
  order. Randomness the data itself draws per sample still differs, and then the gradient check
  fails and says so: that workload cannot show equivalence;
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
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from hydra.utils import instantiate
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset, Sampler, default_collate
from typing_extensions import override

from lightning_field.compat import lightning as internals
from lightning_field.compat.torch import is_dropout
from lightning_field.core.distributed import end_process_groups, exit_finished_process
from lightning_field.profiling.comm import CommTimer, ProfiledDDPStrategy
from lightning_field.profiling.throughput import batch_counts
from lightning_field.profiling.timers import FetchClock
from lightning_field.workloads.demo import NoisyRegressionDataset

GRADIENT_FILE = "grad-step1.pt"


class ScaleWorkloadError(RuntimeError):
    """The workload cannot be studied as configured; the message names what to change."""


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
    model: dict[str, Any] = field(default_factory=dict)  # a resolved config with ``_target_``
    data: dict[str, Any] = field(default_factory=dict)  # a LightningDataModule's config with ``_target_``
    seed: int = 0
    disable_dropout: bool = True
    accelerator: str = "cpu"  # "gpu": one CUDA device per rank over NCCL
    stall_rank: int | None = None
    stall_s: float = 0.0

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> ScaleRunSpec:
        return cls(**json.loads(Path(path).read_text()))


class ExactRegressionData(pl.LightningDataModule):
    """The demo regression data without its per-sample jitter: the built-in ``field scale`` workload.

    The demo's jitter draws from the process's RNG in the order samples are read, which differs
    between rank counts; without it, sample ``i`` is the same tensor at every rank count."""

    def __init__(self, size: int = 4096, features: int = 16, batch_size: int = 32, seed: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage: str) -> None:
        base = NoisyRegressionDataset(self.hparams["size"], self.hparams["features"], self.hparams["seed"])
        self.train_set: Dataset = torch.utils.data.TensorDataset(base.x, base.y)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.hparams["batch_size"])


class RecordingSampler(Sampler[int]):
    """Hands out ``inner``'s indices and keeps the first ``count``: the samples of the first optimizer step.

    Samplers are iterated in the main process even with loader workers, so the record is complete."""

    def __init__(self, inner: Sampler[int], count: int) -> None:
        self.inner, self.count = inner, count
        self.first: list[int] = []

    def __iter__(self) -> Iterator[int]:
        for index in self.inner:
            if len(self.first) < self.count:
                self.first.append(int(index))
            yield index

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]  # the wrapped DistributedSampler is sized


class StallingCollate:
    """The workload's collate function, made ``seconds`` slower per batch: an injected input-pipeline stall.

    A class, not a closure, so loader workers can pickle it."""

    def __init__(self, collate: Callable[[list[Any]], Any], seconds: float) -> None:
        self.collate, self.seconds = collate, seconds

    def __call__(self, samples: list[Any]) -> Any:
        time.sleep(self.seconds)
        return self.collate(samples)


class StudyData(pl.LightningDataModule):
    """The workload's training data, re-batched for the study: its dataset, collate function and worker
    count, ``per_rank_batch`` samples per batch, an unshuffled sampler, and the stall on ``stall_rank``."""

    def __init__(self, workload: pl.LightningDataModule, spec: ScaleRunSpec) -> None:
        super().__init__()
        self.workload, self.spec = workload, spec
        self.sampler: RecordingSampler | None = None

    def prepare_data(self) -> None:
        self.workload.prepare_data()

    def setup(self, stage: str) -> None:
        self.workload.trainer = self.trainer
        self.workload.setup("fit")
        source = self.workload.train_dataloader()
        dataset = getattr(source, "dataset", None)
        if dataset is None or isinstance(dataset, IterableDataset):
            raise ScaleWorkloadError(
                f"{type(self.workload).__name__}.train_dataloader() must return a DataLoader over a map-style "
                "dataset: the study re-batches it so that every rank count reads the same samples"
            )
        needed = self.spec.ranks * self.spec.per_rank_batch * self.spec.accumulation * self.spec.steps
        if len(dataset) < needed:
            raise ScaleWorkloadError(
                f"the training dataset has {len(dataset)} samples; {self.spec.steps} steps at effective batch "
                f"{needed // self.spec.steps} need {needed} (lower --steps or use a larger dataset)"
            )
        self.dataset = dataset
        self.collate = source.collate_fn or default_collate
        self.num_workers = source.num_workers
        self.pin_memory = source.pin_memory

    def train_dataloader(self) -> DataLoader:
        # An explicit unshuffled sampler (Lightning's own injection is switched off in the Trainer):
        # rank r reads r, r+N, r+2N, ..., so the first step's samples are 0..E-1 at every rank count.
        trainer = self.trainer
        world, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        inner: DistributedSampler[int] = DistributedSampler(
            self.dataset, num_replicas=world, rank=rank, shuffle=False, drop_last=True
        )
        self.sampler = RecordingSampler(inner, self.spec.per_rank_batch * self.spec.accumulation)
        stalled = self.spec.stall_rank is not None and rank == self.spec.stall_rank and self.spec.stall_s > 0
        collate = StallingCollate(self.collate, self.spec.stall_s) if stalled else self.collate
        return DataLoader(
            self.dataset,
            batch_size=self.spec.per_rank_batch,
            sampler=self.sampler,
            collate_fn=collate,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
        )


def disable_dropout(model: nn.Module) -> int:
    """Set every dropout module's ``p`` to 0; returns how many had a non-zero ``p`` (the record states it)."""
    count = 0
    for module in model.modules():
        if is_dropout(module) and module.p > 0:
            module.p = 0.0
            count += 1
    return count


class ScaleClock(Callback):
    """Per optimizer step on this rank: wall time, data wait, exposed gradient communication, samples.

    Wall time runs from the end of the previous optimizer step to the end of this one, so it includes
    the fetch of this step's batches; data wait is the time inside the loader's ``next()``; exposed
    communication is what ``ProfiledDDPStrategy``'s bucket timer measured from the last gradient
    bucket becoming ready to its all-reduce finishing (time this rank spent waiting for its peers
    or the network). Compute is the remainder. Nothing synchronises: these are host clocks only.
    """

    def __init__(self, spec: ScaleRunSpec, dropout_disabled: int = 0) -> None:
        self.spec = spec
        self.dropout_disabled = dropout_disabled
        self.rows: list[dict[str, Any]] = []
        self._comm: CommTimer | None = None
        self._last = 0.0
        self._fetch = FetchClock()
        self._samples = 0
        self._step = -1

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._fetch.install(trainer)

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
        self._samples += batch_counts(batch)[0]

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self._step:
            return  # accumulating: the optimizer step is not done yet
        now = time.perf_counter()
        self.rows.append(
            {"step": self._step, "wall_s": now - self._last, "data_s": self._fetch.take(), "samples": self._samples}
        )
        self._last, self._samples = now, 0

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
        datamodule = internals.trainer_datamodule(trainer)
        sampler = datamodule.sampler if isinstance(datamodule, StudyData) else None
        record = {
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "per_rank_batch": self.spec.per_rank_batch,
            "accumulation": trainer.accumulate_grad_batches,
            "first_step_indices": sampler.first if sampler is not None else [],
            "dropout_modules_disabled": self.dropout_disabled,
            "steps": self.rows,
        }
        Path(self.spec.out_dir, rank_file(trainer.global_rank)).write_text(json.dumps(record))


class GradientCapture(Callback):
    """Saves the first optimizer step's gradient on rank 0, after the all-reduce and accumulation, and
    whether that step drew from torch's RNG.

    ``on_before_optimizer_step`` runs after the closure's backward (and so after DDP's all-reduce of
    the last micro-batch), before the optimizer changes anything: the gradient the step will apply.
    A step that draws random numbers (dropout, including functional dropout such as
    ``scaled_dot_product_attention(dropout_p=...)``, noise) cannot give the same gradient at another
    rank count, whatever the reduction order; recording the draw lets a failed check say why."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._rng_before: torch.Tensor | None = None

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == 0 and self._rng_before is None:
            self._rng_before = _rng_state(pl_module.device)

    @override
    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if trainer.global_step != 0 or not trainer.is_global_zero:
            return
        grads = [p.grad.detach().reshape(-1).clone() for p in pl_module.parameters() if p.grad is not None]
        torch.save(torch.cat(grads).cpu(), self.path)  # the parent compares on the CPU
        drew = self._rng_before is not None and not torch.equal(self._rng_before, _rng_state(pl_module.device))
        self.path.with_suffix(".json").write_text(json.dumps({"step1_drew_random_numbers": drew}))


def _rng_state(device: torch.device) -> torch.Tensor:
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def run(spec: ScaleRunSpec) -> int:
    torch.set_num_threads(1)  # one thread per rank: the study scales processes, not intra-op threads
    out = Path(spec.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # As with `python -m`, the user's modules in the directory the study was started from import by _target_.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    pl.seed_everything(spec.seed, verbose=False)  # same initial weights at every rank count
    model = instantiate(spec.model, _convert_="all")
    workload_data = instantiate(spec.data, _convert_="all")
    dropped = disable_dropout(model) if spec.disable_dropout else 0
    trainer = pl.Trainer(
        default_root_dir=str(out),
        accelerator=spec.accelerator,
        devices=spec.ranks,
        strategy=ProfiledDDPStrategy(process_group_backend="nccl" if spec.accelerator == "gpu" else "gloo"),
        max_steps=spec.steps,
        accumulate_grad_batches=spec.accumulation,
        limit_val_batches=0,
        use_distributed_sampler=False,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ScaleClock(spec, dropped), GradientCapture(out / GRADIENT_FILE)],
    )
    trainer.fit(model, datamodule=StudyData(workload_data, spec))
    end_process_groups()  # every rank is past its collectives; gloo torn down at exit can abort (-6)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m lightning_field.baseline.scale_worker SPEC.json", file=sys.stderr)
        return 2
    return run(ScaleRunSpec.read(args[0]))


if __name__ == "__main__":
    exit_finished_process(main())
