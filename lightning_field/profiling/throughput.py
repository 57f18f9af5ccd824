"""Effective throughput: samples, tokens and FLOPs per second, MFU against a sourced peak, peak memory.

FLOPs per optimizer step come from, in order: the module's own ``flops_per_batch`` attribute;
``torch.utils.flop_counter.FlopCounterMode`` around the first real training batch (the matmul-type
operations it knows, forward and backward, measured once, no extra compute); or 6·N·tokens when the batch has tokens.
MFU is reported only against a known peak (Lightning's ``get_available_flops``, a dense datasheet peak
for the devices it lacks, or the user's override): for an unknown device it is absent, not guessed,
and the denominator is always reported next to it.
"""

from __future__ import annotations

import os
import resource
import sys
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from lightning.fabric.utilities.throughput import get_available_flops

# Dense (no sparsity) peak FLOP/s by device name fragment and dtype, from the vendors' datasheets, for
# the devices Lightning's ``get_available_flops`` (2.6) lacks or gets wrong: it parses a plain
# "NVIDIA H200" as no known chip and lists its H200 figures with sparsity, and it reads "NVIDIA L40S"
# as an L4. Every other device's peak is Lightning's.
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989e12, "fp16": 989e12, "tf32": 494.5e12, "fp32": 67e12},
    "L40S": {"bf16": 362e12, "fp16": 362e12, "tf32": 183e12, "fp32": 91.6e12},
}
PEAK_SOURCE = "NVIDIA datasheets, dense: H200 SXM, L40S (tensor-core peaks without sparsity)"
LIGHTNING_PEAK_SOURCE = "Lightning's get_available_flops (lightning.fabric.utilities.throughput)"

# Our dtype keys as get_available_flops names them.
_LIGHTNING_DTYPES: dict[str, torch.dtype | str] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "tf32": "tfloat32",
    "fp32": torch.float32,
}


def dtype_key(precision: str) -> str:
    if "bf16" in precision:
        return "bf16"
    if "16" in precision:
        return "fp16"
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"


def peak_flops(device: torch.device, precision: str, override: float | None) -> tuple[float | None, str]:
    """(peak FLOP/s, where it came from); (None, why) for a device whose peak is not known."""
    if override is not None:
        return override, "user override (peak_flops)"
    if device.type != "cuda":
        return None, f"no peak for {device.type}: MFU is not reported"
    name = torch.cuda.get_device_name(device)
    key = dtype_key(precision)
    for fragment, peaks in PEAK_FLOPS.items():
        if fragment in name:
            if key in peaks:
                return peaks[key], f"{fragment} {key} dense peak; {PEAK_SOURCE}"
            break
    else:
        with warnings.catch_warnings():
            # Its "FLOPs not found" warning: the reason is reported below, beside the missing MFU.
            warnings.simplefilter("ignore")
            available = get_available_flops(device, _LIGHTNING_DTYPES[key])
        if available is not None:
            return float(available), f"{name} {key} peak; {LIGHTNING_PEAK_SOURCE}"
    return None, f"unknown device {name!r} for {key}: MFU is not reported (pass peak_flops to set one)"


def batch_counts(batch: Any) -> tuple[int, int | None]:
    """(samples, tokens): tokens only when the batch has ``input_ids``."""
    samples = 0
    tokens = None
    if isinstance(batch, Mapping) and isinstance(batch.get("input_ids"), torch.Tensor):
        ids = batch["input_ids"]
        return int(ids.shape[0]), int(ids.numel())
    first = batch
    while isinstance(first, (list, tuple)) and first:
        first = first[0]
    if isinstance(first, torch.Tensor) and first.dim() > 0:
        samples = int(first.shape[0])
    return samples, tokens


def parameter_count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def peak_memory_bytes(device: torch.device) -> tuple[int, str]:
    """(bytes, what): the CUDA allocator's peak on GPU, the process's peak RSS on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024), "max_rss"


def host_name() -> str:
    return os.uname().nodename
