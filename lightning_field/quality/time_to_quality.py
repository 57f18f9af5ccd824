"""``TimeToQuality``: wall time, device-hours and cost until a quality target, across every restart.

The clock starts at the run's first ``run_start`` event and never pauses: an interruption, the
downtime before the restart and the restart itself all count, because they all delay the moment
the model is good enough. Everything the clock needs is in the run's fsynced event log (and a
per-step heartbeat that survives SIGKILL), so a killed and restarted job continues the same clock.

At each evaluation it records the monitored metric, notices the first crossing of the target,
forecasts the crossing from the curve so far, and rewrites ``<run>/field/time_to_quality.json``
with the goodput ledger. At the end of ``fit`` it prints a summary.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from typing_extensions import override

from lightning_field.checkpoint.manifest_checkpoint import ManifestCheckpoint
from lightning_field.checkpoint.observe import CommitWatcher, field_run_dir, find_manifest_checkpoint
from lightning_field.checkpoint.preemption import TrainingPreempted
from lightning_field.compat import lightning as internals
from lightning_field.core.events import EventLog, read_events, select_run
from lightning_field.core.fsio import atomic_write_bytes
from lightning_field.core.heartbeat import Heartbeat, heartbeat_path, read_heartbeat
from lightning_field.core.layout import SUMMARY_RELPATH
from lightning_field.quality.forecast import forecast
from lightning_field.quality.ledger import goodput_ledger
from lightning_field.quality.target import MODES, crossed, quality_summary, render_summary

__all__ = ["MODES", "TimeToQuality", "crossed", "quality_summary", "render_summary"]


class TimeToQuality(Callback):
    """Measure time and cost to ``target`` on the logged metric ``monitor``, across restarts.

    Args:
        monitor: a metric logged during validation (e.g. a torchmetrics value via ``self.log``).
        target: the quality to reach; ``mode="min"`` for losses, ``"max"`` for accuracies.
        deadline_hours: wall time from the run's start by which the target must be reached.
        price_per_device_hour: for cost = device-hours x price (device-hours count every attempt).
        progress_every_s: how often, at most, to append a progress event to the log (the per-step
            heartbeat needs no I/O; these events keep a record for runs whose heartbeat is lost).

    Raises:
        ValueError: ``mode`` is not "min" or "max", ``target`` is not finite, ``deadline_hours`` or
            ``progress_every_s`` is not positive, or ``price_per_device_hour`` is negative.

    Example::

        from lightning_field import ManifestCheckpoint, TimeToQuality

        quality = TimeToQuality(monitor="val_loss", target=1.2, mode="min", deadline_hours=48)
        trainer = Trainer(callbacks=[quality, ManifestCheckpoint(dirpath="ckpts", every_n_train_steps=500)])
        trainer.fit(model, datamodule=data, ckpt_path="last")
        # <run directory>/field/time_to_quality.json: time and cost to the target, over every attempt
    """

    def __init__(
        self,
        monitor: str,
        target: float,
        mode: str = "min",
        deadline_hours: float | None = None,
        price_per_device_hour: float | None = None,
        progress_every_s: float = 30.0,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"TimeToQuality mode must be 'min' or 'max', got {mode!r}")
        if not isinstance(target, (int, float)) or not math.isfinite(target):
            raise ValueError(f"TimeToQuality target must be a finite number, got {target!r}")
        if deadline_hours is not None and deadline_hours <= 0:
            raise ValueError(f"TimeToQuality deadline_hours must be > 0, got {deadline_hours}")
        if price_per_device_hour is not None and price_per_device_hour < 0:
            raise ValueError(f"TimeToQuality price_per_device_hour must be >= 0, got {price_per_device_hour}")
        if progress_every_s <= 0:
            raise ValueError(f"TimeToQuality progress_every_s must be > 0, got {progress_every_s}")
        self.monitor = monitor
        self.target = float(target)
        self.mode = mode
        self.deadline_s = deadline_hours * 3600.0 if deadline_hours is not None else None
        self.price_per_device_hour = price_per_device_hour
        self.progress_every_s = progress_every_s
        self.summary: dict[str, Any] = {}
        self._attempt_finished = False
        self.history: list[tuple[int, float]] = []
        self._run_dir: Path | None = None
        self._events: EventLog | None = None
        self._heartbeat: Heartbeat | None = None
        self._checkpoint: ManifestCheckpoint | None = None
        self._first_step_unix: float | None = None
        self._data_wait_s = 0.0
        self._wait_before_fetch = 0.0
        self._fetch_started: float | None = None
        self._eval_s = 0.0
        self._eval_started: float | None = None
        self._batches = 0
        self._last_progress = 0.0
        self._commits = CommitWatcher()
        self._world_size = 1

    # ------------------------------------------------------------------ setup: the clock and the dead attempts
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._run_dir = field_run_dir(trainer)
        self._world_size = trainer.world_size
        # Each fit() is its own attempt: its counters start from zero.
        self._attempt_finished = False
        self._first_step_unix = None
        self._data_wait_s = self._wait_before_fetch = self._eval_s = 0.0
        self._fetch_started = self._eval_started = None
        self._batches = 0
        self._last_progress = 0.0
        self._commits.reset()
        self._checkpoint = find_manifest_checkpoint(trainer)
        internals.install_fetch_hook(trainer, "before", self._before_fetch)
        internals.install_fetch_hook(trainer, "after", self._after_fetch)
        if not trainer.is_global_zero:
            return
        self._events = EventLog(self._run_dir, world_size=trainer.world_size)
        previous = read_events(self._run_dir)
        self._record_dead_attempts(previous)
        # The deadline's clock starts with the run: a resumed attempt joins its run at the load, and
        # that run's first run_start is the one every reader takes.
        if not any(e["event"] == "run_start" for e in select_run(previous, self._events.run_id)):
            self._events.emit(
                "run_start",
                payload={
                    "monitor": self.monitor,
                    "target": self.target,
                    "mode": self.mode,
                    "deadline_s": self.deadline_s,
                    "price_per_device_hour": self.price_per_device_hour,
                },
            )
        self._heartbeat = Heartbeat(self._run_dir, self._events.attempt)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._events is not None:
            self._events.follow()  # the checkpoint's load (before this hook) may have moved the attempt to its run

    def _record_dead_attempts(self, previous: list[dict[str, Any]]) -> None:
        """Turn the heartbeat of every earlier attempt that died without a word into an event."""
        assert self._events is not None and self._run_dir is not None
        ended = {e["attempt"] for e in previous if e["event"] == "attempt_end"}
        recorded = {e["payload"].get("attempt") for e in previous if e["event"] == "attempt_crashed"}
        for attempt in sorted({e["attempt"] for e in previous} - ended - recorded - {self._events.attempt}):
            beat = read_heartbeat(heartbeat_path(self._run_dir, attempt)) or {"attempt": attempt}
            self._events.emit("attempt_crashed", step=beat.get("step"), payload={**beat, "attempt": attempt})

    # ------------------------------------------------------------------ the hot path: counters only
    def _before_fetch(self) -> None:
        self._fetch_started = time.perf_counter()
        self._wait_before_fetch = self._data_wait_s

    def _after_fetch(self) -> None:
        if self._fetch_started is not None and self._first_step_unix is not None:
            # The first fetch of an attempt is its data fast-forward: restart overhead, not data wait.
            self._data_wait_s += time.perf_counter() - self._fetch_started
        self._fetch_started = None

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._first_step_unix is None:
            self._first_step_unix = time.time()
        committed = self._commits.new_commit(self._checkpoint, trainer)
        if committed is not None:
            # The counters as they stood at that commit: what a later kill cannot take away.
            self._emit_progress(trainer, commit_step=committed[1], data_wait_s=self._wait_before_fetch)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._batches += 1
        if self._heartbeat is not None and self._first_step_unix is not None:
            now = time.time()
            self._heartbeat.beat(
                trainer.global_step, self._first_step_unix, now, self._data_wait_s, self._eval_s, self._batches
            )
            if now - self._last_progress >= self.progress_every_s:
                self._emit_progress(trainer)

    def _emit_progress(self, trainer: pl.Trainer, **extra: Any) -> None:
        if self._events is None:
            return
        self._last_progress = time.time()
        payload = {
            "step": trainer.global_step,
            "first_step_unix": self._first_step_unix,
            "last_beat_unix": self._last_progress,
            "data_wait_s": self._data_wait_s,
            "eval_s": self._eval_s,
            "batches": self._batches,
            "devices": self._world_size,
            **extra,
        }
        self._events.emit("progress", step=trainer.global_step, payload=payload)

    # ------------------------------------------------------------------ evaluation: the quality trajectory
    def _fitting(self, trainer: pl.Trainer) -> bool:
        return trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._fitting(trainer):
            self._eval_started = time.perf_counter()

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._fitting(trainer) or self._eval_started is None:
            return
        started, self._eval_started = self._eval_started, None
        seconds = time.perf_counter() - started
        logged = trainer.callback_metrics.get(self.monitor)
        if logged is None:
            available = ", ".join(sorted(trainer.callback_metrics)) or "none"
            raise ValueError(
                f"TimeToQuality(monitor={self.monitor!r}): that metric was never logged by validation. Logged"
                f" metrics: {available}. Log it with self.log({self.monitor!r}, ...) in validation_step."
            )
        value = float(logged.item() if isinstance(logged, torch.Tensor) else logged)
        step = trainer.global_step
        self.history.append((step, value))
        if self._events is not None:
            if crossed(value, self.target, self.mode) and not self.summary.get("reached"):
                self._events.emit("target_reached", step=step, payload={"monitor": self.monitor, "value": value})
            payload = {"seconds": time.perf_counter() - started, "metrics": {self.monitor: value}}
            pending = {"attempt": self._events.attempt, "event": "eval", "wall_time": time.time(), "step": step}
            self._write(trainer, pending=[{**pending, "payload": payload}])
            # The summary and forecast are evaluation bookkeeping: booked with the evaluation they follow.
            seconds = payload["seconds"] = time.perf_counter() - started
            self._events.emit("eval", step=step, payload=payload)
        self._eval_s += seconds

    # ------------------------------------------------------------------ the summary
    def _write(
        self, trainer: pl.Trainer, final: bool = False, pending: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        assert self._run_dir is not None
        now = time.time()
        events = select_run(read_events(self._run_dir) + (pending or []))
        ledger = goodput_ledger(events, now=now)
        summary = quality_summary(
            events, self.monitor, self.target, self.mode, self.price_per_device_hour, self.deadline_s, now, ledger
        )
        history = [
            (int(e["step"]), float(e["payload"]["metrics"][self.monitor]))
            for e in events
            if e["event"] == "eval" and self.monitor in e["payload"].get("metrics", {})
        ]
        if summary["reached"] is None:
            summary["forecast"] = forecast(
                history,
                self.target,
                self.mode,
                trainer.global_step,
                summary["so_far"]["wall_s"],
                self.deadline_s,
            ).to_dict()
        summary["goodput"] = {
            "goodput": ledger.goodput,
            "elapsed_s": ledger.elapsed_s,
            "buckets_s": ledger.buckets,
            "idle_breakdown_s": ledger.idle_breakdown,
            "interruptions": ledger.interruptions,
            "mean_time_between_interruptions_s": ledger.mean_time_between_interruptions_s,
            "lost_steps": ledger.lost_steps,
            "redone_steps": ledger.redone_steps,
            "attempts": [
                {
                    "attempt": a.attempt,
                    "status": a.status,
                    "resumed_from_step": a.resumed_from_step,
                    "resumed_from_tier": a.resumed_from_tier,
                    "last_step": a.last_step,
                    "lost_steps": a.lost_steps,
                    "cut_back_to": a.cut_back_to,
                    "seconds": a.seconds,
                }
                for a in ledger.attempts
            ],
        }
        summary["final"] = final
        atomic_write_bytes(self._run_dir / SUMMARY_RELPATH, json.dumps(summary, indent=2, default=str).encode())
        self.summary = summary
        self._log_metrics(trainer, summary)
        return summary

    def _log_metrics(self, trainer: pl.Trainer, summary: Mapping[str, Any]) -> None:
        metrics = {
            "ttq/elapsed_h": summary["so_far"]["wall_s"] / 3600.0,
            "ttq/device_hours": summary["so_far"]["device_hours"],
            "goodput/fraction": summary["goodput"]["goodput"],
            "goodput/interruptions": float(summary["goodput"]["interruptions"]),
        }
        for bucket, seconds in summary["goodput"]["buckets_s"].items():
            metrics[f"goodput/{bucket}_s"] = seconds
        if summary["so_far"]["cost"] is not None:
            metrics["ttq/cost"] = summary["so_far"]["cost"]
        if summary["reached"] is not None:
            metrics["ttq/time_to_target_h"] = summary["reached"]["wall_s"] / 3600.0
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.finish_attempt(trainer)

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # A preempted attempt ends with TrainingPreempted, so Lightning calls neither on_fit_end nor
        # teardown: its summary is written here, and the heartbeat stops either way.
        if isinstance(exception, TrainingPreempted):
            self.finish_attempt(trainer)
        self.teardown(trainer, pl_module, "fit")

    def finish_attempt(self, trainer: pl.Trainer) -> None:
        """Write and print this attempt's final summary, once: at the end of ``fit``, or when a
        preemption ends the attempt (``WandbReview`` calls it too, whichever callback runs first)."""
        if self._events is None or self._attempt_finished:
            return
        self._attempt_finished = True
        self._emit_progress(trainer)
        summary = self._write(trainer, final=True)
        rank_zero_info(render_summary(summary))

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._heartbeat is not None:
            self._heartbeat.close()
            self._heartbeat = None
        self._events = None

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"history": list(self.history), "reached": self.summary.get("reached")}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = [(int(step), float(value)) for step, value in state_dict.get("history", [])]
        if state_dict.get("reached"):
            self.summary["reached"] = state_dict["reached"]
