"""Preflight's pure checks: seeded data faults fail with a message that names them, clean data passes,
and the tiny overfit tells a model that can learn from one whose loss is cut off from its parameters."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_field.baseline import CheckResult, check_data, format_results, split_batch, tiny_overfit
from lightning_field.workloads.char_gpt import TINY_MODEL, CharGPT
from lightning_field.workloads.demo import DemoDataModule, DemoRegressor


def by_name(results: list[CheckResult], name: str, split: str = "train") -> CheckResult:
    matches = [r for r in results if r.name == name and r.split == split]
    assert len(matches) == 1, f"expected one {name}/{split} result, got {format_results(results)}"
    return matches[0]


def classification(n: int = 64, classes: int = 4, features: int = 3, seed: int = 0) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, features, generator=gen), torch.arange(n) % classes)


# ---------------------------------------------------------------------------------------------- data checks


def seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def test_clean_demo_data_passes_every_check_and_leaves_loader_and_rng_untouched() -> None:
    dm = DemoDataModule()
    dm.setup("fit")
    seed_all(1)
    train = dm.train_dataloader()  # its stateful RandomSampler seeds a private generator from the global RNG
    seed_all(1)
    control = dm.train_dataloader()
    seed_all(2)
    torch_state, py_state, np_state = torch.random.get_rng_state(), random.getstate(), np.random.get_state()

    results = check_data(train, dm.val_dataloader())

    assert all(r.passed and r.severity == "info" for r in results), format_results(results)
    names = {(r.split, r.name) for r in results}
    assert {("train", "non_finite"), ("val", "shapes_dtypes"), ("train+val", "leakage")} <= names
    assert torch.equal(torch.random.get_rng_state(), torch_state)
    assert random.getstate() == py_state
    assert np.array_equal(np.random.get_state()[1], np_state[1])
    assert train.state_dict()["_num_yielded"] == 0  # the loader's own position: not moved
    # Training then draws exactly what it would have drawn had the checks never run.
    seed_all(3)
    first = next(iter(train))
    seed_all(3)
    second = next(iter(control))
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


def test_out_of_range_label_fails_naming_label_range_value_and_dataset_index() -> None:
    data = classification()
    data.tensors[1][13] = 7  # one label past num_classes=4
    results = check_data(DataLoader(data, batch_size=8), num_classes=4)

    label = by_name(results, "label_range")
    assert not label.passed and label.severity == "error"
    assert "label range" in label.detail and "outside [0, 4)" in label.detail
    assert "value 7" in label.detail and "dataset index 13" in label.detail
    assert label.data["observed"] == (0, 7) and label.data["out"] == 1
    # The same data without num_classes only reports the range.
    assert by_name(check_data(DataLoader(data, batch_size=8)), "label_range").passed


def test_ignore_index_labels_are_allowed_and_other_negatives_fail() -> None:
    ids = torch.randint(0, 10, (16, 5), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[:, -1] = -100
    batches = [{"input_ids": ids[:8], "labels": labels[:8]}, {"input_ids": ids[8:], "labels": labels[8:]}]
    ok = by_name(check_data(batches, num_classes=10), "label_range")
    assert ok.passed and ok.data["ignored"] == 16 and "ignore_index -100" in ok.detail

    labels[3, 0] = -1
    bad = by_name(check_data(batches, num_classes=10), "label_range")
    assert not bad.passed and "value -1" in bad.detail and "sampled batch 0, row 3" in bad.detail
    assert not by_name(check_data(batches, num_classes=10, ignore_index=None), "label_range").data["ignored"]


def test_nan_input_fails_naming_non_finite_and_the_batch() -> None:
    data = classification()
    data.tensors[0][21, 1] = float("nan")
    data.tensors[0][40, 0] = float("inf")
    result = by_name(check_data(DataLoader(data, batch_size=8), num_classes=4), "non_finite")

    assert not result.passed and result.severity == "error"
    assert "non-finite" in result.detail
    assert "input '[0]': 1 NaN, 1 Inf" in result.detail
    assert "sampled batch 2, row 5, dataset index 21" in result.detail


def test_train_val_duplicates_are_reported_with_count_and_example() -> None:
    train = classification(64, seed=0)
    val = classification(32, seed=1)
    for v, t in ((3, 10), (7, 20), (30, 63)):
        val.tensors[0][v], val.tensors[1][v] = train.tensors[0][t], train.tensors[1][t]
    results = check_data(DataLoader(train, batch_size=8, shuffle=True), DataLoader(val, batch_size=8), num_classes=4)

    leak = by_name(results, "leakage", "train+val")
    assert not leak.passed and leak.data["duplicates"] == 3
    assert "leakage: 3 validation sample(s)" in leak.detail and "dataset index" in leak.data["example"]


@pytest.mark.parametrize(
    ("drop_last", "severity", "expected"),
    [(True, "warning", "3 samples (11.1%) dropped per epoch"), (False, "info", "partial last batch of 3")],
)
def test_dataset_length_reports_dropped_samples_or_partial_last_batch(
    drop_last: bool, severity: str, expected: str
) -> None:
    loader = DataLoader(classification(27), batch_size=6, drop_last=drop_last)
    result = by_name(check_data(loader, num_classes=4), "loader_length")

    assert result.passed and result.severity == severity and expected in result.detail
    assert result.data["full_batches"] == 4 and result.data["last_batch"] == 3
    assert result.data["dropped"] == (3 if drop_last else 0)


def test_drop_last_with_batch_larger_than_dataset_fails() -> None:
    result = by_name(check_data(DataLoader(classification(5), batch_size=8, drop_last=True)), "loader_length")
    assert not result.passed and "zero batches per epoch" in result.detail


def test_empty_batch_is_detected() -> None:
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])
    batches = [(x, y), (x[:0], y[:0]), (x, y)]
    result = by_name(check_data(batches), "empty_batches")
    assert not result.passed and "empty batches: 1 of 3" in result.detail and "sampled batch 1" in result.detail


def test_inconsistent_shapes_and_dtypes_are_detected() -> None:
    batches = [
        {"input_ids": torch.zeros(2, 8, dtype=torch.long), "labels": torch.zeros(2, 8, dtype=torch.long)},
        {"input_ids": torch.zeros(2, 9, dtype=torch.long), "labels": torch.zeros(2, 8, dtype=torch.long)},
        {"input_ids": torch.zeros(2, 8, dtype=torch.long), "labels": torch.zeros(2, 8, dtype=torch.int32)},
    ]
    result = by_name(check_data(batches), "shapes_dtypes")
    assert not result.passed and "inconsistent shapes/dtypes" in result.detail
    assert "input 'input_ids' is int64[8] (from sampled batch 0) then int64[9] (from sampled batch 1)" in result.detail
    assert "label 'labels' is int64[8] (from sampled batch 0) then int32[8] (from sampled batch 2)" in result.detail
    # Batch dimension differences (a partial last batch) are not a fault.
    assert by_name(check_data(DataLoader(classification(27), batch_size=6)), "shapes_dtypes").passed


def test_class_imbalance_is_a_warning_naming_absent_and_dominant_classes() -> None:
    labels = torch.tensor([0] * 28 + [1] * 4)  # of 3 classes: class 2 absent, class 0 at 87.5% (under the 90% cap)
    data = TensorDataset(torch.randn(32, 2), labels)
    result = by_name(check_data(DataLoader(data, batch_size=8), num_classes=3), "class_balance")

    assert result.passed and result.severity == "warning"
    assert "class(es) [2] absent" in result.detail and "class(es) [0] above 90%" not in result.detail
    assert result.data["counts"] == {0: 28, 1: 4, 2: 0}
    # Four classes: the limit is 3/4 of the labels, and 28 of 32 exceeds it.
    four = by_name(check_data(DataLoader(data, batch_size=8), num_classes=4), "class_balance")
    assert "class(es) [0] above 75%" in four.detail


def test_batch_splitting_rules_and_bad_label_key() -> None:
    x, y = torch.zeros(2, 3), torch.zeros(2, dtype=torch.long)
    assert list(map(list, split_batch((x, y)))) == [["[0]"], ["[1]"]]
    assert list(map(list, split_batch({"x": x, "target": y}))) == [["x"], ["target"]]
    assert list(map(list, split_batch({"a": x, "b": y}, label_key="a"))) == [["b"], ["a"]]
    assert list(map(list, split_batch(x))) == [["input"], []]
    with pytest.raises(ValueError, match="label_key='missing' is not a key"):
        check_data([{"x": x}], label_key="missing")
    with pytest.raises(ValueError, match="sample_batches must be >= 1"):
        check_data([(x, y)], sample_batches=0)


# ---------------------------------------------------------------------------------------------- tiny overfit


def test_demo_regressor_overfits_two_fixed_batches_without_touching_the_module() -> None:
    torch.manual_seed(0)
    model = DemoRegressor()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(8, 16, generator=gen), torch.randn(8, 1, generator=gen) * 3) for _ in range(2)]

    result = tiny_overfit(model, batches, max_steps=200)

    assert result.passed, result.detail
    assert 0 < result.steps < 200 and result.final_loss <= 0.1 * result.initial_loss
    assert result.ratio == pytest.approx(result.final_loss / result.initial_loss)
    assert len(result.curve) == result.steps + 1 and result.curve[0] == result.initial_loss
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


@pytest.mark.slow
def test_tiny_char_gpt_overfits_one_batch() -> None:
    torch.manual_seed(0)
    text = torch.frombuffer(bytearray(b"def add(a, b):\n    return a + b\n" * 12), dtype=torch.uint8).long()
    windows = torch.stack([text[i : i + 33] for i in range(0, 8 * 17, 17)])
    batch = {"input_ids": windows[:, :-1], "labels": windows[:, 1:]}

    result = tiny_overfit(CharGPT(**TINY_MODEL), [batch], max_steps=150)

    assert result.passed, result.detail
    assert result.initial_loss == pytest.approx(np.log(256), rel=0.1)


class DetachedRegressor(DemoRegressor):
    """The classic bug: the loss is computed from a detached copy of the output."""

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x).detach(), y)


class ZeroGradRegressor(DemoRegressor):
    """Subtler: the loss keeps a graph (via ``0 * param``), but none of it carries a gradient."""

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> dict[str, Any]:
        x, y = batch
        anchor = sum(p.sum() for p in self.parameters())
        return {"loss": nn.functional.mse_loss(self(x).detach(), y) + 0.0 * anchor}


@pytest.mark.parametrize("cls", [DetachedRegressor, ZeroGradRegressor])
def test_detached_loss_fails_with_the_detached_graph_hint(cls: type[DemoRegressor]) -> None:
    batches = [(torch.randn(8, 16), torch.randn(8, 1))]
    result = tiny_overfit(cls(), batches)

    assert not result.passed and result.detached and result.steps == 0
    assert "detached graph" in result.detail and result.hint is not None and ".detach()" in result.hint


def test_a_model_that_cannot_fit_names_learning_rate_and_label_alignment() -> None:
    batches = [(torch.randn(8, 16), torch.randn(8, 1))]
    result = tiny_overfit(DemoRegressor(), batches, max_steps=3, lr=1e-6)

    assert not result.passed and not result.detached and result.steps == 3 and len(result.curve) == 4
    assert result.hint is not None and "learning rate" in result.hint and "label alignment" in result.hint
    assert "lr 1e-06" in result.hint or "now 1e-06" in result.hint


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_steps": 0}, "max_steps must be > 0"),
        ({"target_ratio": 1.0}, "target_ratio must be in \\(0, 1\\)"),
        ({"target_ratio": 0.0}, "target_ratio must be in \\(0, 1\\)"),
        ({"lr": -1.0}, "lr must be > 0"),
    ],
)
def test_bad_overfit_arguments_raise_naming_the_parameter(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        tiny_overfit(DemoRegressor(), [(torch.randn(2, 16), torch.randn(2, 1))], **kwargs)


def test_empty_overfit_batches_raise() -> None:
    with pytest.raises(ValueError, match="batches must hold at least one"):
        tiny_overfit(DemoRegressor(), [])
