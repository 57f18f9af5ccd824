"""Checks on what the sampled batches hold: empty batches, NaN/Inf, and shapes or dtypes that change.

Each reads the parsed sample (:mod:`lightning_field.baseline.data_sample`) and returns one
:class:`CheckResult` naming the first place the fault was seen.
"""

from __future__ import annotations

import torch

from lightning_field.baseline.check_result import CheckResult
from lightning_field.baseline.data_sample import DataSample, ParsedBatches, batch_size_of, describe_tensor


def check_empty(parsed: ParsedBatches, split: str) -> CheckResult:
    """``empty_batches``: a loader that yields nothing, or batches without rows or tensors."""
    empty = []
    for b, (inputs, labels) in enumerate(parsed):
        tensors = [*inputs.values(), *labels.values()]
        if not tensors or batch_size_of(tensors) == 0 or any(t.numel() == 0 for t in tensors):
            empty.append(b)
    data = {"batches": len(parsed), "empty": empty}
    if not parsed:
        return CheckResult(
            "empty_batches",
            False,
            "the loader yielded no batches at all",
            "check the dataset length, the sampler (e.g. a DistributedSampler with more ranks than samples) and"
            " drop_last with a batch size larger than the dataset",
            "error",
            split,
            data,
        )
    if empty:
        return CheckResult(
            "empty_batches",
            False,
            f"empty batches: {len(empty)} of {len(parsed)} sampled batches have no rows or no tensors"
            f" (first: sampled batch {empty[0]})",
            "a collate_fn that filters bad samples can leave nothing; a batch sampler can yield an empty list",
            "error",
            split,
            data,
        )
    return CheckResult(
        "empty_batches", True, f"no empty batch in {len(parsed)} sampled batches", None, "info", split, data
    )


def check_non_finite(sample: DataSample, parsed: ParsedBatches, split: str) -> CheckResult:
    """``non_finite``: NaN and Inf counts per floating tensor, and where the first one is."""
    found: dict[str, dict[str, int]] = {}
    first: str | None = None
    for b, (inputs, labels) in enumerate(parsed):
        for is_label, group in ((False, inputs), (True, labels)):
            for name, t in group.items():
                if not t.is_floating_point() or t.numel() == 0:
                    continue
                bad = ~torch.isfinite(t)
                if not bool(bad.any()):
                    continue
                key = describe_tensor(name, is_label)
                counts = found.setdefault(key, {"nan": 0, "inf": 0})
                counts["nan"] += int(torch.isnan(t).sum())
                counts["inf"] += int(torch.isinf(t).sum())
                if first is None:
                    row = int(bad.reshape(bad.shape[0], -1).any(dim=1).nonzero()[0]) if t.dim() >= 1 else None
                    first = f"{key} at {sample.where(b, row)}"
    if found:
        parts = ", ".join(f"{k}: {v['nan']} NaN, {v['inf']} Inf" for k, v in found.items())
        return CheckResult(
            "non_finite",
            False,
            f"non-finite values (NaN/Inf) in {parts}; first in {first}",
            "look for division by zero or log of zero in preprocessing, missing values read as NaN, or an"
            " overflowing cast to float16",
            "error",
            split,
            {"counts": found, "first": first},
        )
    return CheckResult(
        "non_finite", True, "no NaN or Inf in floating inputs or labels", None, "info", split, {"counts": {}}
    )


def _signature(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape[1:])}"


def check_shapes(parsed: ParsedBatches, split: str) -> CheckResult:
    """``shapes_dtypes``: each tensor's dtype and shape past the batch dimension, and the set of tensors,
    the same in every sampled batch."""
    seen: dict[str, dict[str, int]] = {}  # tensor -> signature -> first sampled batch
    keys_first: tuple[str, ...] | None = None
    key_change: str | None = None
    for b, (inputs, labels) in enumerate(parsed):
        names = tuple(describe_tensor(n, False) for n in inputs) + tuple(describe_tensor(n, True) for n in labels)
        if keys_first is None:
            keys_first = names
        elif names != keys_first and key_change is None:
            key_change = f"sampled batch {b} has {list(names)}, batch 0 had {list(keys_first)}"
        for is_label, group in ((False, inputs), (True, labels)):
            for name, t in group.items():
                seen.setdefault(describe_tensor(name, is_label), {}).setdefault(_signature(t), b)
    varying = {k: v for k, v in seen.items() if len(v) > 1}
    data = {"signatures": {k: list(v) for k, v in seen.items()}}
    if varying or key_change:
        parts = [
            f"{k} is {' then '.join(f'{sig} (from sampled batch {b})' for sig, b in v.items())}"
            for k, v in varying.items()
        ]
        if key_change:
            parts.append(f"the batch's tensors change: {key_change}")
        return CheckResult(
            "shapes_dtypes",
            False,
            "inconsistent shapes/dtypes across batches (batch dimension excluded): " + "; ".join(parts),
            "pad or crop to one length in the dataset or collate_fn and cast to one dtype; if per-batch padding"
            " to the longest sequence is intended, this check reports it by design",
            "error",
            split,
            data,
        )
    summary = ", ".join(f"{k} {next(iter(v))}" for k, v in seen.items())
    return CheckResult(
        "shapes_dtypes", True, f"consistent across {len(parsed)} batches: {summary}", None, "info", split, data
    )
