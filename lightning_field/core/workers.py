"""Threads that are started once and never exit: parked between tasks, they are never caught
starting or ending by a ``fork``.

Why. A child forked while another thread of the parent is ending (its thread state being deleted
under the runtime's ``HEAD_LOCK``) can wait forever on that lock in ``PyOS_AfterFork_Child``: the
child deletes the other threads' states, which takes the lock, before it re-initialises it
(CPython gh-112275; fixed in later 3.11 and 3.12 releases, not in every Python users run). A
DataLoader forks its workers at every epoch's start, right after the epoch's checkpoint; a hashing
or writer thread started for that save and ending as the loader forked hung one rank of a 2-rank
job about once in ten suite runs (issue 45, item 6; its stack: ``PyOS_AfterFork_Child`` waiting on
a lock). So the package's background work runs on parked daemon threads: each started
the first time it is needed, then waiting on its own queue between tasks, never joined, never
ended (a daemon: a commit stuck on a dead peer cannot hang the interpreter's exit).

A forked child has none of its parent's threads: the first task it submits starts its own.
"""

from __future__ import annotations

import functools
import os
import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["ThreadPark"]

T = TypeVar("T")


class _Parked:
    """One daemon thread and its queue of tasks."""

    def __init__(self, name: str, park: ThreadPark) -> None:
        self.tasks: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = queue.SimpleQueue()
        self._park = park
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            future, fn, args = self.tasks.get()
            if not future.set_running_or_notify_cancel():
                self._park.returned(self)
                continue
            result: Any = None
            error: BaseException | None = None
            try:
                result = fn(*args)
            except BaseException as err:  # reported through the future, never lost with the thread
                error = err
            # Parked before the waiter is woken: a caller that submits again at once finds this thread
            # idle (its queue takes the task) instead of starting another.
            self._park.returned(self)
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)
            del future, fn, args, result, error  # nothing of the task is kept alive while parked


class ThreadPark:
    """Parked daemon threads named ``name``: :meth:`submit` runs a task on an idle one, starting
    another only where all are busy (two background saves in flight take two), and the thread parks
    again when it is done.

    One park per purpose for the whole process (:data:`HASHING`, :data:`WRITING`, :data:`WATCHING`): a
    thread that never exits cannot belong to an object that goes away."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._reset()
        # A forked child has none of the parent's threads, and the lock may have been held by one of
        # them at the fork: the child starts from an empty park with a fresh lock.
        os.register_at_fork(after_in_child=functools.partial(_reset_in_child, weakref.ref(self)))

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_Parked] = []
        self._busy = 0

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``fn(*args)`` on a parked thread; its result or exception comes through the future."""
        future: Future[T] = Future()
        with self._lock:
            parked = self._idle.pop() if self._idle else None
            self._busy += 1
        if parked is None:
            parked = _Parked(self.name, self)
        parked.tasks.put((future, fn, args))
        return future

    def returned(self, parked: _Parked) -> None:
        """A thread's task ended: it waits for the next one."""
        with self._lock:
            self._busy -= 1
            self._idle.append(parked)

    @property
    def busy(self) -> bool:
        """Whether a task is running (the hang watchdog asks whether a background save is in flight)."""
        return self._busy > 0

    @property
    def threads(self) -> int:
        """How many threads the park has started in this process (they all still live)."""
        return len(self._idle) + self._busy


def _reset_in_child(park: weakref.ref[ThreadPark]) -> None:
    alive = park()
    if alive is not None:
        alive._reset()


HASHING = ThreadPark("lightning-field-hash")
"""Hashes a file's bytes beside its write (tensor files, torch.save files)."""
WRITING = ThreadPark("lightning-field-ckpt-writer")
"""Commits a checkpoint beside training (async saves, snapshots committed beside the step)."""
WATCHING = ThreadPark("lightning-field-hang")
"""The hang watchdog's loops (its watch and its heartbeat), for as long as a fit runs."""
