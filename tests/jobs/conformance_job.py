"""Ordinary Lightning training code, as users write it, for the exact-resume conformance suite.

Each configuration is a LightningModule, its data and Trainer settings of the kind people already
have: a plain ``torch.utils.data.DataLoader``, ``OneCycleLR`` sized by
``estimated_stepping_batches``, ``ReduceLROnPlateau``, epoch-level logged metrics and torchmetrics,
gradient accumulation, common callbacks. Nothing here knows about lightning_field except the one
line a user adds: the checkpoint callback (``ManifestCheckpoint``, or Lightning's own
``ModelCheckpoint`` as the control).

A run is either uninterrupted, killed with SIGKILL at the start of a chosen step (after the save
before it committed), or resumed with ``ckpt_path="last"``. It writes what the comparison needs:
weights, optimizer and LR-scheduler state, callback state, the logged epoch metrics, and the step
it started from. Single-process runs are forked from the test (``run``); multi-rank runs are this
file as a script, launched by Lightning's own DDP launcher.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torchmetrics
from lightning.pytorch.callbacks import (
    Callback,
    EarlyStopping,
    LearningRateMonitor,
    ModelCheckpoint,
    StochasticWeightAveraging,
)
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import CombinedLoader
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

SAMPLES = 64
BATCH = 8


# ---------------------------------------------------------------------------------------- data
def classification_tensors(n: int = SAMPLES, seed: int = 0) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=gen)
    y = (x[:, 0] + x[:, 1] > 0).long() + (x[:, 2] > 1).long()
    return TensorDataset(x, y)


class JitteredDataset(Dataset):
    """Draws torch randomness per sample (an augmentation), in whichever process loads it."""

    def __init__(self, base: TensorDataset) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.base[i]
        return x + 0.05 * torch.randn(x.shape), y


class StreamDataset(IterableDataset):
    """A stream of samples with no state of its own (a loader can only replay it)."""

    def __init__(self, base: TensorDataset) -> None:
        self.base = base

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        start, step = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(start, len(self.base), step):
            yield self.base[i]


class ResumableStreamDataset(StreamDataset):
    """A stream that knows its own position (``state_dict``/``load_state_dict``), per process."""

    def __init__(self, base: TensorDataset) -> None:
        super().__init__(base)
        self.position = 0

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while self.position < len(self.base):
            item = self.base[self.position]
            self.position += 1
            yield item
        self.position = 0

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = int(state["position"])


class ShardedStream(IterableDataset):
    """A user's stream as large runs write one: reshuffled every epoch (seed + epoch), split between
    the DDP ranks and each rank's loader workers, its epoch and position in its own state_dict."""

    def __init__(self, base: TensorDataset, seed: int = 7) -> None:
        self.base, self.seed = base, seed
        self.epoch = 0
        self.position = 0

    def _mine(self) -> list[int]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        rank, world = (torch.distributed.get_rank(), torch.distributed.get_world_size()) if distributed else (0, 1)
        order = torch.randperm(len(self.base), generator=torch.Generator().manual_seed(self.seed + self.epoch))
        return order[rank * workers + worker :: world * workers].tolist()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        mine = self._mine()
        while self.position < len(mine):
            index = mine[self.position]
            self.position += 1
            yield self.base[index]
        self.position = 0
        self.epoch += 1

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


class SizedStreamDataset(StreamDataset):
    """A stream that says how long it is (Lightning then knows each epoch's last batch)."""

    def __len__(self) -> int:
        return len(self.base)


def make_loader(
    dataset: Dataset, kind: str, workers: int, shuffle: bool = True, batch_size: int = BATCH, drop_last: bool = False
) -> DataLoader:
    cls = StatefulDataLoader if kind == "stateful" else DataLoader
    shuffle = shuffle and not isinstance(dataset, IterableDataset)
    return cls(dataset, batch_size=batch_size, shuffle=shuffle, num_workers=workers, persistent_workers=workers > 0,
               drop_last=drop_last)  # fmt: skip


LIBRARY_STREAMS = ("hf", "hf_buffer_shuffle", "litdata", "webdataset")  # tests/jobs/stream_data.py
SHARDS_ENV = "CONFORMANCE_SHARDS"


class UserData(pl.LightningDataModule):
    """A DataModule whose loaders are built in ``setup`` (not in the hooks) when ``build_in_setup``."""

    def __init__(self, loader: str = "plain", workers: int = 0, dataset: str = "tensor", build_in_setup: bool = False,
                 combined: bool = False, batch_size: int = BATCH, drop_last: bool = False,
                 shuffle: bool = True, shards: str | None = None) -> None:  # fmt: skip
        super().__init__()
        self.shards = Path(shards) if shards else None
        self.loader, self.workers, self.dataset_kind = loader, workers, dataset
        self.build_in_setup, self.combined = build_in_setup, combined
        self.batch_size, self.drop_last, self.shuffle = batch_size, drop_last, shuffle

    def _loader(self, dataset: Dataset) -> DataLoader:
        return make_loader(dataset, self.loader, self.workers, self.shuffle, self.batch_size, self.drop_last)

    def _train_set(self) -> Dataset:
        base = classification_tensors()
        kinds = {"tensor": base, "jitter": JitteredDataset(base), "stream": StreamDataset(base),
                 "resumable_stream": ResumableStreamDataset(base), "sized_stream": SizedStreamDataset(base),
                 "sharded_stream": ShardedStream(base)}
        return kinds[self.dataset_kind]

    def setup(self, stage: str) -> None:
        self.val_set = classification_tensors(32, seed=1)
        if self.build_in_setup:
            self._train = self._loader(self._train_set())

    def train_dataloader(self) -> Any:
        if self.build_in_setup:
            return self._train
        if self.dataset_kind in LIBRARY_STREAMS:
            import stream_data

            base, shards = classification_tensors(), self.shards or Path.cwd() / "shards"
            if self.dataset_kind.startswith("hf"):
                buffered = self.dataset_kind == "hf_buffer_shuffle"
                return stream_data.hf_stream(base, self.batch_size, self.workers, buffered)
            build = stream_data.litdata_stream if self.dataset_kind == "litdata" else stream_data.webdataset_stream
            return build(base, shards, self.batch_size, self.workers)
        if self.combined:
            second = classification_tensors(40, seed=2)
            return CombinedLoader(
                {"a": self._loader(self._train_set()), "b": self._loader(second)}, mode="max_size_cycle",
            )
        return self._loader(self._train_set())

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=16)


# ---------------------------------------------------------------------------------------- models
class UserClassifier(pl.LightningModule):
    """A user's classifier: dropout, epoch-level logging, a torchmetrics Accuracy, a scheduler."""

    def __init__(self, width: int = 16, learning_rate: float = 0.05, scheduler: str = "none",
                 optimizer: str = "sgd") -> None:
        super().__init__()
        self.save_hyperparameters()
        self.body = nn.Sequential(nn.Linear(6, width), nn.ReLU(), nn.Dropout(0.25), nn.Linear(width, 3))
        self.train_accuracy = torchmetrics.Accuracy(task="multiclass", num_classes=3)
        self.val_accuracy = torchmetrics.Accuracy(task="multiclass", num_classes=3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def _unpack(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(batch, dict):  # a CombinedLoader of named loaders
            xs, ys = zip(*batch.values(), strict=True)
            return torch.cat(xs), torch.cat(ys)
        return batch[0], batch[1]

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = self._unpack(batch)
        logits = self(x)
        loss = nn.functional.cross_entropy(logits, y)
        self.train_accuracy(logits, y)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        self.log("train_acc", self.train_accuracy, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.val_accuracy(logits, y)
        self.log("val_loss", nn.functional.cross_entropy(logits, y))
        self.log("val_acc", self.val_accuracy)

    def configure_optimizers(self) -> Any:
        lr = self.hparams.learning_rate
        params = self.parameters()
        optimizer = torch.optim.AdamW(params, lr=lr) if self.hparams.optimizer == "adamw" else torch.optim.SGD(
            params, lr=lr, momentum=0.9
        )
        kind = self.hparams.scheduler
        if kind == "none":
            return optimizer
        if kind == "onecycle":
            total = self.trainer.estimated_stepping_batches
            scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=int(total))
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
        if kind == "step_epoch":
            return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)]
        if kind == "step_step":
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.8)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
        if kind == "plateau":
            # mode="max" on a loss: every epoch counts as no improvement, so the LR is cut on a schedule.
            scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", patience=0, factor=0.5)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": "train_loss_epoch"}}
        raise ValueError(kind)



class ShardedClassifier(UserClassifier):
    """The same classifier with its layers sharded by FSDP2 (torch's ``fully_shard``) over the
    ``data_parallel`` dimension of Lightning's ``ModelParallelStrategy``, as its docs show."""

    def configure_model(self) -> None:
        from torch.distributed.fsdp import fully_shard

        assert self.device_mesh is not None, "ModelParallelStrategy sets the device mesh before configure_model"
        mesh = self.device_mesh["data_parallel"]
        for layer in self.body:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(self.body, mesh=mesh)

class TwoOptimizerClassifier(UserClassifier):
    """Manual optimization with two optimizers (a GAN-style alternation)."""

    def __init__(self, width: int = 16) -> None:
        super().__init__(width=width)
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> None:
        x, y = self._unpack(batch)
        first, second = self.optimizers()
        for optimizer, layer in ((first, 0), (second, 3)):
            loss = nn.functional.cross_entropy(self(x), y) + 0.01 * self.body[layer].weight.square().sum()
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()
        self.log("train_loss", loss, on_step=True, on_epoch=True)

    def configure_optimizers(self) -> Any:
        head = list(self.body[3].parameters())
        body = list(self.body[0].parameters())
        return torch.optim.SGD(body, lr=0.05, momentum=0.9), torch.optim.Adam(head, lr=0.01)


class UserEma(Callback):
    """A user's own EMA of the weights, with its state in the checkpoint (``state_dict``)."""

    def __init__(self, decay: float = 0.9) -> None:
        self.decay = decay
        self.shadow: dict[str, torch.Tensor] = {}

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        for name, value in pl_module.state_dict().items():
            if name.startswith("body"):
                old = self.shadow.get(name, value)
                self.shadow[name] = self.decay * old + (1 - self.decay) * value.detach()

    def state_dict(self) -> dict[str, Any]:
        return {"shadow": dict(self.shadow)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.shadow = dict(state["shadow"])


# ---------------------------------------------------------------------------------------- configurations
@dataclass(frozen=True)
class Config:
    """One ordinary training setup and where it is interrupted."""

    kill_at: int  # SIGKILL at the start of this step: the last save before it is what resumes
    kill_after_micro_batches: int = 0  # with gradient accumulation: this many of the step's batches first
    max_steps: int = -1
    max_epochs: int | None = None
    loader: str = "plain"
    workers: int = 0
    dataset: str = "tensor"
    model: str = "classifier"  # or "boring", "two_optimizers", "sharded" (FSDP2 under ModelParallelStrategy)
    scheduler: str = "none"
    optimizer: str = "sgd"
    every_n_train_steps: int | None = 4
    every_n_epochs: int | None = None
    devices: int = 1  # per node
    nodes: int = 1  # > 1: one torchrun elastic agent per simulated node, restarting the group once
    interrupt: str = "SIGKILL"  # or "SIGTERM": a preemption notice, saved at the next step
    trainer: dict[str, Any] = field(default_factory=dict)
    callbacks: tuple[str, ...] = ()
    build_in_setup: bool = False
    combined: bool = False
    validate: bool = False
    # How the first attempt ends instead of a kill: "should_stop" (a callback sets trainer.should_stop
    # at the end of step kill_at's batch), "max_time" (Trainer(max_time=...) over slowed steps) or
    # "callbacks" (the configuration's own, e.g. EarlyStopping); it exits 0 and the rerun, without
    # the stop, must continue exactly.
    stop: str | None = None
    batch_size: int = BATCH
    drop_last: bool = False
    shuffle: bool = True
    resumed_with: dict[str, Any] = field(default_factory=dict)  # Config fields the rerun changes
    cli: bool = False  # a user's LightningCLI script (jobs/cli_job.py), killed and rerun with --ckpt_path last
    # SnapshotConfig(every_n_train_steps=...), into the run's folder
    snapshot_every: int | str | None = "auto"
    # Under torchrun: the second simulated node (its agent, its worker, its snapshot directory) is lost at
    # kill_at and a new, empty one joins the restarted group (tests/conformance.py, node-loss protocol).
    lose_node: bool = False
    damage_newest_snapshot: bool = False  # the rerun first flips a byte in the newest snapshot's state file
    snapshot_in_line: bool | None = None  # SnapshotConfig(in_line=...): None in line on CPU
    # "raise": instead of a kill, the module's training_step raises at step kill_at, before it touches
    # anything (a check on the batch); the first attempt ends with the exception (exit status 1).
    fault: str | None = None
    allow_changed: tuple[str, ...] = ()  # ResumeConfig(allow_changed=...): Trainer settings the rerun may change
    # The first attempt stops by itself (``stop``) and the rerun is the same command: a finished run,
    # whose rerun must train no step and hold the stopped state (judged against the first attempt).
    finished_rerun: bool = False
    # A row whose uninterrupted run is this row's too (the same training: only how it is interrupted or
    # how its snapshots commit differs); the suite makes that run once for both.
    same_training_as: str | None = None
    what: str = ""


_EPOCH = SAMPLES // BATCH  # 8 batches per epoch on one device

CONFIGS: dict[str, Config] = {
    # --- loaders (item 1): plain DataLoader and StatefulDataLoader, 0 and 2 workers
    "plain-loader": Config(kill_at=6, max_steps=20, what="plain DataLoader, shuffled, mid-epoch kill"),
    "plain-loader-2-workers": Config(kill_at=6, max_steps=20, workers=2, dataset="jitter",
                                     what="plain DataLoader, 2 workers drawing torch randomness"),
    "stateful-loader": Config(kill_at=6, max_steps=20, loader="stateful", what="StatefulDataLoader, mid-epoch kill"),
    "stateful-loader-2-workers": Config(kill_at=6, max_steps=20, loader="stateful", workers=2, dataset="jitter",
                                        what="StatefulDataLoader, 2 workers"),
    "boring-model": Config(kill_at=6, max_steps=20, model="boring", what="Lightning's BoringModel as it is"),
    # --- epoch boundaries (item 3)
    "every-n-epochs": Config(kill_at=2 * _EPOCH + 3, max_epochs=4, every_n_train_steps=None, every_n_epochs=1,
                             what="every_n_epochs=1, killed in epoch 2"),
    "step-save-on-last-batch": Config(kill_at=_EPOCH + 1, max_steps=3 * _EPOCH, every_n_train_steps=_EPOCH,
                                      what="step checkpoint on an epoch's last batch"),
    "check-val-every-2-epochs": Config(kill_at=2 * _EPOCH + 2, max_epochs=4, every_n_train_steps=None,
                                       every_n_epochs=1, validate=True, trainer={"check_val_every_n_epoch": 2},
                                       what="check_val_every_n_epoch=2, epoch checkpoints"),
    "max-epochs": Config(kill_at=_EPOCH + 5, max_epochs=3, what="max_epochs run, step checkpoints"),
    "kill-at-last-batch": Config(kill_at=2 * _EPOCH - 1, max_epochs=3, every_n_train_steps=2,
                                 what="killed as an epoch's last batch starts"),
    # --- loaders built early (item 4)
    "onecycle-estimated-steps": Config(kill_at=6, max_steps=20, scheduler="onecycle",
                                       what="OneCycleLR(total_steps=estimated_stepping_batches)"),
    "loader-built-in-setup": Config(kill_at=6, max_steps=20, build_in_setup=True, what="train loader built in setup()"),
    # --- schedulers (item 5)
    "steplr-per-epoch": Config(kill_at=_EPOCH + 3, max_epochs=3, scheduler="step_epoch", what="StepLR, epoch interval"),
    "plateau": Config(kill_at=_EPOCH + 3, max_epochs=4, scheduler="plateau",
                      what="ReduceLROnPlateau(mode='max') on an epoch metric"),
    "accumulate-clip-steplr": Config(kill_at=5, max_steps=8, scheduler="step_step", every_n_train_steps=2,
                                     trainer={"accumulate_grad_batches": 3, "gradient_clip_val": 0.5},
                                     what="accumulate_grad_batches=3, gradient_clip_val, step StepLR"),
    "accumulate-kill-mid-window": Config(kill_at=4, kill_after_micro_batches=1, max_steps=8, scheduler="step_step",
                                         every_n_train_steps=2,
                                         trainer={"accumulate_grad_batches": 3, "gradient_clip_val": 0.5},
                                         # step 4's window is batches 11-13: killed as 12 starts
                                         what="accumulate_grad_batches=3, killed between two accumulation batches"),
    # --- metrics (item 6)
    "epoch-metrics-mid-epoch": Config(kill_at=_EPOCH + 3, max_epochs=3, every_n_train_steps=2,
                                      what="on_epoch logging and a torchmetrics Accuracy, mid-epoch kill"),
    # --- the usual Trainer settings and callbacks (item 7)
    "val-check-interval-half": Config(kill_at=_EPOCH + 3, max_epochs=3, validate=True,
                                      trainer={"val_check_interval": 0.5}, what="val_check_interval=0.5"),
    "limit-train-batches": Config(kill_at=6, max_epochs=4, trainer={"limit_train_batches": 0.5},
                                  every_n_train_steps=2, what="limit_train_batches=0.5"),
    "manual-two-optimizers": Config(kill_at=6, max_steps=20, model="two_optimizers",
                                    what="manual optimization, two optimizers"),
    "early-stopping-lr-monitor": Config(kill_at=_EPOCH + 3, max_epochs=4, validate=True, scheduler="step_epoch",
                                        callbacks=("early_stopping", "lr_monitor"),
                                        what="EarlyStopping and LearningRateMonitor"),
    "swa": Config(kill_at=2 * _EPOCH + 3, max_epochs=4, callbacks=("swa",), what="StochasticWeightAveraging"),
    "swa-default-annealing": Config(kill_at=2 * _EPOCH + 3, max_epochs=5, every_n_train_steps=3,
                                    callbacks=("swa_default",),
                                    what="StochasticWeightAveraging, its default annealing (10 epochs), resumed"
                                         " mid-epoch after it started"),
    "user-ema-callback": Config(kill_at=6, max_steps=20, callbacks=("ema",), what="a user's EMA callback"),
    "bf16-mixed": Config(kill_at=6, max_steps=20, trainer={"precision": "bf16-mixed"}, what="bf16 mixed precision"),
    "combined-loader": Config(kill_at=6, max_steps=20, combined=True, what="two train loaders in a CombinedLoader"),
    "iterable-dataset": Config(kill_at=6, max_steps=20, dataset="stream", loader="stateful",
                               what="IterableDataset without state (replayed)"),
    "iterable-dataset-with-state": Config(kill_at=6, max_steps=20, dataset="resumable_stream", loader="stateful",
                                          what="IterableDataset with its own state_dict"),
    "iterable-dataset-with-len": Config(kill_at=6, max_steps=20, dataset="sized_stream", loader="stateful",
                                        what="IterableDataset with __len__ (replayed)"),
    # --- streamed data (issue 25): a stream with its own state, fetched a batch ahead by Lightning
    "stream-stateful-loader": Config(kill_at=_EPOCH + 3, max_steps=3 * _EPOCH, dataset="sharded_stream",
                                     loader="stateful", what="sharded stream, StatefulDataLoader, mid-epoch kill"),
    "stream-plain-loader": Config(kill_at=_EPOCH + 3, max_steps=3 * _EPOCH, dataset="sharded_stream",
                                  what="sharded stream, plain DataLoader"),
    "stream-2-workers": Config(kill_at=_EPOCH + 3, max_steps=3 * _EPOCH, dataset="sharded_stream", workers=2,
                               what="sharded stream, plain DataLoader, 2 workers"),
    "stream-stateful-2-workers": Config(kill_at=_EPOCH + 3, max_epochs=3, dataset="sharded_stream", loader="stateful",
                                        workers=2, what="sharded stream, StatefulDataLoader, 2 workers, max_epochs"),
    "stream-max-epochs": Config(kill_at=_EPOCH + 5, max_epochs=3, dataset="sharded_stream",
                                what="sharded stream, max_epochs with no length"),
    "stream-kill-at-last-batch": Config(kill_at=2 * _EPOCH - 1, max_epochs=3, every_n_train_steps=2,
                                        dataset="sharded_stream",
                                        what="sharded stream, killed as its last batch starts"),
    "stream-save-on-last-batch": Config(kill_at=_EPOCH + 1, max_steps=3 * _EPOCH, every_n_train_steps=_EPOCH,
                                        dataset="sharded_stream", what="sharded stream, step save on its last batch"),
    "stream-every-n-epochs": Config(kill_at=2 * _EPOCH + 3, max_epochs=4, every_n_train_steps=None, every_n_epochs=1,
                                    dataset="sharded_stream", what="sharded stream, every_n_epochs=1"),
    "stream-val-check-interval": Config(kill_at=_EPOCH + 4, max_epochs=3, every_n_train_steps=None, validate=True,
                                        dataset="sharded_stream", trainer={"val_check_interval": 3},
                                        what="sharded stream, val_check_interval=3, saved at each validation"),
    # --- the streaming libraries, local shards (tests/jobs/stream_data.py)
    "hf-iterable-dataset": Config(kill_at=_EPOCH + 3, max_epochs=3, dataset="hf",
                                  what="Hugging Face datasets: to_iterable_dataset(num_shards=4), plain DataLoader"),
    "hf-iterable-2-workers": Config(kill_at=_EPOCH + 3, max_steps=3 * _EPOCH, dataset="hf", workers=2,
                                    what="Hugging Face datasets: to_iterable_dataset, 2 workers"),
    "hf-buffer-shuffle": Config(kill_at=_EPOCH + 3, max_epochs=3, dataset="hf_buffer_shuffle",
                                what="Hugging Face datasets: shuffle(seed=7, buffer_size=16)"),
    "litdata-streaming": Config(kill_at=_EPOCH + 3, max_epochs=3, dataset="litdata",
                                what="LitData: optimize(), StreamingDataset(shuffle=True), StreamingDataLoader"),
    "litdata-streaming-2-workers": Config(kill_at=_EPOCH + 3, max_epochs=3, dataset="litdata", workers=2,
                                          what="LitData: StreamingDataLoader, 2 workers"),
    "webdataset": Config(kill_at=_EPOCH + 3, max_epochs=3, dataset="webdataset",
                         what="WebDataset: wds.WebDataset over 4 tar shards, plain DataLoader"),
    # --- two ranks (gloo, Lightning's DDP launcher)
    "ddp-plain-loader": Config(kill_at=3, max_steps=10, devices=2, every_n_train_steps=2,
                               what="2-rank DDP, plain DataLoader"),
    "ddp-stateful-loader-2-workers": Config(kill_at=3, max_steps=10, devices=2, every_n_train_steps=2,
                                            loader="stateful", workers=2,
                                            dataset="jitter", what="2-rank DDP, StatefulDataLoader, 2 workers"),
    "ddp-every-n-epochs": Config(kill_at=_EPOCH // 2 + 1, max_epochs=3, devices=2, every_n_train_steps=None,
                                 every_n_epochs=1, what="2-rank DDP, every_n_epochs=1"),
    "ddp-stream": Config(kill_at=_EPOCH // 2 + 2, max_steps=10, devices=2, every_n_train_steps=2,
                         dataset="sharded_stream", what="2-rank DDP, sharded stream, each rank its own part"),
    "ddp-stream-2-workers": Config(kill_at=_EPOCH // 2 + 2, max_epochs=3, devices=2, every_n_train_steps=2,
                                   dataset="sharded_stream", workers=2, loader="stateful",
                                   what="2-rank DDP, sharded stream, StatefulDataLoader, 2 workers"),
    "ddp-hf-iterable-dataset": Config(kill_at=_EPOCH // 2 + 2, max_epochs=3, devices=2, every_n_train_steps=2,
                                      dataset="hf", what="2-rank DDP, Hugging Face split_dataset_by_node"),
    # --- the launchers users have (item 8): torchrun restarts the group, the script resumes itself
    "torchrun-elastic-2-nodes": Config(kill_at=3, max_steps=10, nodes=2, every_n_train_steps=2,
                                       what="torchrun --max-restarts=1, 2 nodes (c10d), rank 1 SIGKILLed"),
    # --- step snapshots (issue 28): a kill between persistent checkpoints redoes at most one step
    "snapshots-sigkill": Config(kill_at=7, max_steps=12, every_n_train_steps=4, snapshot_every=1,
                                what="snapshots every step, killed 3 steps after a persistent save"),
    "snapshots-accumulate": Config(kill_at=6, max_steps=10, every_n_train_steps=4, snapshot_every=1,
                                   trainer={"accumulate_grad_batches": 3}, scheduler="step_step",
                                   what="snapshots with accumulate_grad_batches=3"),
    "snapshots-beside-training": Config(kill_at=7, max_steps=12, every_n_train_steps=4, snapshot_every=1,
                                        snapshot_in_line=False,
                                        what="snapshots committed beside training from a host copy (as on a GPU)"),
    "snapshots-damaged-newest": Config(kill_at=7, max_steps=12, every_n_train_steps=4, snapshot_every=1,
                                       damage_newest_snapshot=True,
                                       what="snapshots, the newest damaged before the rerun: the one before it"),
    "snapshots-node-lost": Config(kill_at=7, max_steps=12, nodes=2, every_n_train_steps=4, snapshot_every=1,
                                  lose_node=True,
                                  what="torchrun, 2 nodes with snapshots: one node lost, a new one resumes"
                                       " from its partner's replica"),
    # --- sharded snapshots (issue 45): FSDP2 on 2 ranks, each its own simulated node and snapshot folder
    "fsdp2-snapshots-sigkill": Config(kill_at=7, max_steps=12, nodes=2, every_n_train_steps=4, snapshot_every=1,
                                      model="sharded", snapshot_in_line=False,
                                      same_training_as="fsdp2-snapshots-node-lost",
                                      what="torchrun, 2 nodes, FSDP2 (ModelParallelStrategy) with snapshots"
                                           " committed beside training: rank 1 SIGKILLed 3 steps after a"
                                           " persistent save"),
    "fsdp2-snapshots-node-lost": Config(kill_at=7, max_steps=12, nodes=2, every_n_train_steps=4, snapshot_every=1,
                                        model="sharded", lose_node=True,
                                        what="torchrun, 2 nodes, FSDP2 with snapshots: one node lost, a new one"
                                             " resumes from its partner's replica of every shard"),
    "snapshots-mid-epoch-validation": Config(kill_at=_EPOCH + 3, max_epochs=3, every_n_train_steps=5, snapshot_every=1,
                                             validate=True, trainer={"val_check_interval": 3},
                                             what="snapshots with a mid-epoch validation (val_check_interval=3)"),
    # --- runs that stop before their limits (issue 24): the stop is the resume point
    "max-time": Config(kill_at=0, max_steps=20, stop="max_time",
                       what="stopped by Trainer(max_time=...), rerun without the limit"),
    "should-stop-max-epochs": Config(kill_at=_EPOCH + 3, max_epochs=3, stop="should_stop",
                                     what="a callback sets trainer.should_stop mid-epoch, max_epochs"),
    "should-stop-max-steps": Config(kill_at=_EPOCH + 3, max_steps=3 * _EPOCH, stop="should_stop",
                                    what="a callback sets trainer.should_stop mid-epoch, max_steps"),
    "should-stop-mid-accumulation": Config(kill_at=3, kill_after_micro_batches=1, max_steps=8, stop="should_stop",
                                           every_n_train_steps=2, trainer={"accumulate_grad_batches": 3},
                                           what="trainer.should_stop inside a gradient-accumulation window"),
    # --- a loader setting changed between the runs: refused before training, the setting named
    "early-stopping-mid-epoch": Config(kill_at=0, max_epochs=3, stop="callbacks", validate=True,
                                       every_n_train_steps=3, trainer={"val_check_interval": 0.5},
                                       callbacks=("early_stopping_threshold",), resumed_with={"callbacks": ()},
                                       what="EarlyStopping stops at a mid-epoch validation; rerun without it"),
    "changed-num-workers-2-to-0": Config(kill_at=6, max_steps=20, workers=2, resumed_with={"workers": 0},
                                         what="rerun with num_workers=0 after num_workers=2"),
    "changed-num-workers-0-to-2": Config(kill_at=6, max_steps=20, resumed_with={"workers": 2},
                                         what="rerun with num_workers=2 after num_workers=0"),
    "changed-batch-size": Config(kill_at=6, max_steps=20, resumed_with={"batch_size": 4},
                                 what="rerun with batch_size=4 after 8"),
    "changed-drop-last": Config(kill_at=6, max_steps=20, resumed_with={"drop_last": True},
                                what="rerun with drop_last=True"),
    "changed-sampler": Config(kill_at=6, max_steps=20, resumed_with={"shuffle": False},
                              what="rerun with shuffle=False (SequentialSampler for RandomSampler)"),
    # --- a Trainer setting changed between the runs (issue 39): refused before training, or allowed and marked inexact
    "changed-accumulate-grad-batches": Config(kill_at=6, max_steps=20, trainer={"accumulate_grad_batches": 2},
                                              resumed_with={"trainer": {"accumulate_grad_batches": 4}},
                                              what="rerun with accumulate_grad_batches=4 after 2"),
    "changed-accumulate-allowed": Config(kill_at=6, max_steps=20, trainer={"accumulate_grad_batches": 2},
                                         resumed_with={"trainer": {"accumulate_grad_batches": 4}},
                                         allow_changed=("accumulate_grad_batches",),
                                         what="the same, allowed: ResumeConfig(allow_changed=...)"),
    "changed-limit-train-batches": Config(kill_at=6, max_epochs=4, every_n_train_steps=2,
                                          trainer={"limit_train_batches": 0.5},
                                          resumed_with={"trainer": {"limit_train_batches": 0.75}},
                                          what="rerun with limit_train_batches=0.75 after 0.5"),
    "changed-val-check-interval": Config(kill_at=_EPOCH + 3, max_epochs=3, validate=True,
                                         trainer={"val_check_interval": 0.5},
                                         resumed_with={"trainer": {"val_check_interval": 0.25}},
                                         what="rerun with val_check_interval=0.25 after 0.5"),
    # --- a finished run rerun with the same command (issue 39): nothing to do
    "rerun-after-early-stopping": Config(kill_at=0, max_epochs=3, stop="callbacks", validate=True,
                                         every_n_train_steps=3, trainer={"val_check_interval": 0.5},
                                         callbacks=("early_stopping_threshold",), finished_rerun=True,
                                         what="EarlyStopping ended the run; the same command rerun"),
    # --- the user's own entry point
    # --- snapshots on by default (issue 39): "auto" measures the first ones, every step
    "snapshots-auto": Config(kill_at=3, max_steps=12, every_n_train_steps=10,
                             what="the default snapshots (auto), killed while their cost is measured"),
    # --- every stop is saved (issue 39): Ctrl-C, an exception in the user's code
    "keyboard-interrupt": Config(kill_at=6, max_steps=20, interrupt="SIGINT",
                                 what="Ctrl-C (SIGINT) at step 6: Lightning's graceful KeyboardInterrupt"),
    "exception-in-training-step": Config(kill_at=6, max_steps=20, fault="raise",
                                         what="training_step raises at step 6 (a check on the batch)"),
    "lightning-cli": Config(kill_at=6, max_steps=20, cli=True,
                            what="a user's LightningCLI script, killed, rerun with --ckpt_path last"),
    "torchrun-elastic-sigterm": Config(kill_at=2, max_steps=10, nodes=2, every_n_train_steps=4, interrupt="SIGTERM",
                                       what="torchrun, rank 1 SIGTERMed: preemption save, exit 75, restart"),
}


# ---------------------------------------------------------------------------------------- the run
class KillAtStep(Callback):
    """SIGKILL (or another signal) this process at the start of ``step`` (the saves of earlier steps
    are done), leaving ``mark`` behind first so that a launcher's restart of it can be told from a
    run that never died."""

    def __init__(
        self, step: int, mark: Path | None = None, signum: int = int(signal.SIGKILL), after_micro_batches: int = 0
    ) -> None:
        self.step = step
        self.mark = mark
        self.signum = signum
        self.after_micro_batches = after_micro_batches
        self._started = 0

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step != self.step:
            return
        self._started += 1  # batches of this optimizer step begun, this one included
        if self._started > self.after_micro_batches and not (self.mark is not None and self.mark.exists()):
            if self.mark is not None:
                # The pid the launcher started: under tests/warm_python.py, the program it forked this job for.
                self.mark.write_text(os.environ.get("FIELD_WARM_LAUNCHED_PID", str(os.getpid())))
            os.kill(os.getpid(), self.signum)


class LoseNode(Callback):
    """At the start of ``step``, this whole simulated node stops: its pids (the one its launcher started,
    and its own) go into ``mark``, then the process stops itself, holding its sockets open, until the
    test kills the node's agent and processes and deletes its snapshot directory."""

    def __init__(self, step: int, mark: Path) -> None:
        self.step = step
        self.mark = mark

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step and not self.mark.exists():
            launched = os.environ.get("FIELD_WARM_LAUNCHED_PID", str(os.getpid()))
            self.mark.write_text(f"{launched} {os.getpid()}")
            os.kill(os.getpid(), signal.SIGSTOP)


def damage_newest_snapshot(checkpoints: Path, snapshots: Path) -> str:
    """Flip a byte of the newest snapshot's shared state file (its manifest untouched); its name."""
    from lightning_field.checkpoint.snapshots import snapshot_dir_for
    from lightning_field.core.manifest import SHARED_STATE_FILE, read_manifest

    where = snapshot_dir_for(checkpoints, snapshots)
    newest = max((p for p in where.iterdir() if (p / "manifest.json").is_file()), key=lambda p: read_manifest(p).step)
    data = bytearray((newest / SHARED_STATE_FILE).read_bytes())
    data[-20] ^= 0xFF
    (newest / SHARED_STATE_FILE).write_bytes(bytes(data))
    return newest.name


class StopAtStep(Callback):
    """Set ``trainer.should_stop`` at the end of a batch of ``step``, as Lightning's ``Timer`` does:
    after ``after_micro_batches`` earlier batch ends of that step (a point inside an accumulation window)."""

    def __init__(self, step: int, after_micro_batches: int = 0) -> None:
        self.step = step
        self.after_micro_batches = after_micro_batches
        self._ended = 0

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            self._ended += 1
            if self._ended > self.after_micro_batches:
                trainer.should_stop = True


class SlowSteps(Callback):
    """Each step takes at least ``seconds``: a ``max_time`` limit then ends the run part-way."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, *args: Any) -> None:
        time.sleep(self.seconds)


def fail_training_step_at(model: pl.LightningModule, step: int) -> None:
    """The module's ``training_step`` raises at ``step``, before it does anything, as a user's check
    on the batch would."""
    original = model.training_step

    def training_step(batch: Any, batch_idx: int) -> Any:
        if model.trainer.global_step == step:
            raise RuntimeError(f"conformance: a bad batch at step {step}")
        return original(batch, batch_idx)

    model.training_step = training_step  # type: ignore[method-assign]


def under_torchrun() -> bool:
    return "TORCHELASTIC_RESTART_COUNT" in os.environ


class RecordRun(Callback):
    """The step a run started from, and every epoch's logged metrics as the epoch closed."""

    def __init__(self) -> None:
        self.start_step: int | None = None
        self.epoch_metrics: dict[int, dict[str, float]] = {}
        self.batches_trained = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.start_step = trainer.global_step
        print(f"conformance: training starts at step {trainer.global_step}", flush=True)

    def on_train_batch_start(self, *args: Any) -> None:
        self.batches_trained += 1

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.start_step is None:  # fit restored a checkpoint and never started training
            self.start_step = trainer.global_step

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if not k.endswith("_step")}
        self.epoch_metrics[trainer.current_epoch] = metrics


def _callbacks(names: tuple[str, ...]) -> list[Callback]:
    made: dict[str, Callable[[], Callback]] = {
        "early_stopping": lambda: EarlyStopping(monitor="val_loss", patience=1, min_delta=10.0),
        "early_stopping_threshold": lambda: EarlyStopping(monitor="val_loss", stopping_threshold=100.0),
        "lr_monitor": lambda: LearningRateMonitor(logging_interval="step"),
        "swa": lambda: StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=2, annealing_epochs=1),
        "swa_default": lambda: StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=2),
        "ema": lambda: UserEma(),
    }
    return [made[name]() for name in names]


def _model(config: Config) -> pl.LightningModule:
    if config.model == "boring":
        return BoringModel()
    if config.model == "two_optimizers":
        return TwoOptimizerClassifier()
    if config.model == "sharded":
        return ShardedClassifier(scheduler=config.scheduler, optimizer=config.optimizer)
    return UserClassifier(scheduler=config.scheduler, optimizer=config.optimizer)


def run(name: str, root: str, out: str, checkpoint: str, kill: bool, resume: bool) -> None:
    """Train configuration ``name`` under ``root`` and write its final state to ``out``."""
    config = CONFIGS[name]
    # The rerun's changes; for a run that stops, the reference is the run with the rerun's (larger) limits.
    if config.resumed_with and (resume or (config.stop is not None and not kill)):
        config = dataclasses.replace(config, **config.resumed_with)
    # The shards a library stream reads: one folder for the whole suite where the caller names one
    # (LitData's optimize() takes ~4 s a write), else beside the run.
    shards = Path(os.environ.get(SHARDS_ENV) or Path(root).parent / "shards")
    if config.dataset in LIBRARY_STREAMS:
        import stream_data

        stream_data.prepare_shards(config.dataset, classification_tensors(), shards)
    pl.seed_everything(1234)
    snapshots: dict[str, Any] = {}
    if checkpoint == "field":
        from lightning_field import ManifestCheckpoint, ResumeConfig, SnapshotConfig

        cls: type[ModelCheckpoint] = ManifestCheckpoint
        # Snapshots as configured (by default "auto", as ManifestCheckpoint's own default), each simulated
        # node into its own "node-local" directory, as /dev/shm is on a real machine.
        where = os.path.join(root, "snapshots", os.environ.get("CONFORMANCE_NODE", ""))
        snapshots = {"snapshots": SnapshotConfig(every_n_train_steps=config.snapshot_every, directory=where,
                                                 in_line=config.snapshot_in_line)}  # fmt: skip
        if config.snapshot_every is not None and resume and config.damage_newest_snapshot:
            print(f"conformance: damaged {damage_newest_snapshot(Path(root, 'checkpoints'), Path(where))}")
        allowed = {"resume": ResumeConfig(allow_changed=config.allow_changed)} if config.allow_changed else {}
    else:
        cls = ModelCheckpoint
        allowed = {}
    saver = cls(
        dirpath=os.path.join(root, "checkpoints"),
        every_n_train_steps=config.every_n_train_steps,
        every_n_epochs=config.every_n_epochs,
        save_top_k=-1,
        save_last=True,
        **snapshots,
        **allowed,
    )
    record = RecordRun()
    callbacks: list[Callback] = [saver, record, *_callbacks(config.callbacks)]
    if under_torchrun():
        # As a user's script under torchrun: always ckpt_path="last" (nothing there yet on the first
        # attempt); the launcher, not a second command, restarts it after rank 1 is killed once.
        # (Each agent counts its own restarts, and ranks may move between nodes on a restart: the
        # kill's mark, not TORCHELASTIC_RESTART_COUNT, says whether it has happened.)
        resume = True
        Path(root).mkdir(parents=True, exist_ok=True)
        Path(root, f"started-{os.getpid()}").touch()
        if kill and config.lose_node and os.environ.get("CONFORMANCE_NODE") == "node-1":
            callbacks.append(LoseNode(config.kill_at, Path(root, "node-lost")))
        elif kill and not config.lose_node and os.environ["RANK"] == "1" and not Path(root, "killed").exists():
            callbacks.append(KillAtStep(config.kill_at, Path(root, "killed"), signal.Signals[config.interrupt]))
    elif kill and config.stop == "should_stop":
        callbacks.append(StopAtStep(config.kill_at, after_micro_batches=config.kill_after_micro_batches))
    elif kill and config.stop == "max_time":
        callbacks.append(SlowSteps(0.15))
    elif kill and config.stop is None and config.fault is None:
        callbacks.append(KillAtStep(config.kill_at, signum=signal.Signals[config.interrupt],
                                    after_micro_batches=config.kill_after_micro_batches))  # fmt: skip
    limits = {"max_time": {"seconds": 1}} if kill and config.stop == "max_time" else {}
    needs_logger = "lr_monitor" in config.callbacks
    trainer = pl.Trainer(
        default_root_dir=root,
        accelerator="cpu",
        devices=config.devices,
        num_nodes=config.nodes,
        strategy=_strategy(config),
        max_steps=config.max_steps,
        max_epochs=config.max_epochs,
        callbacks=callbacks,
        logger=CSVLogger(root) if needs_logger else False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=2 if config.validate else 0,
        **limits,
        **config.trainer,
    )
    model = _model(config)
    if config.model == "sharded":
        report_shard_reads()
    if kill and config.fault == "raise":
        fail_training_step_at(model, config.kill_at)
    data = None
    if config.model != "boring":
        data = UserData(config.loader, config.workers, config.dataset, config.build_in_setup, config.combined,
                        config.batch_size, config.drop_last, config.shuffle,
                        shards=str(shards))  # fmt: skip
    trainer.fit(model, datamodule=data, ckpt_path="last" if resume else None)
    write_result(trainer, model, record, callbacks[2:], root, out)


def _strategy(config: Config) -> Any:
    if config.model == "sharded":
        from lightning.pytorch.strategies import ModelParallelStrategy

        return ModelParallelStrategy()  # data parallel over the nodes, tensor parallel over each node's devices
    return "ddp" if config.devices * config.nodes > 1 else "auto"


def report_shard_reads() -> None:
    """Print the folder each DCP read opens, with this rank's simulated node: a rank must read its own
    node's copy of a snapshot (another node's folder does not exist on a real machine)."""
    from torch.distributed.checkpoint import FileSystemReader

    original = FileSystemReader.__init__

    def opened(self: FileSystemReader, path: Any, *args: Any, **kwargs: Any) -> None:
        node = os.environ.get("CONFORMANCE_NODE")
        print(f"conformance: rank {os.environ.get('RANK')} on {node} reads shards from {path}", flush=True)
        original(self, path, *args, **kwargs)

    FileSystemReader.__init__ = opened  # type: ignore[method-assign]


def _full_state(trainer: pl.Trainer, model: pl.LightningModule) -> tuple[dict[str, Any], list[Any]]:
    """The weights and optimizer states whole; under FSDP2 gathered from every rank (collective)."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    if not isinstance(trainer.strategy, ModelParallelStrategy):
        return model.state_dict(), [opt.state_dict() for opt in trainer.optimizers]
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights, optimizer = get_state_dict(model, trainer.optimizers, options=options)
    return weights, [optimizer]


def write_result(
    trainer: pl.Trainer, model: pl.LightningModule, record: RecordRun, others: list[Callback], root: str, out: str
) -> None:
    """What the comparison reads (global rank 0): weights, optimizers, schedulers, callback states, metrics."""
    weights, optimizers = _full_state(trainer, model)
    if not trainer.is_global_zero:
        return
    result = {
        "start_step": record.start_step,
        "batches_trained": record.batches_trained,
        "step": trainer.global_step,
        "epoch": trainer.current_epoch,
        "state_dict": weights,
        "optimizers": optimizers,
        "schedulers": [cfg.scheduler.state_dict() for cfg in trainer.lr_scheduler_configs],
        "epoch_metrics": record.epoch_metrics,
        "callbacks": {type(cb).__name__: _comparable(cb.state_dict()) for cb in others},
        "saved": sorted(p.name for p in Path(root, "checkpoints").iterdir() if not p.name.startswith(".")),
    }
    torch.save(result, out)


def _comparable(state: dict[str, Any]) -> dict[str, Any]:
    # Callback states hold floats and tensors; drop what differs by construction (timestamps, paths).
    return {k: v for k, v in state.items() if k not in ("dirpath", "best_model_path", "last_model_path")}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("name", choices=sorted(CONFIGS))
    p.add_argument("--root", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--checkpoint", choices=["field", "plain"], default="field")
    p.add_argument("--kill", action="store_true")
    p.add_argument("--resume", action="store_true")
    args = p.parse_args(argv)
    from lightning_field import TrainingPreempted
    from lightning_field.core.distributed import exit_finished_process

    try:
        run(args.name, args.root, args.out, args.checkpoint, args.kill, args.resume)
    except TrainingPreempted as stop:
        # Its exit status (75) as raised, but without the interpreter teardown that can abort a
        # finished gloo job (-6, docs/known-limits.md), as after a completed run below.
        exit_finished_process(int(stop.code))
    sys.stdout.flush()
    exit_finished_process(0)


if __name__ == "__main__":
    main()
