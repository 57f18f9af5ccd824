"""Async save: the step blocks only for what cannot wait; a background thread copies and commits.

Three pieces, each with one job:

* :class:`HostSnapshot` (the :class:`Stager` that ships) copies a nested checkpoint structure into
  host buffers that are reused from one save to the next (pinned when CUDA is present, so
  device-to-host copies run asynchronously and the step waits for one synchronisation, not one per
  tensor). Containers, small leaves, buffers and
  device tensors are copied before the save returns.
* :class:`DeferredCopies`: the bulk of a CPU checkpoint is the parameters and the optimizer's state,
  and nothing changes those until the next ``optimizer.step()`` updates them. Their copies are
  therefore made by the writer thread while the next batch's forward and backward run. The
  training thread waits for them (:meth:`DeferredCopies.wait`) at the latest before that update,
  and before every hook outside the training batch, where callbacks such as Lightning's
  ``WeightAveraging`` and ``StochasticWeightAveraging`` write weights. Each copy is checked against
  the tensor's in-place write counter: state written in place before its copy was made fails that
  save (nothing is committed), and later saves copy everything before returning.
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
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from lightning_field.compat import torch as torch_compat
from lightning_field.core.workers import WRITING

log = logging.getLogger(__name__)

_IMMUTABLE = (str, bytes, int, float, bool, complex, type(None), torch.dtype, torch.device)


def cuda_present() -> bool:
    """Whether pinned host buffers can help: only with a CUDA device to copy from."""
    return torch.cuda.is_available()


class PendingCopies(Protocol):
    """The copies a :class:`Stager` left for the writer thread, and the training thread's wait for them."""

    waited_seconds: float

    @property
    def done(self) -> bool: ...

    def run(self) -> str | None:
        """Make the copies (writer thread, once); the reason the snapshot is unusable, else None."""
        ...

    def wait(self) -> None:
        """Block until :meth:`run` finished (training thread, any number of times)."""
        ...


@runtime_checkable
class Stager(Protocol):
    """The host copy of one save's state, apart from writing it (as torch DCP's ``AsyncStager`` is):
    :meth:`take` copies now what cannot wait and returns the copies left for the writer thread,
    which training waits for before it may write their sources. It calls nothing of its owner's.
    :class:`HostSnapshot` is the one that ships (reused buffers, pinned with CUDA, the parameters'
    and optimizer state's copies deferred on CPU)."""

    def take(
        self, obj: Any, deferrable: set[int] | None = None, label: Callable[[tuple[Any, ...]], str] | None = None
    ) -> tuple[Any, PendingCopies]: ...

    @property
    def nbytes(self) -> int:
        """Host memory its buffers hold between saves."""
        ...

    def release(self) -> None:
        """Let go of every buffer (the end of fit)."""
        ...


class DeferredCopies:
    """The tensor copies of one snapshot that the writer thread makes after the save returned.

    Call order: the training thread fills it during :meth:`HostSnapshot.take`; the writer thread
    calls :meth:`run` once, first thing in its job; the training thread calls :meth:`wait` before
    anything may write those tensors (any number of times, from any point after ``take``).
    """

    def __init__(self) -> None:
        # Each copy's name is made only for an error message: a per-step snapshot must not pay for it.
        self._copies: list[tuple[Callable[[], str], torch.Tensor, torch.Tensor, int]] = []
        self._done = threading.Event()
        self.error: str | None = None
        self.nbytes = 0
        self.waited_seconds = 0.0
        """How long the training thread waited for the copies: the async save's remaining blocking time."""

    def add(self, name: str | Callable[[], str], source: torch.Tensor, buffer: torch.Tensor) -> None:
        named = name if callable(name) else (lambda: name)
        self._copies.append((named, source, buffer, torch_compat.tensor_version(source)))
        self.nbytes += buffer.untyped_storage().nbytes()

    def __len__(self) -> int:
        return len(self._copies)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def run(self) -> str | None:
        """Make every copy (writer thread); the reason the snapshot is unusable, else None."""
        try:
            for name, source, buffer, version in self._copies:
                buffer.copy_(source.detach())
                if torch_compat.tensor_version(source) != version:
                    self.error = (
                        f"{name()} was written in place after the async save returned and before its copy was"
                        " made (outside optimizer.step(), in a batch-level hook or the forward pass); the"
                        " snapshot would mix two steps, so it was not committed, and later saves copy the"
                        " state before returning"
                    )
                    break
        except Exception as err:  # reported like any other commit error: nothing is committed
            self.error = f"copying the async snapshot failed: {type(err).__name__}: {err}"
        finally:
            self._copies = []  # no references to live training tensors outlive the copy
            self._done.set()
        return self.error

    def wait(self) -> None:
        """Block until :meth:`run` has finished (training thread)."""
        if self._done.is_set():
            return
        start = time.perf_counter()
        self._done.wait()
        self.waited_seconds += time.perf_counter() - start


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
        self._deferrable: set[int] = set()
        self._deferred: DeferredCopies | None = None
        self._label: Callable[[tuple[Any, ...]], str] = _slash_path
        self._saw_cuda = False

    def take(
        self, obj: Any, deferrable: set[int] | None = None, label: Callable[[tuple[Any, ...]], str] | None = None
    ) -> tuple[Any, DeferredCopies]:
        """A copy of ``obj`` that shares no mutable state with it, and the copies still to make.

        CPU tensors whose storage is in ``deferrable`` (storage data pointers: the parameters' and
        the optimizer state's, which only ``optimizer.step()`` updates) get their buffer now and
        their bytes when the returned :class:`DeferredCopies` runs. Everything else is copied
        before this returns, device copies included. ``label`` names a tensor by its position in
        ``obj`` for error messages.
        """
        memo: dict[int, Any] = {}
        used: set[tuple[Any, ...]] = set()
        self._deferrable, self._deferred = set(deferrable or ()), DeferredCopies()
        self._label = label or _slash_path
        self._saw_cuda = False
        try:
            copied = self._copy(obj, (), memo, used)
            deferred = self._deferred
        finally:
            self._deferrable, self._deferred = set(), None
        if self._saw_cuda:
            torch.cuda.synchronize()
        for key in set(self._buffers) - used:
            del self._buffers[key]  # layout changed: let go of buffers no longer needed
        return copied, deferred

    @property
    def nbytes(self) -> int:
        return sum(b.untyped_storage().nbytes() for b in self._buffers.values())

    def release(self) -> None:
        self._buffers.clear()

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
        from torch.distributed.tensor import DTensor  # lazy: absent where torch is built without distributed

        if isinstance(tensor, DTensor):
            return torch_compat.host_dtensor(tensor, self._copy_tensor(tensor.to_local(), (*path, "local"), used))
        if tensor.is_sparse or tensor.layout != torch.strided or tensor.is_quantized:
            return tensor.detach().to("cpu", copy=True)
        self._saw_cuda = self._saw_cuda or tensor.is_cuda
        key = (path, tuple(tensor.shape), tensor.dtype)
        buffer = self._buffers.get(key)
        if buffer is None:
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=self.pin_memory)
            self._buffers[key] = buffer
        used.add(key)
        if self._deferred is not None and self._defers(tensor):
            label = self._label
            self._deferred.add(lambda: label(path), tensor, buffer)
        else:
            buffer.copy_(tensor.detach(), non_blocking=self.pin_memory and tensor.is_cuda)
        if isinstance(tensor, torch.nn.Parameter):
            return torch.nn.Parameter(buffer, requires_grad=tensor.requires_grad)
        return buffer

    def _defers(self, tensor: torch.Tensor) -> bool:
        if tensor.device.type != "cpu" or not self._deferrable:
            return False
        pointer = tensor.untyped_storage().data_ptr()
        return pointer != 0 and pointer in self._deferrable


def _slash_path(path: tuple[Any, ...]) -> str:
    return "/".join(str(p) for p in path)


def optimizer_written_storages(module: torch.nn.Module, optimizers: Any) -> set[int]:
    """Storage data pointers of everything ``optimizer.step()`` updates: the module's parameters
    and every tensor in the optimizers' state."""
    pointers = {p.untyped_storage().data_ptr() for p in module.parameters()}
    for optimizer in optimizers:
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    pointers.add(value.untyped_storage().data_ptr())
    pointers.discard(0)
    return pointers


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

    The job runs on a parked daemon thread (:data:`~lightning_field.core.workers.WRITING`), started
    once and never ended: a thread ending as a DataLoader forks its workers can hang the child
    (core/workers.py), and a daemon stuck in its receipt exchange with a peer rank that died cannot
    hang the process's exit (``ThreadPoolExecutor`` joins its workers at exit).
    """

    def __init__(self) -> None:
        self._running: Future[None] | None = None
        self._outcome: SaveOutcome | None = None

    @property
    def in_flight(self) -> bool:
        return self._running is not None and not self._running.done()

    def submit(self, path: str, step: int, job: Callable[[], str | None]) -> None:
        if self._running is not None:
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

        self._running = WRITING.submit(run)

    def poll(self) -> SaveOutcome | None:
        """The finished save's outcome, once; None while it runs or when there is none."""
        if self._running is None or not self._running.done():
            return None
        return self._collect()

    def wait(self) -> SaveOutcome | None:
        """Block until the in-flight save (if any) has committed or failed; its outcome, once."""
        if self._running is None:
            return None
        futures_wait([self._running])
        return self._collect()

    def _collect(self) -> SaveOutcome | None:
        self._running = None
        outcome, self._outcome = self._outcome, None
        return outcome
