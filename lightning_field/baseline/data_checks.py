"""Data and label checks run on a sample of a loader's batches, before any training is spent on them.

Why: a NaN in the inputs, a label one past the last class, a validation set that repeats training
samples or a ``drop_last`` that throws a fifth of the data away each cost a whole run to find once
training has started, and each is visible in a few dozen batches. These checks read at most
``sample_batches`` batches per loader and return one :class:`CheckResult` per check, with the fault,
where it is (sampled batch, row, dataset index, key) and what to try.

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

import contextlib
import hashlib
import itertools
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from lightning.pytorch.utilities.seed import isolate_rng
from torch.utils.data import DataLoader, IterableDataset

Severity = Literal["error", "warning", "info"]

#: Dict keys read as labels when ``label_key`` is not given.
DEFAULT_LABEL_KEYS = ("labels", "label", "y", "target", "targets")
#: Class balance is reported only for integer labels with at most this many classes: beyond it
#: (e.g. a 256-byte or 50k-token vocabulary) per-class shares in a small sample say little.
BALANCE_MAX_CLASSES = 50
#: A class is flagged as dominant above ``min(0.9, DOMINANT_FACTOR / k)`` of the labels: three
#: times its uniform share, capped so that a two-class problem is flagged only at 90/10.
DOMINANT_FACTOR = 3.0


@dataclass
class CheckResult:
    """One check's verdict.

    ``passed`` is False only for faults that break training (severity "error"); a "warning" passes
    but says what looks wrong (class imbalance, samples dropped each epoch); "info" reports a fact.
    ``split`` is "train", "val" or "train+val"; ``data`` holds the numbers behind ``detail`` for a
    record (counts, shapes, the first location).
    """

    name: str
    passed: bool
    detail: str
    hint: str | None = None
    severity: Severity = "info"
    split: str = "train"
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Sample:
    """Batches drawn from one loader, with each row's dataset index where the sampler tells it."""

    batches: list[Any]
    indices: list[list[int] | None]
    dataset_len: int | None


# ---------------------------------------------------------------------------------------------- batches


def _as_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return torch.from_numpy(value)
    return None


def _flatten(obj: Any, name: str, out: dict[str, torch.Tensor]) -> None:
    tensor = _as_tensor(obj)
    if tensor is not None:
        out[name] = tensor
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            _flatten(value, f"{name}.{key}" if name else str(key), out)
    elif isinstance(obj, Sequence) and not isinstance(obj, (str, bytes)):
        for i, value in enumerate(obj):
            _flatten(value, f"{name}[{i}]", out)


def split_batch(
    batch: Any, label_key: str | int | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``(inputs, labels)``: a batch's tensors by name, split by the rules in the module docstring.

    Raises ``ValueError`` when ``label_key`` names a key or position the batch does not have: a
    silent fallback would check the wrong tensor against the class count.
    """
    inputs: dict[str, torch.Tensor] = {}
    labels: dict[str, torch.Tensor] = {}
    tensor = _as_tensor(batch)
    if tensor is not None:
        inputs["input"] = tensor
    elif isinstance(batch, Mapping):
        if label_key is not None:
            if label_key not in batch:
                keys = sorted(map(str, batch))
                raise ValueError(f"check_data label_key={label_key!r} is not a key of the batch: {keys}")
            label_names = {label_key}
        else:
            label_names = {k for k in batch if k in DEFAULT_LABEL_KEYS}
        for key, value in batch.items():
            _flatten(value, str(key), labels if key in label_names else inputs)
    elif isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        if label_key is not None and not (isinstance(label_key, int) and -len(batch) <= label_key < len(batch)):
            raise ValueError(f"check_data label_key={label_key!r} is not a position in a {len(batch)}-element batch")
        label_pos = (label_key % len(batch)) if label_key is not None else (len(batch) - 1 if len(batch) >= 2 else None)
        for i, value in enumerate(batch):
            _flatten(value, f"[{i}]", labels if i == label_pos else inputs)
    return inputs, labels


def _batch_size(tensors: Iterable[torch.Tensor]) -> int | None:
    """The first dimension of the first tensor that has one: the batch dimension by convention."""
    for t in tensors:
        if t.dim() >= 1:
            return int(t.shape[0])
    return None


@contextlib.contextmanager
def _rng_preserved(*generators: torch.Generator) -> Iterator[None]:
    """Restore torch (CPU), ``random``, NumPy (Lightning's ``isolate_rng``) and the given generators,
    which it does not know of: the draw must not shift training's."""
    gen_states = [g.get_state() for g in generators]
    with isolate_rng(include_cuda=False):
        try:
            yield
        finally:
            for g, state in zip(generators, gen_states, strict=True):
                g.set_state(state)


def _draw(loader: Iterable[Any], sample_batches: int) -> _Sample:
    """Up to ``sample_batches`` batches, without iterating (or otherwise touching) ``loader`` itself."""
    if not isinstance(loader, DataLoader):
        # A plain iterable (a list of batches, a generator): read it as given.
        batches = list(itertools.islice(iter(loader), sample_batches))
        return _Sample(batches, [None] * len(batches), None)
    dataset = loader.dataset
    is_iterable = isinstance(dataset, IterableDataset)
    dataset_len = None if is_iterable else _safe_len(dataset)
    sampler = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
    owners = (sampler, getattr(sampler, "sampler", None), loader.sampler)
    generators = {id(g): g for g in (getattr(o, "generator", None) for o in owners) if isinstance(g, torch.Generator)}
    with _rng_preserved(*generators.values()):
        if is_iterable:
            fresh = DataLoader(
                dataset, batch_size=loader.batch_size, drop_last=loader.drop_last, collate_fn=loader.collate_fn
            )
            batches = list(itertools.islice(iter(fresh), sample_batches))
            return _Sample(batches, [None] * len(batches), None)
        if loader.batch_sampler is not None:
            # The user's batch sampler decides which rows form a batch (and so what class balance the
            # model sees, e.g. under a weighted sampler); iterating a sampler object does not move
            # the loader, and its RNG is restored.
            index_batches = [list(b) for b in itertools.islice(iter(loader.batch_sampler), sample_batches)]
            fresh = DataLoader(dataset, batch_sampler=index_batches, collate_fn=loader.collate_fn)
            return _Sample(list(fresh), list(index_batches), dataset_len)
        indices = list(itertools.islice(iter(loader.sampler), sample_batches))
        batches = [loader.collate_fn(dataset[i]) for i in indices]
        return _Sample(batches, [None] * len(batches), dataset_len)


def _safe_len(obj: Any) -> int | None:
    try:
        return len(obj)
    except TypeError:
        return None


def _where(sample: _Sample, batch: int, row: int | None) -> str:
    if row is None:
        return f"sampled batch {batch}"
    index = sample.indices[batch]
    at = f"sampled batch {batch}, row {row}"
    return f"{at}, dataset index {index[row]}" if index is not None and row < len(index) else at


def _kind(name: str, is_label: bool) -> str:
    return f"{'label' if is_label else 'input'} '{name}'"


# ---------------------------------------------------------------------------------------------- checks


def _check_empty(sample: _Sample, parsed: list[tuple[dict, dict]], split: str) -> CheckResult:
    empty = []
    for b, (inputs, labels) in enumerate(parsed):
        tensors = [*inputs.values(), *labels.values()]
        if not tensors or _batch_size(tensors) == 0 or any(t.numel() == 0 for t in tensors):
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


def _check_non_finite(sample: _Sample, parsed: list[tuple[dict, dict]], split: str) -> CheckResult:
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
                key = _kind(name, is_label)
                counts = found.setdefault(key, {"nan": 0, "inf": 0})
                counts["nan"] += int(torch.isnan(t).sum())
                counts["inf"] += int(torch.isinf(t).sum())
                if first is None:
                    row = int(bad.reshape(bad.shape[0], -1).any(dim=1).nonzero()[0]) if t.dim() >= 1 else None
                    first = f"{key} at {_where(sample, b, row)}"
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


def _check_shapes(parsed: list[tuple[dict, dict]], split: str) -> CheckResult:
    seen: dict[str, dict[str, int]] = {}  # tensor -> signature -> first sampled batch
    keys_first: tuple[str, ...] | None = None
    key_change: str | None = None
    for b, (inputs, labels) in enumerate(parsed):
        names = tuple(_kind(n, False) for n in inputs) + tuple(_kind(n, True) for n in labels)
        if keys_first is None:
            keys_first = names
        elif names != keys_first and key_change is None:
            key_change = f"sampled batch {b} has {list(names)}, batch 0 had {list(keys_first)}"
        for is_label, group in ((False, inputs), (True, labels)):
            for name, t in group.items():
                seen.setdefault(_kind(name, is_label), {}).setdefault(_signature(t), b)
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


def _check_labels(
    sample: _Sample,
    parsed: list[tuple[dict, dict]],
    split: str,
    num_classes: int | None,
    ignore_index: int | None,
) -> list[CheckResult]:
    """Label range and class balance; both are about integer labels, so one pass collects both."""
    label_names = sorted({n for _, labels in parsed for n in labels})
    if not label_names:
        return [
            CheckResult(
                "label_range", True, "no labels identified in the batch; label checks skipped", None, "info", split
            )
        ]
    results: list[CheckResult] = []
    for name in label_names:
        key = _kind(name, True)
        tensors = [(b, labels[name]) for b, (_, labels) in enumerate(parsed) if name in labels]
        if not all(not t.is_floating_point() and not t.is_complex() for _, t in tensors):
            finite = [t[torch.isfinite(t)] for _, t in tensors if t.is_floating_point()]
            values = torch.cat([f.reshape(-1).double() for f in finite]) if finite else torch.empty(0)
            observed = (float(values.min()), float(values.max())) if values.numel() else None
            shown = f"[{observed[0]:.4g}, {observed[1]:.4g}]" if observed else "none (no finite value)"
            results.append(
                CheckResult(
                    "label_range",
                    True,
                    f"{key} is floating (regression targets): observed range {shown}; class checks skipped",
                    None,
                    "info",
                    split,
                    {"label": name, "observed": observed},
                )
            )
            continue
        counts: Counter[int] = Counter()
        ignored = 0
        bad_first: str | None = None
        bad_count = 0
        for b, t in tensors:
            if t.numel() == 0:
                continue  # reported by empty_batches
            flat = t.reshape(t.shape[0], -1).long() if t.dim() >= 1 else t.reshape(1, 1).long()
            ignore_mask = flat == ignore_index if ignore_index is not None else torch.zeros_like(flat, dtype=torch.bool)
            ignored += int(ignore_mask.sum())
            out = ~ignore_mask & (flat < 0)
            if num_classes is not None:
                out |= ~ignore_mask & (flat >= num_classes)
            if bool(out.any()):
                bad_count += int(out.sum())
                if bad_first is None:
                    row = int(out.any(dim=1).nonzero()[0])
                    value = int(flat[row][out[row]][0])
                    bad_first = f"value {value} at {_where(sample, b, row if t.dim() >= 1 else None)}"
            values, freq = torch.unique(flat[~ignore_mask], return_counts=True)
            counts.update(dict(zip(values.tolist(), freq.tolist(), strict=True)))
        observed = (min(counts), max(counts)) if counts else None
        data = {"label": name, "observed": observed, "num_classes": num_classes, "ignored": ignored, "out": bad_count}
        allowed = f"[0, {num_classes})" if num_classes is not None else "[0, inf)"
        ignore_note = f"; {ignored} equal ignore_index {ignore_index} (allowed)" if ignored else ""
        if bad_count:
            results.append(
                CheckResult(
                    "label_range",
                    False,
                    f"label range: {bad_count} value(s) of {key} outside {allowed}; observed range {observed};"
                    f" first: {bad_first}{ignore_note}",
                    "check num_classes against the data (labels numbered from 1, not 0; a class added later), and"
                    " mask padding with ignore_index rather than -1",
                    "error",
                    split,
                    data,
                )
            )
        else:
            checked = f"within {allowed}" if num_classes is not None else "non-negative (num_classes not given)"
            results.append(
                CheckResult(
                    "label_range",
                    True,
                    f"{key} {checked}: observed range {observed}{ignore_note}",
                    None,
                    "info",
                    split,
                    data,
                )
            )
        results.append(_balance(key, name, counts, num_classes, split))
    return results


def _balance(key: str, name: str, counts: Counter[int], num_classes: int | None, split: str) -> CheckResult:
    classes = list(range(num_classes)) if num_classes is not None else (list(range(max(counts) + 1)) if counts else [])
    if not counts or len(classes) > BALANCE_MAX_CLASSES:
        return CheckResult(
            "class_balance",
            True,
            f"{key}: {len(classes)} classes, more than {BALANCE_MAX_CLASSES}; balance not reported",
            None,
            "info",
            split,
            {"label": name, "classes": len(classes)},
        )
    total = sum(counts.values())
    shares = {c: counts.get(c, 0) / total for c in classes}
    limit = min(0.9, DOMINANT_FACTOR / len(classes))
    absent = [c for c in classes if counts.get(c, 0) == 0]
    dominant = [c for c, s in shares.items() if s > limit]
    data = {"label": name, "counts": {c: counts.get(c, 0) for c in classes}, "dominant_limit": limit}
    table = ", ".join(f"{c}: {counts.get(c, 0)}" for c in classes)
    if absent or dominant:
        faults = []
        if absent:
            faults.append(f"class(es) {absent} absent from the sample")
        if dominant:
            faults.append(
                f"class(es) {dominant} above {limit:.0%} of labels ({', '.join(f'{shares[c]:.0%}' for c in dominant)})"
            )
        return CheckResult(
            "class_balance",
            True,
            f"class imbalance in {key}: {'; '.join(faults)}; counts {table}",
            "a weighted sampler or class weights in the loss; confirm the sample is representative (a loader that"
            " is not shuffled reads the first classes first)",
            "warning",
            split,
            data,
        )
    return CheckResult("class_balance", True, f"{key} counts {table}", None, "info", split, data)


def _check_length(loader: Any, split: str) -> CheckResult:
    """Samples per epoch against the batch size: what ``drop_last`` throws away, or the partial last batch."""
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return CheckResult(
            "loader_length", True, "not a map-style DataLoader: length not checkable", None, "info", split
        )
    dataset_len = _safe_len(loader.dataset)
    per_epoch = _safe_len(loader.sampler)
    if loader.batch_size is None or per_epoch is None:
        batches = _safe_len(loader)
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


def _row_hashes(sample: _Sample, parsed: list[tuple[dict, dict]]) -> dict[str, str]:
    """Hash of each sample's bytes (inputs and labels, by name) -> where it was first seen."""
    hashes: dict[str, str] = {}
    for b, (inputs, labels) in enumerate(parsed):
        tensors = {**{_kind(n, False): t for n, t in inputs.items()}, **{_kind(n, True): t for n, t in labels.items()}}
        size = _batch_size(tensors.values())
        if not size:
            continue
        rows = {k: t for k, t in sorted(tensors.items()) if t.dim() >= 1 and t.shape[0] == size}
        for r in range(size):
            digest = hashlib.blake2b(digest_size=16)
            for k, t in rows.items():
                row = t[r].detach().cpu().contiguous().reshape(-1)
                digest.update(f"{k}|{row.dtype}|{list(t.shape[1:])}|".encode())
                digest.update(row.view(torch.uint8).numpy().tobytes())
            hashes.setdefault(digest.hexdigest(), _where(sample, b, r))
    return hashes


def _check_leakage(
    train: _Sample, train_parsed: list[tuple[dict, dict]], val: _Sample, val_parsed: list[tuple[dict, dict]]
) -> CheckResult:
    train_hashes = _row_hashes(train, train_parsed)
    val_hashes = _row_hashes(val, val_parsed)
    shared = [h for h in val_hashes if h in train_hashes]
    coverage = ""
    if train.dataset_len and val.dataset_len:
        coverage = f" (distinct samples hashed: {len(train_hashes)} of {train.dataset_len} train, {len(val_hashes)} of"
        coverage += f" {val.dataset_len} val; duplicates outside the sample are not seen)"
    data = {"train_hashed": len(train_hashes), "val_hashed": len(val_hashes), "duplicates": len(shared)}
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


# ---------------------------------------------------------------------------------------------- entry point


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
    drawn: dict[str, tuple[_Sample, list[tuple[dict, dict]]]] = {}
    for split, loader in (("train", train_loader), ("val", val_loader)):
        if loader is None:
            continue
        sample = _draw(loader, sample_batches)
        parsed = [split_batch(batch, label_key) for batch in sample.batches]
        drawn[split] = (sample, parsed)
        results.append(_check_empty(sample, parsed, split))
        results.append(_check_non_finite(sample, parsed, split))
        results.append(_check_shapes(parsed, split))
        results.extend(_check_labels(sample, parsed, split, num_classes, ignore_index))
        results.append(_check_length(loader, split))
    if "val" in drawn:
        results.append(_check_leakage(*drawn["train"], *drawn["val"]))
    return results


def format_results(results: Sequence[CheckResult]) -> str:
    """A plain pass/fail table, one line per check with its hint indented below it when there is one."""
    lines = []
    for r in results:
        verdict = "FAIL" if not r.passed else ("WARN" if r.severity == "warning" else "ok")
        lines.append(f"{verdict:<4}  {r.split:<9}  {r.name:<14}  {r.detail}")
        if r.hint and (not r.passed or r.severity == "warning"):
            lines.append(f"{'':<31}try: {r.hint}")
    return "\n".join(lines)
