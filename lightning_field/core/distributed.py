"""Rank-safe helpers: every rank calls every collective, including in single-process runs."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any, NoReturn

import torch.distributed as dist


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def global_rank() -> int:
    """This process's rank in the default process group, or from the environment before one exists."""
    if is_distributed():
        return dist.get_rank()
    return env_global_rank()


RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")
"""Where launchers put a process's rank, in the order Lightning's ``rank_zero_only`` reads them."""


def env_global_rank() -> int:
    """This process's global rank from the launcher's environment alone: before a process group (or
    the Trainer) exists, or in a process that never joins one.

    ``RANK`` (torchrun, this package's launchers) is the global rank. Without it the first of
    ``LOCAL_RANK``, ``SLURM_PROCID`` and ``JSM_NAMESPACE_RANK`` that is set counts, as Lightning reads
    them: its DDP launcher sets ``LOCAL_RANK`` in the processes it starts and nothing in rank 0's own,
    and ``LOCAL_RANK`` comes before ``SLURM_PROCID`` because one SLURM task can launch several local
    ranks. A node rank (``NODE_RANK`` / ``GROUP_RANK``) counts then: node 1's first process has
    ``LOCAL_RANK=0``. Its rank is offset by the node times the local world size (``LOCAL_WORLD_SIZE``,
    at least the local rank + 1), which is exact where that variable is set and never 0 off node 0.
    """
    values = {key: os.environ.get(key) for key in RANK_VARIABLES}
    if values["RANK"] is not None:
        return int(values["RANK"])
    local = next((int(value) for value in values.values() if value is not None), 0)
    node = int(os.environ.get("NODE_RANK") or os.environ.get("GROUP_RANK") or 0)
    if node == 0:
        return local
    local_world = max(int(os.environ.get("LOCAL_WORLD_SIZE") or 0), local + 1)
    return node * local_world + local


def world_size() -> int:
    if is_distributed():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", 1))


def all_gather_objects(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's ``obj``, in rank order. Collective: all ranks (of ``group``) must call it."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def broadcast_object(obj: Any, src: int = 0, group: Any = None) -> Any:
    """Rank ``src``'s ``obj`` on every rank. Collective: all ranks (of ``group``) must call it."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=group)
    return box[0]


def new_host_group() -> Any:
    """A gloo group of all ranks, for collectives that run off the training thread (a background
    checkpoint commit) without interleaving with the training backend's own. Collective."""
    if not is_distributed():
        return None
    return dist.new_group(backend="gloo")


def end_process_groups() -> None:
    """Destroy every process group once a job's collectives are done.

    Lightning leaves its groups up after ``fit``. Torn down by interpreter exit instead, gloo's
    threads can abort the process ("terminate called without an active exception", exit -6) after
    the work is done, which a launcher reads as a failed rank. Call it where every rank has finished
    its collectives: destroying is then local."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def exit_finished_process(code: int) -> NoReturn:
    """End a worker process whose results are all written, skipping interpreter teardown.

    Even after :func:`end_process_groups`, a finished multi-rank gloo job aborts at exit now and
    then ("terminate called without an active exception", -6; about one run in forty on a loaded
    2-core machine, always after the last Python frame returned): torch's C++ state is torn down
    while threads of its own still run. A launcher, or a test, reads that as a failed rank although
    every result is on disk. So: groups destroyed, Python's buffers flushed, then ``os._exit``.

    Only for processes that owe nothing to ``atexit`` (no W&B run left to finish, no open files):
    this library's workers and test jobs, never a user's training script.
    """
    end_process_groups()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or broken: nothing left to save
            stream.flush()
    os._exit(code)


def elastic_restart_hazard(env: Mapping[str, str]) -> str | None:
    """Why a torchrun launch in ``env`` may hang when it restarts its workers, or None.

    torch elastic's c10d rendezvous shares one TCPStore with the workers across restarts
    (``TORCHELASTIC_USE_AGENT_STORE=True``); restarted workers can then read the dead attempt's
    gloo addresses and hang or fail in ``init_process_group`` (pytorch#135712; plain Lightning and a
    torch-only script are affected alike). Only launches that restart (``--max-restarts`` > 0) can.
    """
    if env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true":
        return None
    try:
        restarts = int(env.get("TORCHELASTIC_MAX_RESTARTS", "0"))
    except ValueError:
        return None
    if restarts <= 0:
        return None
    return (
        f"this torchrun launch restarts failed workers (TORCHELASTIC_MAX_RESTARTS={restarts}) and shares its"
        " rendezvous store with them (TORCHELASTIC_USE_AGENT_STORE=True): restarted workers can hang or fail in"
        " init_process_group (pytorch#135712). Launch with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in the"
        " agents' environment, e.g. `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --max-restarts 3 ...`."
    )
