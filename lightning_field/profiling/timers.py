"""Per-step section timers that never synchronise the device.

On CPU a section is two ``perf_counter_ns`` readings. On CUDA it is a pair of CUDA events recorded
on the current stream; the pair is kept in a queue and read only once ``query()`` says both have
completed, a few steps later, so the host never waits for the GPU. Completed steps go into a bounded
buffer: memory stays constant however long the run.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_field.compat import lightning as internals

SECTIONS = ("data", "forward", "backward", "optimizer", "checkpoint")


@dataclass
class StepTiming:
    step: int
    seconds: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0  # end of the previous step to the end of this one (host clock): the real pace


class SectionTimer:
    """Marks sections within each step; ``completed()`` yields the steps whose timings are known.

    ``start(name)``/``stop(name)`` bracket a device section (forward, backward, optimizer).
    ``add_host(name, seconds)`` records a section measured on the host (data wait, checkpoint).
    """

    def __init__(self, device: torch.device, capacity: int = 2048) -> None:
        self.cuda = device.type == "cuda" and torch.cuda.is_available()
        self._pending: deque[tuple[StepTiming, dict[str, list[tuple[Any, Any]]]]] = deque()
        self._done: deque[StepTiming] = deque(maxlen=capacity)
        self._current: StepTiming | None = None
        self._marks: dict[str, list[tuple[Any, Any]]] = {}
        self._open: dict[str, Any] = {}
        self._step_started = 0.0
        self._last_end: float | None = None

    def begin_step(self, step: int) -> None:
        self._current = StepTiming(step)
        self._marks = {}
        self._open = {}
        self._step_started = time.perf_counter()

    def _now(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter_ns()

    def start(self, name: str) -> None:
        if self._current is not None:
            self._open[name] = self._now()

    def stop(self, name: str) -> None:
        if self._current is not None and name in self._open:
            # With gradient accumulation a section runs once per micro-batch: they add up.
            self._marks.setdefault(name, []).append((self._open.pop(name), self._now()))

    def add_host(self, name: str, seconds: float) -> None:
        if self._current is not None:
            self._current.seconds[name] = self._current.seconds.get(name, 0.0) + seconds

    def end_step(self) -> None:
        if self._current is None:
            return
        now = time.perf_counter()
        # End to end, so the data fetch before the batch and anything between steps are included; on a
        # GPU the host runs ahead, but not by more than the queue allows, so this converges on the pace.
        started = self._last_end if self._last_end is not None else self._step_started
        self._current.wall_s = now - started
        self._last_end = now
        self._pending.append((self._current, self._marks))
        self._current = None
        self._resolve()

    def _resolve(self) -> None:
        """Move every pending step whose marks are all complete into the done buffer (no waiting)."""
        while self._pending:
            timing, marks = self._pending[0]
            if self.cuda and not all(end.query() for pairs in marks.values() for _, end in pairs):
                return  # the GPU has not reached these events yet; look again next step
            for name, pairs in marks.items():
                if self.cuda:
                    timing.seconds[name] = sum(begin.elapsed_time(end) for begin, end in pairs) / 1000.0
                else:
                    timing.seconds[name] = sum(end - begin for begin, end in pairs) / 1e9
            self._done.append(timing)
            self._pending.popleft()

    def completed(self) -> list[StepTiming]:
        """Every step resolved so far (oldest first), and forget them."""
        self._resolve()
        out = list(self._done)
        self._done.clear()
        return out


class FetchClock:
    """Host time blocked in the train loader's ``next()``, summed until ``take()``.

    Installed through the fetch hooks shared by every callback that needs it, so several callbacks
    can time the same fetch without wrapping the loader more than once."""

    def __init__(self) -> None:
        self._started: float | None = None
        self._waited_s = 0.0

    def install(self, trainer: pl.Trainer) -> None:
        internals.install_fetch_hook(trainer, "before", self._before)
        internals.install_fetch_hook(trainer, "after", self._after)

    def _before(self) -> None:
        self._started = time.perf_counter()

    def _after(self) -> None:
        if self._started is not None:
            self._waited_s += time.perf_counter() - self._started
            self._started = None

    def take(self) -> float:
        """Seconds waited since the last ``take()``, and start counting again."""
        waited, self._waited_s = self._waited_s, 0.0
        return waited


class SectionHooks(Callback):
    """The section boundaries inside a training step, shared by every callback that times sections.

    Forward ends and backward begins at ``on_before_backward``; backward ends at ``on_after_backward``;
    the optimizer section begins at ``on_before_optimizer_step``. A subclass sets ``self._timer`` and
    opens the step and its forward section in ``on_train_batch_start``, and closes the optimizer section
    and the step in ``on_train_batch_end``: what else happens at those two hooks is its own business.
    """

    _timer: SectionTimer | None = None

    @override
    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        if self._timer is not None:
            self._timer.stop("forward")
            self._timer.start("backward")

    @override
    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._timer is not None:
            self._timer.stop("backward")

    @override
    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if self._timer is not None:
            self._timer.start("optimizer")
