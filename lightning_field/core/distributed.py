"""Rank-safe helpers: every rank calls every collective, including in single-process runs."""

from __future__ import annotations

import os
from typing import Any

import torch.distributed as dist


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def global_rank() -> int:
    if is_distributed():
        return dist.get_rank()
    return int(os.environ.get("RANK", 0))


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order. Collective: all ranks must call it."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank. Collective: all ranks must call it."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
