"""Data and label checks run on a sample of a loader's batches, before any training is spent on them.

Why: a NaN in the inputs, a label one past the last class, a validation set that repeats training
samples or a ``drop_last`` that throws a fifth of the data away each cost a whole run to find once
training has started, and each is visible in a few dozen batches. These checks read at most
``sample_batches`` batches per loader and return one :class:`CheckResult` per check, with the fault,
where it is (sampled batch, row, dataset index, key) and what to try.

This module runs them; each kind lives in its own: ``batch_checks`` (empty batches, NaN/Inf,
shapes and dtypes), ``label_checks`` (label range, class balance) and ``loader_checks``
(``drop_last``, train/val leakage), all on the sample that ``data_sample`` draws.

How inputs and labels are told apart in a batch:

- a tensor: all input, no labels;
- a tuple or list ``(x, ..., y)``: the **last** element is the label, the others are inputs
  (``label_key=i`` picks element ``i`` instead; a one-element sequence is all input);
- a dict: the keys ``labels``, ``label``, ``y``, ``target`` and ``targets`` are labels, every other
  key is an input (``label_key="name"`` names the one label key instead).

Nested tuples/dicts are flattened with names like ``[0][1]`` or ``features.a``; NumPy arrays count
as tensors; other values (strings, ids) are ignored.

Integer labels equal to ``ignore_index`` (default -100, PyTorch's ``cross_entropy`` default, which
language models use to mask padding) are allowed and counted separately; pass ``ignore_index=None``
to treat them as out of range.

The user's loader is never iterated: the batches come from a fresh, single-process ``DataLoader``
over the same dataset, batch sampler and ``collate_fn``, with every RNG the draw touches (torch,
``random``, NumPy, the sampler's own generator) restored afterwards. A ``StatefulDataLoader``'s
position, and the shuffle order training will draw, are therefore the same after the checks as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from lightning_field.baseline.batch_checks import check_empty, check_non_finite, check_shapes
from lightning_field.baseline.check_result import CheckResult, Severity, format_results
from lightning_field.baseline.data_sample import DataSample, ParsedBatches, draw_sample, split_batch
from lightning_field.baseline.label_checks import check_labels
from lightning_field.baseline.loader_checks import check_leakage, check_length

__all__ = ["CheckResult", "Severity", "check_data", "format_results", "split_batch"]


def check_data(
    train_loader: Iterable[Any],
    val_loader: Iterable[Any] | None = None,
    *,
    num_classes: int | None = None,
    sample_batches: int = 50,
    label_key: str | int | None = None,
    ignore_index: int | None = -100,
) -> list[CheckResult]:
    """Run every data check on up to ``sample_batches`` batches of each loader.

    Per split (train, then val): ``empty_batches``, ``non_finite``, ``shapes_dtypes``, ``label_range``
    and ``class_balance`` (per label tensor), ``loader_length``; then ``leakage`` across the two when
    ``val_loader`` is given. ``num_classes`` bounds integer labels to ``[0, num_classes)``; without it
    only negative labels fail and the observed range is reported. See the module docstring for how
    labels are found and why the loaders are left untouched.
    """
    if sample_batches < 1:
        raise ValueError(f"check_data sample_batches must be >= 1, got {sample_batches}")
    if num_classes is not None and num_classes < 1:
        raise ValueError(f"check_data num_classes must be >= 1 (or None), got {num_classes}")
    results: list[CheckResult] = []
    drawn: dict[str, tuple[DataSample, ParsedBatches]] = {}
    for split, loader in (("train", train_loader), ("val", val_loader)):
        if loader is None:
            continue
        sample = draw_sample(loader, sample_batches)
        parsed = [split_batch(batch, label_key) for batch in sample.batches]
        drawn[split] = (sample, parsed)
        results.append(check_empty(parsed, split))
        results.append(check_non_finite(sample, parsed, split))
        results.append(check_shapes(parsed, split))
        results.extend(check_labels(sample, parsed, split, num_classes, ignore_index))
        results.append(check_length(loader, split))
    if "val" in drawn:
        results.append(check_leakage(*drawn["train"], *drawn["val"]))
    return results
