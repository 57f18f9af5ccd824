"""Checks on the loaders rather than on one batch: what ``drop_last`` throws away per epoch, and
validation samples that repeat training samples.

``loader_length`` reads the loader's dataset, sampler and batch size (no batch is needed);
``leakage`` compares the train and val samples by content, row by row.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from lightning_field.baseline.check_result import CheckResult
from lightning_field.baseline.data_sample import DataSample, ParsedBatches, batch_size_of, describe_tensor, safe_len


def check_length(loader: Any, split: str) -> CheckResult:
    """Samples per epoch against the batch size: what ``drop_last`` throws away, or the partial last batch."""
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return CheckResult(
            "loader_length", True, "not a map-style DataLoader: length not checkable", None, "info", split
        )
    dataset_len = safe_len(loader.dataset)
    per_epoch = safe_len(loader.sampler)
    if loader.batch_size is None or per_epoch is None:
        batches = safe_len(loader)
        return CheckResult(
            "loader_length",
            True,
            f"custom batch sampler: {batches} batches per epoch over {dataset_len} samples; partial batch not checked",
            None,
            "info",
            split,
            {"dataset": dataset_len, "batches": batches},
        )
    bs = loader.batch_size
    full, rest = divmod(per_epoch, bs)
    data = {
        "dataset": dataset_len,
        "sampler": per_epoch,
        "batch_size": bs,
        "drop_last": loader.drop_last,
        "full_batches": full,
        "last_batch": rest,
        "dropped": rest if loader.drop_last else 0,
    }
    subset = f" (the sampler draws {per_epoch} of the dataset's {dataset_len})" if per_epoch != dataset_len else ""
    base = f"{per_epoch} samples per epoch{subset}, batch size {bs}"
    if loader.drop_last and full == 0:
        return CheckResult(
            "loader_length",
            False,
            f"{base}, drop_last=True: zero batches per epoch, every sample dropped",
            "lower the batch size or set drop_last=False",
            "error",
            split,
            data,
        )
    if rest == 0:
        return CheckResult(
            "loader_length", True, f"{base}: {full} full batches, none partial", None, "info", split, data
        )
    if loader.drop_last:
        return CheckResult(
            "loader_length",
            True,
            f"{base}, drop_last=True: {full} batches; {rest} samples ({rest / per_epoch:.1%}) dropped per epoch",
            "with shuffling a different remainder is dropped each epoch; without it the same samples are never seen",
            "warning",
            split,
            data,
        )
    return CheckResult(
        "loader_length",
        True,
        f"{base}, drop_last=False: {full} full batches and a partial last batch of {rest}",
        "the last step's gradient averages fewer samples; set drop_last=True if batch-size-sensitive layers"
        " (BatchNorm) or a constant step cost matter",
        "info",
        split,
        data,
    )


def _row_hashes(sample: DataSample, parsed: ParsedBatches) -> dict[str, str]:
    """Hash of each sample's bytes (inputs and labels, by name) -> where it was first seen.

    An in-memory key for finding duplicates, never written or compared across runs: not one of the
    content hashes of ``core/hashing.py``."""
    hashes: dict[str, str] = {}
    for b, (inputs, labels) in enumerate(parsed):
        tensors = {
            **{describe_tensor(n, False): t for n, t in inputs.items()},
            **{describe_tensor(n, True): t for n, t in labels.items()},
        }
        size = batch_size_of(tensors.values())
        if not size:
            continue
        rows = {k: t for k, t in sorted(tensors.items()) if t.dim() >= 1 and t.shape[0] == size}
        for r in range(size):
            digest = hashlib.blake2b(digest_size=16)
            for k, t in rows.items():
                row = t[r].detach().cpu().contiguous().reshape(-1)
                digest.update(f"{k}|{row.dtype}|{list(t.shape[1:])}|".encode())
                digest.update(row.view(torch.uint8).numpy().tobytes())
            hashes.setdefault(digest.hexdigest(), sample.where(b, r))
    return hashes


def check_leakage(
    train: DataSample, train_parsed: ParsedBatches, val: DataSample, val_parsed: ParsedBatches
) -> CheckResult:
    """``leakage``: validation samples that exactly duplicate training samples, within what was sampled."""
    train_hashes = _row_hashes(train, train_parsed)
    val_hashes = _row_hashes(val, val_parsed)
    shared = [h for h in val_hashes if h in train_hashes]
    coverage = ""
    if train.dataset_len and val.dataset_len:
        coverage = f" (distinct samples hashed: {len(train_hashes)} of {train.dataset_len} train, {len(val_hashes)} of"
        coverage += f" {val.dataset_len} val; duplicates outside the sample are not seen)"
    data: dict[str, Any] = {"train_hashed": len(train_hashes), "val_hashed": len(val_hashes), "duplicates": len(shared)}
    if shared:
        example = f"train {train_hashes[shared[0]]} = val {val_hashes[shared[0]]}"
        data["example"] = example
        return CheckResult(
            "leakage",
            False,
            f"leakage: {len(shared)} validation sample(s) exactly duplicate training samples; e.g. {example}{coverage}",
            "split before augmenting and deduplicate across splits (by content, not by id); validation on seen"
            " samples overstates quality",
            "error",
            "train+val",
            data,
        )
    return CheckResult(
        "leakage",
        True,
        f"no exact duplicate between {len(train_hashes)} train and {len(val_hashes)} val samples{coverage}",
        None,
        "info",
        "train+val",
        data,
    )
