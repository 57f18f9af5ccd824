"""``StragglerMonitor``: per-rank section timing, one all-gather per report, culprits named with a reason.

Every step, each rank times its sections (data wait, forward, backward, optimizer step, checkpoint
save) without synchronising the device, and, under DDP, when it *arrives* at the gradient
all-reduce and how long the communication stayed exposed. Every report interval (a time, turned
into a step count all ranks agree on) the ranks exchange one fixed-size summary with one
``all_gather`` and every rank computes the same report:

* per rank and section, a relative score: the median over ranks of the section's median, divided
  by this rank's median (below 1: slower than its peers);
* "compute" excludes time spent waiting on communication, so the ranks a straggler holds back (whose
  wall time and backward grow) score normally, and the straggler, which arrives at the all-reduce
  last and waits least, is the one that scores low;
* a rank is flagged only when a section stays below the threshold, by a margin that matters
  against the step time, in ``k`` of the last ``n`` reports.

Because every rank computes the report from the same gathered numbers, a ``checkpoint_and_stop``
policy is executed by all ranks at the same step, so no rank is left in a collective alone.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import deque
from dataclasses import asdict
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel
from torch.utils.flop_counter import FlopCounterMode
from typing_extensions import override

from lightning_field.checkpoint.manifest_checkpoint import ManifestCheckpoint
from lightning_field.checkpoint.observe import CommitWatcher, field_run_dir, find_manifest_checkpoint
from lightning_field.compat import lightning as internals
from lightning_field.core.distributed import all_gather_objects
from lightning_field.core.layout import PROFILE_RELPATH
from lightning_field.profiling.comm import CommTimer, ProfiledDDPStrategy
from lightning_field.profiling.straggler_report import (
    SUMMARY_FIELDS,
    Flag,
    ScoringRules,
    StragglerReport,
    interval_summary,
    report_metrics,
    score_report,
)
from lightning_field.profiling.throughput import batch_counts, host_name, parameter_count, peak_flops, peak_memory_bytes
from lightning_field.profiling.timers import FetchClock, SectionHooks, SectionTimer
from lightning_field.profiling.watchdog import HangWatchdog

log = logging.getLogger(__name__)

POLICIES = ("warn", "checkpoint_and_stop")


class StragglerMonitor(SectionHooks):
    """Name the slow rank, its host and the section responsible.

    Args:
        report_interval_s: time between reports; converted to a step count all ranks agree on.
        threshold: relative score below which a section counts as slow (own median >= 1/threshold
            times the peers' median).
        min_share: and the excess must be at least this share of the median step time.
        k, n: flag a section when it is slow in ``k`` of the last ``n`` reports.
        policy: "warn" (log and record) or "checkpoint_and_stop" (all ranks save and stop together).
        process_group: the group to exchange summaries on (default: the whole world).
        data_wait_warn_share: warn about the input pipeline above this share of step time.
        warmup_steps: steps ignored at the start of each attempt (compilation, caches, first fetches).
        flops_per_batch: FLOPs of one training batch (forward+backward+optimizer); default: the module's
            ``flops_per_batch`` attribute, else measured once with FlopCounterMode.
        peak_flops: dense peak FLOP/s per device for MFU; default from a sourced table (GPUs only).
        max_reports: how many reports ``monitor.reports`` keeps in memory (all are in the JSONL files).
        hang_floor_s, hang_factor, hang_long_phase_s, hang_grace_s: a :class:`HangWatchdog` with these
            ``floor_s``, ``factor``, ``long_phase_s`` and ``grace_s``, or none while ``hang_floor_s`` is None.

    Raises:
        ValueError: ``report_interval_s`` is not positive, ``threshold`` is outside (0, 1), ``k`` and
            ``n`` do not satisfy 1 <= k <= n, ``policy`` is unknown, or a ``hang_*`` setting is refused.

    Example::

        from lightning_field import StragglerMonitor

        trainer = Trainer(strategy="ddp", devices=8, callbacks=[StragglerMonitor(report_interval_s=60)])
        # <default_root_dir>/field/profile/: per-rank step, data-wait and collective times, flagged ranks
    """

    def __init__(
        self,
        report_interval_s: float = 60.0,
        threshold: float = 0.8,
        min_share: float = 0.05,
        k: int = 2,
        n: int = 3,
        policy: str = "warn",
        process_group: Any = None,
        data_wait_warn_share: float = 0.3,
        warmup_steps: int = 3,
        flops_per_batch: float | None = None,
        peak_flops: float | None = None,
        max_reports: int = 1000,
        hang_floor_s: float | None = None,
        hang_factor: float = 10.0,
        hang_long_phase_s: float = 900.0,
        hang_grace_s: float = 30.0,
    ) -> None:
        if report_interval_s <= 0:
            raise ValueError(f"report_interval_s must be > 0, got {report_interval_s}")
        if not 0 < threshold < 1:
            raise ValueError(f"threshold must be in (0, 1), got {threshold}")
        if not 1 <= k <= n:
            raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        self._rules = ScoringRules(threshold, min_share, k, n, data_wait_warn_share)
        self.hang_watchdog = HangWatchdog.optional(hang_floor_s, hang_factor, hang_long_phase_s, hang_grace_s)
        self.report_interval_s = report_interval_s
        self.threshold, self.min_share = threshold, min_share
        self.k, self.n = k, n
        self.policy = policy
        self.process_group = process_group
        self.data_wait_warn_share = data_wait_warn_share
        self.warmup_steps = warmup_steps
        self.flops_per_batch = flops_per_batch
        self.peak_flops_override = peak_flops
        self.report: StragglerReport | None = None
        self.reports: deque[StragglerReport] = deque(maxlen=max_reports)
        self.stopped_for: Flag | None = None
        self._timer: SectionTimer | None = None
        self._comm: CommTimer | None = None
        self._hosts: list[str] = []
        self._history: dict[tuple[int, str], deque[bool]] = {}
        self._steps: list[Any] = []
        self._comm_steps: list[dict[str, Any]] = []
        self._fetch = FetchClock()
        self._next_report = self._first_counted = self._interval_steps = 0
        self._interval_started = 0.0
        self._samples = self._optimizer_steps = self._batches = 0
        self._tokens: int | None = None
        self._flop_counter: FlopCounterMode | None = None
        self._measured_flops: float | None = None
        self._checkpoint: ManifestCheckpoint | None = None
        self._commits = CommitWatcher()
        self._step_in_progress = -1
        self._out: Path | None = None
        self._peak: tuple[float | None, str] = (None, "")
        self._params = 0

    # ------------------------------------------------------------------ setup
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.hang_watchdog is not None:
            self.hang_watchdog.attach(trainer, pl_module, stage, after=self)
        if stage != "fit":
            return
        self._timer = SectionTimer(trainer.strategy.root_device)
        self._fetch.install(trainer)
        self._checkpoint = find_manifest_checkpoint(trainer)
        self._out = field_run_dir(trainer) / PROFILE_RELPATH
        self._peak = peak_flops(trainer.strategy.root_device, str(trainer.precision), self.peak_flops_override)
        self._interval_steps = 0
        self._history.clear()

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Counted from where this attempt starts (a resumed run starts at its checkpoint's step).
        self._first_counted = trainer.global_step + self.warmup_steps
        self._next_report = self._first_counted + max(self.warmup_steps, 5)
        self._hosts = self._gather_hosts()
        self._params = parameter_count(pl_module)
        strategy = trainer.strategy
        if isinstance(strategy, ProfiledDDPStrategy):
            self._comm = strategy.comm_timer
        elif (
            isinstance(strategy, DDPStrategy)
            and isinstance(strategy.model, DistributedDataParallel)
            and not internals.has_ddp_comm_hook(strategy)
        ):
            # A plain DDPStrategy registers no hook on CPU and none of its own: time the default all-reduce.
            self._comm = CommTimer(trainer.world_size)
            strategy.model.register_comm_hook(None, self._comm.wrap(allreduce_hook))
        self._interval_started = time.perf_counter()

    def _gather_hosts(self) -> list[str]:
        if self.process_group is None or not (dist.is_available() and dist.is_initialized()):
            return all_gather_objects(host_name())
        hosts: list[Any] = [None] * dist.get_world_size(self.process_group)
        dist.all_gather_object(hosts, host_name(), group=self.process_group)
        return hosts

    def _global_rank(self, index: int) -> int:
        """The global rank of the ``index``-th member of the exchange group."""
        if self.process_group is None or not (dist.is_available() and dist.is_initialized()):
            return index
        return dist.get_global_rank(self.process_group, index)

    # ------------------------------------------------------------------ the hot path
    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        timer = self._timer
        if timer is None:
            return
        step = trainer.global_step
        if step != self._step_in_progress:
            self._step_in_progress = step
            timer.begin_step(step)
            if self._comm is not None:
                self._comm.begin_step(step)
            checkpoint = self._checkpoint
            if checkpoint is not None and self._commits.new_commit(checkpoint, trainer) is not None:
                timer.add_host("checkpoint", checkpoint.last_blocking_seconds or 0.0)
        timer.add_host("data", self._fetch.take())
        samples, tokens = batch_counts(batch)
        self._samples += samples
        self._batches += 1
        if tokens is not None:
            self._tokens = (self._tokens or 0) + tokens
        if self._measured_flops is None and self._flop_counter is None and self._flops_source(pl_module) is None:
            self._flop_counter = FlopCounterMode(display=False)
            self._flop_counter.__enter__()
        timer.start("forward")

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        timer = self._timer
        if timer is None:
            return
        if self._flop_counter is not None:
            counter = self._flop_counter
            self._close_flop_counter()
            self._measured_flops = float(counter.get_total_flops())
        if trainer.global_step == self._step_in_progress:
            return  # accumulating: the optimizer step (and so the step's timing) is not done yet
        timer.stop("optimizer")
        timer.end_step()
        self._optimizer_steps += 1
        self._collect()
        if trainer.global_step >= self._next_report:
            self._report(trainer)

    def _collect(self) -> None:
        assert self._timer is not None
        for timing in self._timer.completed():
            if timing.step >= self._first_counted:
                self._steps.append(timing)
        if self._comm is not None:
            self._comm_steps.extend(s for s in self._comm.completed() if s["step"] >= self._first_counted)

    def _flops_source(self, pl_module: pl.LightningModule) -> float | None:
        if self.flops_per_batch is not None:
            return float(self.flops_per_batch)
        value = getattr(pl_module, "flops_per_batch", None)
        return float(value) if value is not None else None

    # ------------------------------------------------------------------ the report: one all_gather
    def _summary(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> list[float]:
        # Counted per batch, so gradient accumulation is counted per optimizer step automatically.
        flops_per_batch = self._flops_source(pl_module) or self._measured_flops
        if flops_per_batch is not None:
            flops: float | None = flops_per_batch * self._batches
        elif self._tokens:
            flops = 6.0 * self._params * self._tokens
        else:
            flops = None
        return interval_summary(
            self._steps,
            self._comm_steps,
            elapsed_s=time.perf_counter() - self._interval_started,
            flops=flops,
            samples=self._samples,
            tokens=self._tokens,
            peak_memory=float(peak_memory_bytes(trainer.strategy.root_device)[0]),
        )

    def _gather(self, trainer: pl.Trainer, summary: list[float]) -> list[list[float]]:
        if not (dist.is_available() and dist.is_initialized()):
            return [summary]
        group = self.process_group
        backend = dist.get_backend(group)
        device = trainer.strategy.root_device if backend == "nccl" else torch.device("cpu")
        mine = torch.tensor(summary, dtype=torch.float64, device=device)
        gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
        dist.all_gather(gathered, mine, group=group)  # every rank, every report: the only collective
        return [t.cpu().tolist() for t in gathered]

    def _report(self, trainer: pl.Trainer) -> None:
        pl_module = trainer.lightning_module
        self._collect()
        rows = [
            dict(zip(SUMMARY_FIELDS, values, strict=True))
            for values in self._gather(trainer, self._summary(trainer, pl_module))
        ]
        step = trainer.global_step
        # The next report: a time converted to steps from the slowest rank's pace, identical on all ranks.
        slowest = max((r["step_s"] for r in rows), default=0.0)
        self._interval_steps = max(1, math.ceil(self.report_interval_s / slowest)) if slowest > 0 else 1
        self._next_report = step + self._interval_steps
        report = self._score(rows, step, trainer)
        if self._comm_steps:
            report.collectives = {"group_size": trainer.world_size, **self._comm_steps[-1]}
        self.report = report
        self.reports.append(report)
        self._steps, self._comm_steps = [], []
        self._samples, self._tokens, self._optimizer_steps, self._batches = 0, None, 0, 0
        self._interval_started = time.perf_counter()
        if report.flagged and self.policy == "checkpoint_and_stop" and self.stopped_for is None:
            # Collective first: a failure while writing files below must not leave a peer in a save.
            self._checkpoint_and_stop(trainer, report.flagged[0])
        try:
            self._publish(trainer, report)
        except OSError as err:
            log.error("Could not write the straggler report at step %d: %s", step, err)

    def _score(self, rows: list[dict[str, Any]], step: int, trainer: pl.Trainer) -> StragglerReport:
        return score_report(
            rows,
            step,
            self._interval_steps,
            rules=self._rules,
            history=self._history,
            hosts=self._hosts or [host_name()] * len(rows),
            global_ranks=[self._global_rank(i) for i in range(len(rows))],
            comm_measured=self._comm is not None,
            loaders=self._loader_settings(trainer),
            peak_flops=self._peak,
        )

    @staticmethod
    def _loader_settings(trainer: pl.Trainer) -> str:
        settings = []
        for loader in internals.iter_loaders(trainer.train_dataloader):
            settings.append(
                f"num_workers={getattr(loader, 'num_workers', '?')}, pin_memory={getattr(loader, 'pin_memory', '?')},"
                f" prefetch_factor={getattr(loader, 'prefetch_factor', None)}"
            )
        return "; ".join(settings) or "unknown"

    def _publish(self, trainer: pl.Trainer, report: StragglerReport) -> None:
        """Each rank appends its own row and the flags to its file; rank 0 also the whole report
        (one line per report, not one per rank per rank), logs scalars and the event."""
        assert self._out is not None
        self._out.mkdir(parents=True, exist_ok=True)
        own = next((r for r in report.ranks if r["rank"] == trainer.global_rank), None)
        line = {
            "step": report.step,
            "row": own,
            "flagged": [asdict(f) for f in report.flagged],
            "collectives": report.collectives,
        }
        with open(self._out / f"rank-{trainer.global_rank:05d}.jsonl", "a") as f:
            f.write(json.dumps(line, default=str) + "\n")
        if not trainer.is_global_zero:
            return  # one voice: every rank has the same report
        with open(self._out / "reports.jsonl", "a") as f:
            f.write(json.dumps(report.to_dict(), default=str) + "\n")
        for flag in report.flagged:
            log.warning(
                "STRAGGLER: rank %d on %s is slow in %s (score %.2f: %.4f s vs %.4f s for its peers, in %d of the"
                " last %d reports)",
                flag.rank,
                flag.host,
                flag.section,
                flag.score,
                flag.own_s,
                flag.reference_s,
                flag.reports_below,
                self.n,
            )
        for warning in report.input_pipeline:
            log.warning("INPUT PIPELINE: %s", warning)
        metrics = report_metrics(report)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        events = self._checkpoint.events if self._checkpoint else None
        if events is not None and report.flagged:
            events.emit("straggler", step=report.step, payload={"flagged": [asdict(f) for f in report.flagged]})

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._close_flop_counter()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._close_flop_counter()

    def _close_flop_counter(self) -> None:
        # A first step that raised must not leave the counting mode and its module hooks installed.
        if self._flop_counter is not None:
            self._flop_counter.__exit__(None, None, None)
            self._flop_counter = None

    def _checkpoint_and_stop(self, trainer: pl.Trainer, flag: Flag) -> None:
        """Every rank is here at the same step (the report is identical everywhere): save together, stop."""
        self.stopped_for = flag
        if self._checkpoint is not None:
            self._checkpoint.save_now(trainer, "straggler-{step}")
        else:
            trainer.save_checkpoint(str(Path(trainer.default_root_dir) / f"straggler-step{trainer.global_step}.ckpt"))
        trainer.should_stop = True
        log.warning(
            "Stopping: rank %d on %s is a straggler in %s; all ranks saved a checkpoint at step %d",
            flag.rank,
            flag.host,
            flag.section,
            trainer.global_step,
        )
