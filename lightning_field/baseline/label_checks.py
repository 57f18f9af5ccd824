"""Checks on the labels: integer labels within ``[0, num_classes)`` (``ignore_index`` allowed), and the
class balance of the sample.

One module because both read the same per-class counts, collected in one pass over the labels.
"""

from __future__ import annotations

from collections import Counter

import torch

from lightning_field.baseline.check_result import CheckResult
from lightning_field.baseline.data_sample import DataSample, ParsedBatches, describe_tensor

#: Class balance is reported only for integer labels with at most this many classes: beyond it
#: (e.g. a 256-byte or 50k-token vocabulary) per-class shares in a small sample say little.
BALANCE_MAX_CLASSES = 50
#: A class is flagged as dominant above ``min(0.9, DOMINANT_FACTOR / k)`` of the labels: three
#: times its uniform share, capped so that a two-class problem is flagged only at 90/10.
DOMINANT_FACTOR = 3.0


def check_labels(
    sample: DataSample,
    parsed: ParsedBatches,
    split: str,
    num_classes: int | None,
    ignore_index: int | None,
) -> list[CheckResult]:
    """``label_range`` and ``class_balance`` per label tensor; a floating label (a regression target)
    gets its observed range and no class checks."""
    label_names = sorted({n for _, labels in parsed for n in labels})
    if not label_names:
        return [
            CheckResult(
                "label_range", True, "no labels identified in the batch; label checks skipped", None, "info", split
            )
        ]
    results: list[CheckResult] = []
    for name in label_names:
        key = describe_tensor(name, True)
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
                    bad_first = f"value {value} at {sample.where(b, row if t.dim() >= 1 else None)}"
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
