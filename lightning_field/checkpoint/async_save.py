"""Async save: the step blocks only to copy state into host memory; a background thread commits it.

Two pieces, each with one job:

* :class:`HostSnapshot` copies a nested checkpoint structure into host buffers that are reused from
  one save to the next (pinned when CUDA is present, so device-to-host copies run asynchronously and
  the step waits for one synchronisation, not one per tensor). After it returns, training may
  mutate the live tensors freely.
* :class:`BackgroundSave` runs one commit at a time on a daemon thread and hands its outcome back
  to the training thread, which alone advertises, prunes and applies the error policy. At most one
  save is in flight: the snapshot buffers are reused, so a new snapshot first waits for the writer.

The commit itself (write, hash, receipt exchange, manifest, rename or manifest PUT) is unchanged, so
every guarantee of the synchronous path holds: nothing is visible before its manifest is published.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

_IMMUTABLE = (str, bytes, int, float, bool, complex, type(None), torch.dtype, torch.device)


def cuda_present() -> bool:
    """Whether pinned host buffers can help: only with a CUDA device to copy from."""
    return torch.cuda.is_available()


class HostSnapshot:
    """Copies checkpoint structures into reusable host buffers.

    Buffers are keyed by their position in the structure plus shape and dtype, so a state that
    keeps its layout (the usual case: same model, same optimizer) allocates once and then only
    copies. Containers are rebuilt; tensors are copied; other leaves are deep-copied, because a
    live object (a sampler's state dict, a callback's list) could change while the writer runs.
    """

    def __init__(self, pin_memory: bool | None = None) -> None:
        self.pin_memory = cuda_present() if pin_memory is None else pin_memory
        self._buffers: dict[tuple[Any, ...], torch.Tensor] = {}

    def take(self, obj: Any) -> Any:
        """A copy of ``obj`` that shares no mutable state with it; blocks until device copies land."""
        memo: dict[int, Any] = {}
        used: set[tuple[Any, ...]] = set()
        copied = self._copy(obj, (), memo, used)
        if any(t.is_cuda for t in _tensors(obj)):
            torch.cuda.synchronize()
        for key in set(self._buffers) - used:
            del self._buffers[key]  # layout changed: let go of buffers no longer needed
        return copied

    @property
    def nbytes(self) -> int:
        return sum(b.untyped_storage().nbytes() for b in self._buffers.values())

    def _copy(self, obj: Any, path: tuple[Any, ...], memo: dict[int, Any], used: set[tuple[Any, ...]]) -> Any:
        if isinstance(obj, torch.Tensor):
            if id(obj) in memo:  # the same tensor twice (tied weights) stays one tensor
                return memo[id(obj)]
            out = self._copy_tensor(obj, path, used)
            memo[id(obj)] = out
            return out
        if isinstance(obj, _IMMUTABLE):
            return obj
        if isinstance(obj, dict):
            out_dict = obj.__class__() if type(obj) is not dict else {}
            for key, value in obj.items():
                out_dict[key] = self._copy(value, (*path, key), memo, used)
            return out_dict
        if isinstance(obj, list):
            return [self._copy(v, (*path, i), memo, used) for i, v in enumerate(obj)]
        if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
            return tuple(self._copy(v, (*path, i), memo, used) for i, v in enumerate(obj))
        return copy.deepcopy(obj, memo)

    def _copy_tensor(self, tensor: torch.Tensor, path: tuple[Any, ...], used: set[tuple[Any, ...]]) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        if isinstance(tensor, DTensor):
            return _host_dtensor(tensor, self._copy_tensor(tensor.to_local(), (*path, "local"), used))
        if tensor.is_sparse or tensor.layout != torch.strided or tensor.is_quantized:
            return tensor.detach().to("cpu", copy=True)
        key = (path, tuple(tensor.shape), tensor.dtype)
        buffer = self._buffers.get(key)
        if buffer is None:
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=self.pin_memory)
            self._buffers[key] = buffer
        used.add(key)
        buffer.copy_(tensor.detach(), non_blocking=self.pin_memory and tensor.is_cuda)
        if isinstance(tensor, torch.nn.Parameter):
            return torch.nn.Parameter(buffer, requires_grad=tensor.requires_grad)
        return buffer


def _host_dtensor(tensor: Any, local: torch.Tensor) -> Any:
    """A DTensor with ``tensor``'s sharding whose local shard is the host copy ``local``.

    Built like DCP's own async staging (which swaps the local tensor of a DTensor copy): the public
    ``DTensor.from_local`` would move the host copy back onto the mesh's device, and DCP's planner
    needs only the sharding metadata plus this rank's bytes.
    """
    from torch.distributed.tensor import DTensor

    return DTensor(local, tensor._spec, requires_grad=False)


def _tensors(obj: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return found


@dataclass
class SaveOutcome:
    """What a background commit produced: an error (nothing committed) or the committed path."""

    path: str
    step: int
    error: str | None
    started: float
    finished: float


class BackgroundSave:
    """One background commit at a time.

    The training thread calls :meth:`submit` with a job (the snapshot's commit) and later collects
    the outcome with :meth:`poll` (never blocks) or :meth:`wait`. An error is logged by the writer
    thread the moment it happens; what to do about it is the training thread's decision.
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._outcome: SaveOutcome | None = None

    @property
    def in_flight(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, path: str, step: int, job: Callable[[], str | None]) -> None:
        if self._thread is not None:
            raise RuntimeError("a background save is still pending: wait() for it before submitting another")
        started = time.monotonic()

        def run() -> None:
            try:
                error = job()
            except BaseException as err:  # the thread must report, never die silently
                error = f"{type(err).__name__}: {err}"
            if error is not None:
                log.error("Background checkpoint save of %s (step %d) failed: %s", path, step, error)
            self._outcome = SaveOutcome(path, step, error, started, time.monotonic())

        self._thread = threading.Thread(target=run, name="lightning-field-ckpt-writer", daemon=True)
        self._thread.start()

    def poll(self) -> SaveOutcome | None:
        """The finished save's outcome, once; None while it runs or when there is none."""
        if self._thread is None or self._thread.is_alive():
            return None
        return self._collect()

    def wait(self) -> SaveOutcome | None:
        """Block until the in-flight save (if any) has committed or failed; its outcome, once."""
        if self._thread is None:
            return None
        self._thread.join()
        return self._collect()

    def _collect(self) -> SaveOutcome | None:
        self._thread = None
        outcome, self._outcome = self._outcome, None
        return outcome
