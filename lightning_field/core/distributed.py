"""Rank-safe helpers: every rank calls every collective, including in single-process runs."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any, NoReturn

import torch.distributed as dist

from lightning_field.core.launcher_env import env_global_rank


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def global_rank() -> int:
    """This process's rank in the default process group, or from the environment before one exists."""
    if is_distributed():
        return dist.get_rank()
    return env_global_rank()


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
