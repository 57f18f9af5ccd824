"""Preemption signals become a checkpoint at the next step boundary on every rank.

A signal handler only records that a signal arrived; the save itself happens on the training
thread, after all ranks agree through one all-reduce, so no collective ever runs inside a handler
and no rank saves alone.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

DEFAULT_SIGNALS: tuple[int, ...] = (signal.SIGTERM, signal.SIGUSR1)


class PreemptionWatcher:
    def __init__(self, signals: Iterable[int] = DEFAULT_SIGNALS, on_first: Callable[[int], None] | None = None) -> None:
        self.signals = tuple(signals)
        self.on_first = on_first
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        """Take over the signals (replacing Lightning's own SIGTERM handler, which broadcasts from
        inside the handler and would deadlock a DDP run). Only possible on the main thread."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in self.signals:
            if sig not in self._previous:
                self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        first = self.received is None
        self.received = signum
        if first and self.on_first is not None:
            self.on_first(signum)

    @property
    def requested(self) -> bool:
        return self.received is not None
