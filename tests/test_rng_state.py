"""RNG capture and restore: every stream a training step or a loader worker draws from."""

from __future__ import annotations

import random

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_field.state.rng import WorkerRngCapture, capture_rng_state, restore_rng_state, rng_digest


def _draws(generator: torch.Generator) -> tuple[float, float, float, float]:
    return (random.random(), float(np.random.rand()), float(torch.rand(1)), float(torch.rand(1, generator=generator)))


def test_restore_replays_python_numpy_torch_and_registered_generators() -> None:
    generator = torch.Generator().manual_seed(3)
    state = capture_rng_state({"augment": generator})
    first = _draws(generator)
    assert restore_rng_state(state, {"augment": generator}) == []
    assert _draws(generator) == first


def test_captured_state_loads_with_weights_only(tmp_path) -> None:
    torch.save(capture_rng_state(), tmp_path / "rng.pt")
    restored = torch.load(tmp_path / "rng.pt", weights_only=True)
    assert rng_digest(restored) == rng_digest(capture_rng_state())


def test_a_generator_missing_from_the_checkpoint_is_reported_not_ignored() -> None:
    state = capture_rng_state()
    assert restore_rng_state(state, {"new": torch.Generator()}) == ["generator:new"]


class _RandomDataset(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> float:
        return random.random() + float(np.random.rand()) + float(torch.rand(1))


class _ReportsWorkerState(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> bool:
        return callable(getattr(torch.utils.data.get_worker_info().dataset, "state_dict", None))


def test_worker_dataset_copy_gains_rng_state_and_the_users_dataset_is_untouched() -> None:
    dataset = _ReportsWorkerState()
    loader = DataLoader(dataset, num_workers=1, worker_init_fn=WorkerRngCapture(), batch_size=None)
    assert list(loader) == [True] * 4
    assert not hasattr(dataset, "state_dict")
    plain = DataLoader(dataset, num_workers=1, batch_size=None)
    assert list(plain) == [False] * 4


def test_worker_rng_state_round_trip_continues_the_same_stream() -> None:
    from lightning_field.state.rng import _attach_worker_rng_state

    dataset = _RandomDataset()
    _attach_worker_rng_state(dataset)
    saved = dataset.state_dict()
    expected = [dataset[0] for _ in range(3)]
    dataset.load_state_dict(saved)
    assert [dataset[0] for _ in range(3)] == expected
