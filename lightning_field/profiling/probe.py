"""Collective probe, nccl-tests style: time all-reduce, all-gather and reduce-scatter across sizes.

Run under ``torchrun`` (``field probe collectives`` does that for you)::

    torchrun --standalone --nproc_per_node 2 -m lightning_field.profiling.probe --out probe.json

Every rank runs every collective; rank 0 prints the table (size, time, algbw, busbw) and saves it.
A slow or misconfigured interconnect shows here, before a training run pays for it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lightning_field.core.distributed import global_rank
from lightning_field.planning.plan import PlanInputError, parse_count
from lightning_field.profiling.comm import bus_bandwidth

OPS = ("all_reduce", "all_gather", "reduce_scatter")
DEFAULT_SIZES = "1K,16K,256K,4M,32M"


def _run(op: str, tensor: torch.Tensor, world: int) -> None:
    if op == "all_reduce":
        dist.all_reduce(tensor)
    elif op == "all_gather":
        out = torch.empty(tensor.numel() * world, dtype=tensor.dtype, device=tensor.device)
        dist.all_gather_into_tensor(out, tensor)
    else:
        out = torch.empty(tensor.numel() // world, dtype=tensor.dtype, device=tensor.device)
        dist.reduce_scatter_tensor(out, tensor)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # a probe, not a training step: waiting here is the measurement


def probe(sizes: list[int], iters: int, warmup: int, device: torch.device) -> list[dict[str, Any]]:
    world = dist.get_world_size()
    rows = []
    for op in OPS:
        for size in sizes:
            elements = max(world, size // 4 // world * world)  # float32, divisible by the group size
            tensor = torch.ones(elements, dtype=torch.float32, device=device)
            # nccl-tests' size: the full output for all_gather, the full input for the others.
            size = elements * 4 * (world if op == "all_gather" else 1)
            row: dict[str, Any] = {"op": op, "bytes": size, "ranks": world}
            try:
                for _ in range(warmup):
                    _run(op, tensor, world)
                _sync(device)
                dist.barrier()
                started = time.perf_counter()
                for _ in range(iters):
                    _run(op, tensor, world)
                _sync(device)
                seconds = (time.perf_counter() - started) / iters
            except (RuntimeError, NotImplementedError) as err:
                row.update({"seconds": None, "algbw": None, "busbw": None, "error": str(err).splitlines()[0][:120]})
                rows.append(row)
                continue
            # Every rank's time, the slowest counts (as nccl-tests reports it).
            times: list[float] = [0.0] * world
            dist.all_gather_object(times, seconds)
            seconds = max(times)
            algbw, busbw = bus_bandwidth(op, row["bytes"], seconds, world)
            row.update({"seconds": seconds, "algbw": algbw, "busbw": busbw})
            rows.append(row)
    return rows


def render(rows: list[dict[str, Any]], backend: str) -> str:
    lines = [
        f"collective probe: {rows[0]['ranks'] if rows else '?'} ranks, backend {backend}",
        f"{'op':<15}{'size (B)':>12}{'time (us)':>12}{'algbw (GB/s)':>14}{'busbw (GB/s)':>14}",
    ]
    for r in rows:
        if r["seconds"] is None:
            lines.append(f"{r['op']:<15}{r['bytes']:>12}  unsupported: {r['error']}")
            continue
        algbw, busbw = r["algbw"] / 1e9, r["busbw"] / 1e9
        lines.append(f"{r['op']:<15}{r['bytes']:>12}{r['seconds'] * 1e6:>12.1f}{algbw:>14.3f}{busbw:>14.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="lightning_field.profiling.probe")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help="comma-separated message sizes, e.g. 1K,1M,64M")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out", default="collective_probe.json")
    args = p.parse_args(argv)
    try:
        sizes = [int(parse_count(s, "--sizes")) for s in args.sizes.split(",")]
    except PlanInputError as err:
        print(f"probe: {err}", file=sys.stderr)
        return 2
    if "RANK" not in os.environ:
        print("probe: run me under torchrun (or use `field probe collectives`)", file=sys.stderr)
        return 2
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    try:
        device = (
            torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if backend == "nccl" else torch.device("cpu")
        )
        if device.type == "cuda":
            torch.cuda.set_device(device)
        rows = probe(sizes, args.iters, args.warmup, device)
        if global_rank() == 0:
            Path(args.out).write_text(json.dumps({"backend": backend, "rows": rows}, indent=2))
            print(render(rows, backend))
            print(f"saved {args.out}")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
