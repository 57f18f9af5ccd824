"""Data position at scale: a map-style position restores by jumping (the same cost at batch 10 and at
batch 1,000,000, no replay of skipped batches), and the manifest says how each loader is restored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from conftest import make_trainer
from torch.utils.data import Dataset, IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import RandomSampler

from lightning_field import JumpRandomSampler, latest_recoverable, read_manifest
from lightning_field.state.samplers import _JumpIterator
from lightning_field.workloads.demo import DemoRegressor

BATCH = 8


class IndexDataset(Dataset):
    """A map-style dataset of any length whose items cost nothing to make (and record nothing)."""

    def __init__(self, length: int, features: int = 16) -> None:
        self.length, self.features = length, features
        self.reads = 0

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.reads += 1
        x = torch.full((self.features,), float(index))  # exact in float32 below 2**24
        return x, x[:1].clone()


def _loader(length: int, batch_size: int = BATCH, seed: int = 7) -> StatefulDataLoader:
    dataset = IndexDataset(length)
    sampler = JumpRandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
    return StatefulDataLoader(dataset, sampler=sampler, batch_size=batch_size)


def _state_at(length: int, batches: int) -> dict[str, Any]:
    """The loader state a save after ``batches`` batches (of one sample) holds."""
    loader = _loader(length, batch_size=1)
    next(iter(loader))
    state = loader.state_dict()
    state["_sampler_iter_yielded"] = state["_num_yielded"] = batches
    state["_sampler_iter_state"]["samples_yielded"] = batches
    state["_sampler_iter_state"]["sampler_iter_state"]["yielded"] = batches
    return state


def _resume(length: int, state: dict[str, Any], drawn: list[int]) -> float:
    """The first sample a fresh loader yields after ``load_state_dict(state)``; ``drawn`` counts the
    indices its sampler handed out on the way (a resume that skips index by index draws them all)."""
    fresh = _loader(length, batch_size=1)
    drawn.clear()
    fresh.load_state_dict(state)
    first = next(iter(fresh))[0][0, 0].item()
    assert fresh.dataset.reads == 1, "a resume must not re-read the samples before its position"
    return first


def test_jump_sampler_draws_torchdatas_order_and_resumes_at_any_offset_without_stepping_to_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torchdata_order = list(RandomSampler(range(64), generator=torch.Generator().manual_seed(3)))
    assert list(JumpRandomSampler(range(64), generator=torch.Generator().manual_seed(3))) == torchdata_order

    drawn: list[int] = []
    next_index = _JumpIterator.__next__

    def counting_next(self: _JumpIterator) -> int:
        index = next_index(self)
        drawn.append(index)
        return index

    monkeypatch.setattr(_JumpIterator, "__next__", counting_next)
    length = 1_000_001
    order = torch.randperm(length, generator=torch.Generator().manual_seed(7))
    for batches in (10, 1_000_000):
        first = _resume(length, _state_at(length, batches), drawn)
        assert first == float(order[batches]), f"wrong sample at batch {batches}"
        # The same work at either position: the epoch's order is rebuilt (one randperm) and the
        # iterator starts at the offset. What that costs in seconds, against torchdata's own
        # sampler, is benchmarks/scale_benchmark.py resume's figure.
        assert drawn == [int(order[batches])], f"{len(drawn)} indices drawn to resume at batch {batches}"


class RecordBatches(pl.Callback):
    def __init__(self) -> None:
        self.batches: dict[int, list[float]] = {}

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.batches[trainer.global_step] = batch[0][:, 0].tolist()


class CountingStream(IterableDataset):
    def __iter__(self) -> Any:
        for i in range(64):
            x = torch.full((16,), float(i))
            yield x, x[:1]


class SizedCountingStream(CountingStream):
    def __len__(self) -> int:
        return 64


def test_resume_through_lightning_continues_the_jump_sampler_order_and_the_manifest_says_how(
    tmp_path: Path, quiet_lightning: None
) -> None:
    def fit(root: Path, max_steps: int, ckpt_path: Path | None = None) -> RecordBatches:
        trainer = make_trainer(root, max_steps, dirpath=tmp_path / "ckpts", every_n_train_steps=3)
        recorder = RecordBatches()
        trainer.callbacks.append(recorder)
        trainer.fit(DemoRegressor(), train_dataloaders=_loader(4096), ckpt_path=ckpt_path)
        return recorder

    uninterrupted = fit(tmp_path / "a", 6)
    checkpoint = tmp_path / "ckpts" / "epoch=0-step=3"
    restore = read_manifest(checkpoint).data_restore
    assert list(restore) == ["0"] and restore["0"][0].startswith("map-style, jump: JumpRandomSampler")
    resumed = fit(tmp_path / "b", 6, ckpt_path=checkpoint)
    assert sorted(resumed.batches) == [3, 4, 5]
    assert all(resumed.batches[s] == uninterrupted.batches[s] for s in (3, 4, 5))

    stream = make_trainer(tmp_path / "c", 2, dirpath=tmp_path / "stream")
    stream.fit(DemoRegressor(), train_dataloaders=StatefulDataLoader(SizedCountingStream(), batch_size=BATCH))
    latest = latest_recoverable(tmp_path / "stream")
    assert latest is not None
    assert read_manifest(latest).data_restore["0"][0].startswith("iterable, replay:")

    # A stream without a length and without its own state could only be replayed from its start: it
    # is described, and refused with its class and the fix (tests/test_conformance.py, iterable-dataset).
    unsized = make_trainer(tmp_path / "d", 2, dirpath=tmp_path / "unsized")
    unsized.fit(DemoRegressor(), train_dataloaders=StatefulDataLoader(CountingStream(), batch_size=BATCH))
    assert latest_recoverable(tmp_path / "unsized") is None
    manifest = read_manifest(tmp_path / "unsized" / "epoch=0-step=2")
    assert manifest.data_restore["0"][0].startswith("iterable, replay:")
    assert any("CountingStream streams an IterableDataset without a state_dict" in m and "docs/streamed-data.md" in m
               for m in manifest.missing)  # fmt: skip
