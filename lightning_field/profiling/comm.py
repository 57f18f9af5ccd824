"""Collective timing: a DDP communication hook that times every bucket, and the strategy that installs it.

Per bucket and step it records bytes, when the bucket became ready (the rank *arrived* at the
collective), when its reduction completed, algorithm bandwidth and bus bandwidth (nccl-tests
factors for the group size). A bucket's time runs from ready to reduced, so it includes waiting
for the slowest peer and for earlier buckets: it is what the step experiences, not the link's
isolated speed (``field probe collectives`` measures that). Per step it records the *exposed*
communication, the time from the last bucket becoming ready (backward compute done) to the last
reduction completing: the part no compute overlaps.

Arrival is what names a straggler's culprit: wall times grow on every rank of a synchronised step,
but a rank that arrives last waits least at the first collective, and the ranks it holds back wait
longest. Both readings are on the rank's own clock, so no cross-host clock sync is needed.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

CommHook = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]

# nccl-tests bus-bandwidth factors: busbw = algbw x factor(n)
BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
}


def bus_bandwidth(op: str, bytes_: float, seconds: float, group_size: int) -> tuple[float, float]:
    """(algbw, busbw) in bytes per second."""
    algbw = bytes_ / seconds if seconds > 0 else 0.0
    return algbw, algbw * BUS_FACTORS[op](group_size)


@dataclass
class BucketTiming:
    index: int
    bytes: int
    arrived: float  # perf_counter when the bucket was handed to the hook
    done: float | None = None
    events: tuple[Any, Any] | None = None  # CUDA events when the reduction ran on a GPU


@dataclass
class StepComm:
    step: int
    buckets: list[BucketTiming] = field(default_factory=list)

    def complete(self) -> bool:
        return all(b.done is not None or b.events is not None for b in self.buckets)

    def summary(self, group_size: int) -> dict[str, Any]:
        """Bytes, durations and bandwidths per bucket, the exposed time, and the first-arrival wait."""
        rows = []
        for b in self.buckets:
            if b.events is not None:
                seconds = b.events[0].elapsed_time(b.events[1]) / 1000.0
            else:
                seconds = (b.done or b.arrived) - b.arrived
            algbw, busbw = bus_bandwidth("all_reduce", b.bytes, seconds, group_size)
            rows.append({"bucket": b.index, "bytes": b.bytes, "seconds": seconds, "algbw": algbw, "busbw": busbw})
        last_events = self.buckets[-1].events if self.buckets else None
        if last_events is not None and all(b.events is not None for b in self.buckets):
            # On a GPU the host-side future completes when the reduction is *queued*; the device events
            # say when it ran. Exposed: from the last bucket becoming ready to its reduction finishing.
            exposed = last_events[0].elapsed_time(last_events[1]) / 1000.0
        else:
            host_done = [b.done for b in self.buckets if b.done is not None]
            last_ready = max((b.arrived for b in self.buckets), default=0.0)
            exposed = max(max(host_done) - last_ready, 0.0) if host_done else None
        first = self.buckets[0] if self.buckets else None
        first_wait = rows[0]["seconds"] if first is not None else None
        return {
            "step": self.step,
            "buckets": rows,
            "bytes": sum(b.bytes for b in self.buckets),
            "exposed_s": exposed,
            "first_wait_s": first_wait,
        }


class CommTimer:
    """Wraps a DDP comm hook; keeps the last ``capacity`` steps' bucket timings."""

    def __init__(self, group_size: int, capacity: int = 512) -> None:
        self.group_size = group_size
        self._steps: deque[StepComm] = deque(maxlen=capacity)
        self._current: StepComm | None = None
        self._step = 0

    def begin_step(self, step: int) -> None:
        self._step = step
        self._current = None

    def wrap(self, inner: CommHook) -> CommHook:
        def timed(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
            if self._current is None or self._current.step != self._step:
                self._current = StepComm(self._step)
                self._steps.append(self._current)
            buffer = bucket.buffer()
            timing = BucketTiming(bucket.index(), buffer.numel() * buffer.element_size(), time.perf_counter())
            if buffer.is_cuda:
                start = torch.cuda.Event(enable_timing=True)
                start.record()
            self._current.buckets.append(timing)
            future = inner(state, bucket)

            def finished(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
                timing.done = time.perf_counter()
                if buffer.is_cuda:
                    end = torch.cuda.Event(enable_timing=True)
                    end.record()  # on the stream the reduction's result is used from
                    timing.events = (start, end)
                return fut.value()

            return future.then(finished)

        # DDP validates the hook's annotations as objects; string annotations (PEP 563) fail its check.
        timed.__annotations__ = {"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}
        return timed

    def completed(self) -> list[dict[str, Any]]:
        """Summaries of every finished step whose device events (if any) have completed; forgets them."""
        out = []
        while self._steps and self._steps[0] is not self._current:
            step = self._steps[0]
            if step.complete() and all(b.events is None or b.events[1].query() for b in step.buckets):
                out.append(step.summary(self.group_size))
                self._steps.popleft()
            else:
                break
        return out


class ProfiledDDPStrategy(DDPStrategy):
    """``DDPStrategy`` whose gradient all-reduces are timed (on CPU/gloo too, not only NCCL).

    Pass your own ``ddp_comm_hook`` (e.g. a compression hook) and it is wrapped, not replaced.
    """

    def __init__(self, *args: Any, ddp_comm_hook: CommHook | None = None, **kwargs: Any) -> None:
        self._user_hook = ddp_comm_hook
        super().__init__(*args, **kwargs)
        self.comm_timer: CommTimer | None = None

    @override
    def _register_ddp_hooks(self) -> None:
        self.comm_timer = CommTimer(self.world_size)
        state = self._ddp_comm_state
        inner = self._user_hook or allreduce_hook
        if self._ddp_comm_wrapper is not None:  # e.g. fp16 compression around the user's hook
            inner = self._ddp_comm_wrapper(inner)
        assert isinstance(self.model, DistributedDataParallel)  # wrapped by configure_ddp before this hook
        self.model.register_comm_hook(state, self.comm_timer.wrap(inner))
