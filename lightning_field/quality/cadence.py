"""``CheckpointCadence``: choose how often to checkpoint from what saving and failing actually cost.

It measures the blocking save cost δ online (running median over this run's saves), takes an MTBF
prior M from configuration and updates it with the interruptions the event log has seen
(exposure-weighted: M = (M₀ + T) / (1 + n), one pseudo-failure at the prior), and sets the interval
by Daly's formula (or Young's). The interval in seconds becomes a step count through the measured
step time, clamped, with hysteresis so it does not flap, and drives ``ManifestCheckpoint``.

A step interval the user set on ``ManifestCheckpoint`` is an upper bound unless ``may_lengthen``:
it bounds how much work a kill can cost, which the user may have chosen for reasons the formula
cannot see (a preemption notice shorter than the MTBF suggests, a budget for redone steps). Every
change is printed on rank 0 with the old and new interval and the figures behind it.

All ranks apply the same step count at the same step: the decision is taken by rank 0 right after
a commit (which every rank sees at the same step) and broadcast, a collective every rank calls.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from dataclasses import asdict, dataclass, replace
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lightning_field.checkpoint.manifest_checkpoint import ManifestCheckpoint
from lightning_field.checkpoint.observe import (
    CommitWatcher,
    configured_every_n_train_steps,
    field_run_dir,
    find_manifest_checkpoint,
)
from lightning_field.checkpoint.snapshot_interval import IntervalChoice
from lightning_field.core.distributed import broadcast_object
from lightning_field.core.events import read_run_events
from lightning_field.planning.intervals import (
    FORMULAS,
    FailureModel,
    TierIntervals,
    choose_in_steps,
)
from lightning_field.quality.ledger import goodput_ledger

log = logging.getLogger(__name__)


@dataclass
class CadenceDecision:
    save_s: float
    mtbf_s: float
    step_s: float
    interval_s: float
    steps: int
    applied: bool
    formula: str
    predicted_waste: float
    restart_s: float
    previous_steps: int = 0  # the interval this decision started from; 0: no step interval
    # Expected work redone per failure (estimates): from the persistent checkpoints alone at this
    # interval, and with the step snapshots (their measured cost) where they are on.
    lost_per_failure_s: float = 0.0
    coverage: float | None = None  # the share of failures a snapshot survives (None: no snapshots priced)
    snapshots_pay: bool | None = None  # None: no snapshots priced; False: "auto" turned them off
    snapshot_every_steps: int | None = None  # the snapshot interval chosen with this one (None: off)
    snapshot_s: float | None = None  # median time a snapshot held training up
    snapshot_commit_s: float | None = None  # median time before one is resumable (0: committed in line)
    lost_per_failure_with_snapshots_s: float | None = None
    predicted_waste_with_snapshots: float | None = None
    formula_steps: int = 0  # what the formula alone asks for, within min_steps and max_steps
    held_at_user_setting: bool = False  # the user's every_n_train_steps kept it below formula_steps
    reason: str = ""  # the sentence printed for this decision: old and new interval, and why


def updated_mtbf(prior_s: float, exposure_s: float, interruptions: int) -> float:
    """Posterior mean of the MTBF with the prior counted as one failure in ``prior_s`` of exposure."""
    return (prior_s + exposure_s) / (1 + interruptions)


def choose_steps(
    interval_s: float, step_s: float, current: int, min_steps: int, max_steps: int | None, hysteresis: float
) -> tuple[int, bool]:
    """(steps, changed): the interval in steps, clamped; kept at ``current`` if within the hysteresis."""
    steps = max(min_steps, round(interval_s / step_s)) if step_s > 0 else current
    if max_steps is not None:
        steps = min(steps, max_steps)
    if current >= 1 and abs(steps - current) <= hysteresis * current:
        return current, False
    return steps, steps != current


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


class CheckpointCadence(Callback):
    """Retune ``ManifestCheckpoint``'s step interval after every save.

    By default an ``every_n_train_steps`` set on ``ManifestCheckpoint`` is only ever shortened: the
    cadence checkpoints more often when saves are cheap relative to failures, never less often than
    the user asked. Without a step interval there, it chooses freely. Each change is printed on
    rank 0 (old and new interval, save cost, MTBF, formula) and recorded as a ``cadence`` event.

    Args:
        mtbf_hours: prior mean time between failures (interruptions) of this job's infrastructure.
        formula: "daly" (default) or "young".
        min_steps, max_steps: clamps on the interval in steps. Unless ``may_lengthen``, a user's
            ``every_n_train_steps`` below ``min_steps`` wins over it.
        hysteresis: relative change below which the interval is left alone.
        save_cost_prior_s: save cost to assume before the first save is measured.
        may_lengthen: let the interval grow beyond the ``every_n_train_steps`` the user set on
            ``ManifestCheckpoint``. Longer intervals mean more steps redone after a kill.

    Raises:
        ValueError: a setting out of range (``mtbf_hours`` <= 0, an unknown ``formula``,
            ``min_steps``/``max_steps`` out of order, a negative ``hysteresis``), or, at ``fit``, no
            ``ManifestCheckpoint`` among the callbacks.

    Example::

        from lightning_field import CheckpointCadence, ManifestCheckpoint

        trainer = Trainer(callbacks=[CheckpointCadence(mtbf_hours=12),
                                     ManifestCheckpoint(dirpath="ckpts", every_n_train_steps=500)])
    """

    def __init__(
        self,
        mtbf_hours: float,
        formula: str = "daly",
        min_steps: int = 1,
        max_steps: int | None = None,
        hysteresis: float = 0.2,
        save_cost_prior_s: float | None = None,
        may_lengthen: bool = False,
    ) -> None:
        if not mtbf_hours > 0:
            raise ValueError(f"CheckpointCadence mtbf_hours must be > 0, got {mtbf_hours}")
        if formula not in FORMULAS:
            raise ValueError(f"CheckpointCadence formula must be one of {', '.join(FORMULAS)}, got {formula!r}")
        if min_steps < 1 or (max_steps is not None and max_steps < min_steps):
            raise ValueError(f"CheckpointCadence needs 1 <= min_steps <= max_steps, got {min_steps}, {max_steps}")
        if hysteresis < 0:
            raise ValueError(f"CheckpointCadence hysteresis must be >= 0, got {hysteresis}")
        self.mtbf_prior_s = mtbf_hours * 3600.0
        self.formula = formula
        self.min_steps = min_steps
        self.max_steps = max_steps
        self.hysteresis = hysteresis
        self.save_cost_prior_s = save_cost_prior_s
        self.may_lengthen = may_lengthen
        self.decision: CadenceDecision | None = None
        self.decisions: list[CadenceDecision] = []
        self._checkpoint: ManifestCheckpoint | None = None
        self._save_costs: deque[float] = deque(maxlen=20)
        self._snapshot_costs: deque[tuple[float, float]] = deque(maxlen=50)  # (blocking, commit) per snapshot
        self._snapshot_step: int | None = None
        self._snapshots_in_line = False
        self._step_times: deque[float] = deque(maxlen=50)
        self._last_step_end: float | None = None
        self._last_step: int | None = None
        self._skip_next_step = False
        self._commits = CommitWatcher()
        self._failures = FailureModel(mtbf_hours=mtbf_hours, formula=formula)  # the prior; the posterior at start
        self._interruptions = 0
        self._user_steps: int | None = None
        self._hold_reported = False

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._checkpoint = find_manifest_checkpoint(trainer)
        if self._checkpoint is None:
            raise ValueError("CheckpointCadence drives a lightning_field.ManifestCheckpoint; add one to the callbacks")
        self._user_steps = configured_every_n_train_steps(self._checkpoint)
        # The snapshots' own failure model (its coverage, restart) with this cadence's MTBF and formula:
        # both tiers' intervals come from the one model.
        base = self._checkpoint.snapshots.failures or FailureModel()
        self._failures = replace(base, mtbf_hours=self.mtbf_prior_s / 3600.0, formula=self.formula)
        self._checkpoint.snapshots.assume(self._failures)
        self._snapshots_in_line = self._checkpoint.snapshots.in_line(trainer)
        self._snapshot_costs.clear()
        self._snapshot_step = None
        # Each fit() measures afresh.
        self._step_times.clear()
        self._last_step_end = self._last_step = None
        self._skip_next_step = False
        self._hold_reported = False
        self._commits.reset()

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Here, not in setup: by now this attempt's start is in the log, so the attempts before it
        # that died without a word are read as interruptions.
        self._interruptions = 0
        posterior: tuple[float, float | None, int] | None = None
        if trainer.is_global_zero:
            events = read_run_events(field_run_dir(trainer))
            if events:
                ledger = goodput_ledger(events, now=time.time())
                # Exposure of the attempts before this one (this one has only just started).
                exposure = sum(a.end_unix - a.start_unix for a in ledger.attempts[:-1])
                mtbf_s = updated_mtbf(self.mtbf_prior_s, exposure, ledger.interruptions)
                posterior = (mtbf_s, ledger.mean_restart_s, ledger.interruptions)
        # Every rank weighs the snapshots against the same model: rank 0 read the log.
        posterior = broadcast_object(posterior)
        if posterior is not None and self._checkpoint is not None:
            mtbf_s, restart_s, self._interruptions = posterior
            failures = replace(self._failures, mtbf_hours=mtbf_s / 3600.0)
            self._failures = failures if restart_s is None else replace(failures, restart_seconds=restart_s)
            self._checkpoint.snapshots.assume(self._failures)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self._last_step:
            return  # an accumulating micro-batch: the optimizer step is not done yet
        now = time.perf_counter()
        if self._last_step_end is not None and not self._skip_next_step:
            self._step_times.append((now - self._last_step_end) / max(trainer.global_step - (self._last_step or 0), 1))
        self._skip_next_step = False
        self._last_step_end, self._last_step = now, trainer.global_step

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        checkpoint = self._checkpoint
        snapshot = checkpoint.snapshots.last_costs if checkpoint is not None else None
        if snapshot is not None and snapshot.step != self._snapshot_step:
            self._snapshot_step = snapshot.step
            commit = 0.0 if self._snapshots_in_line else snapshot.commit_s  # in line: resumable at once
            self._snapshot_costs.append((snapshot.blocking_s, commit))
        if checkpoint is None or self._commits.new_commit(checkpoint, trainer) is None:
            return
        if checkpoint.last_blocking_seconds is not None:
            self._save_costs.append(checkpoint.last_blocking_seconds)
        # The save ran after this callback timed the step it followed: the step being timed now
        # contains it, so it is not a step time.
        self._skip_next_step = True
        replicated = trainer.num_nodes > 1
        decision = self._decide(checkpoint.every_n_train_steps, replicated) if trainer.is_global_zero else None
        decision = broadcast_object(decision)  # every rank, same step: they all saw this commit
        if decision is None:
            return
        if decision.applied:
            checkpoint.set_every_n_train_steps(decision.steps)
        if decision.snapshots_pay is not None:  # "auto" snapshots take the interval chosen with this one
            checkpoint.snapshots.adopt(trainer, self._snapshot_choice(decision))
        self.decision = decision
        self.decisions.append(decision)
        if trainer.is_global_zero:
            # A hold is printed once per fit: after every save it would only repeat itself.
            if decision.applied or (decision.held_at_user_setting and not self._hold_reported):
                rank_zero_info(decision.reason)
            self._hold_reported |= decision.held_at_user_setting
            events = checkpoint.events
            if events is not None:
                events.emit("cadence", step=trainer.global_step, payload=asdict(decision))
            metrics = {
                "cadence/interval_s": decision.interval_s,
                "cadence/interval_steps": float(checkpoint.every_n_train_steps),
                "cadence/save_s": decision.save_s,
                "cadence/mtbf_h": decision.mtbf_s / 3600.0,
                "cadence/predicted_waste": decision.predicted_waste,
                "cadence/lost_per_failure_s": decision.lost_per_failure_s,
            }
            if decision.lost_per_failure_with_snapshots_s is not None:
                metrics["cadence/lost_per_failure_with_snapshots_s"] = decision.lost_per_failure_with_snapshots_s
            if decision.predicted_waste_with_snapshots is not None:
                metrics["cadence/predicted_waste_with_snapshots"] = decision.predicted_waste_with_snapshots
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)

    def _decide(self, current: int, replicated: bool) -> CadenceDecision | None:
        save_s = statistics.median(self._save_costs) if self._save_costs else self.save_cost_prior_s
        if not save_s or not self._step_times:
            return None
        step_s = statistics.median(self._step_times)
        failures = self._failures
        snapshot_s, commit_s, user_every, budget = self._snapshot_figures()
        cap = None if self.may_lengthen else self._user_steps
        upper = self.max_steps if cap is None else min(cap, self.max_steps or cap)
        tau, steps, at, every = choose_in_steps(
            failures,
            save_s,
            snapshot_s,
            commit_s,
            step_s,
            lambda tau: choose_steps(tau, step_s, current, self.min_steps, upper, self.hysteresis)[0],
            replicated=replicated,
            snapshot_budget=budget,
            snapshot_steps=user_every,
        )
        changed = steps != current
        formula_steps, _ = choose_steps(tau, step_s, 0, self.min_steps, self.max_steps, self.hysteresis)
        decision = CadenceDecision(
            save_s=save_s,
            mtbf_s=failures.mtbf_s,
            step_s=step_s,
            interval_s=tau,
            steps=steps,
            applied=changed,
            formula=self.formula,
            predicted_waste=at.waste_alone or 0.0,
            restart_s=failures.restart_seconds,
            previous_steps=current,
            lost_per_failure_s=at.lost_alone_s,
            formula_steps=formula_steps,
            held_at_user_setting=cap is not None and formula_steps > cap,
        )
        if snapshot_s is not None:
            self._with_snapshots(decision, at, every, snapshot_s, commit_s)
        decision.reason = self._explain(decision)
        return decision

    def _snapshot_figures(self) -> tuple[float | None, float, int | None, float | None]:
        """(cost, commit, the user's interval or None for "auto", budget) of the snapshots; cost None:
        none to price. The cost is the one the snapshots' own choice was made from (the slowest rank's),
        else this rank's median."""
        checkpoint = self._checkpoint
        choice = checkpoint.snapshots.interval_choice() if checkpoint is not None else None
        if checkpoint is None or choice is None or checkpoint.snapshots.schedule is None:
            return None, 0.0, None, None
        interval = checkpoint.snapshots.schedule.interval
        cost = choice.snapshot_seconds
        if cost is None and self._snapshot_costs:
            cost = statistics.median(b for b, _ in self._snapshot_costs)
        commit = statistics.median(c for _, c in self._snapshot_costs) if self._snapshot_costs else 0.0
        return cost, commit, None if interval.auto else interval.every_n_train_steps, interval.budget

    def _with_snapshots(
        self, d: CadenceDecision, at: TierIntervals, every: int | None, snapshot_s: float, commit_s: float
    ) -> None:
        """The snapshot tier's figures at the intervals chosen (estimates)."""
        d.coverage, d.snapshot_s, d.snapshot_commit_s = at.coverage, snapshot_s, commit_s
        d.snapshots_pay = at.snapshots_pay
        if at.snapshots_on:  # "auto" where they pay, or the user's interval
            d.snapshot_every_steps = every
            d.lost_per_failure_with_snapshots_s = at.lost_per_failure_s
            d.predicted_waste_with_snapshots = at.waste

    def _snapshot_choice(self, d: CadenceDecision) -> IntervalChoice:
        """The snapshots' interval as this decision chose it, in the form their own choices take."""
        checkpoint = self._checkpoint
        assert checkpoint is not None and checkpoint.snapshots.schedule is not None
        interval = checkpoint.snapshots.schedule.interval
        every = d.snapshot_every_steps or interval.every_n_train_steps
        change = None
        if d.predicted_waste_with_snapshots is not None:
            change = d.predicted_waste_with_snapshots - d.predicted_waste
        why = (
            "chosen with the persistent interval by CheckpointCadence:"
            f" {d.lost_per_failure_with_snapshots_s or 0.0:.3g} s redone per failure instead of"
            f" {d.lost_per_failure_s:.3g} s, a predicted waste of"
            f" {100 * (d.predicted_waste_with_snapshots or 0.0):.2f}% against {100 * d.predicted_waste:.2f}% without"
            if d.snapshots_pay
            else "off: CheckpointCadence found they would cost more than they save beside a persistent checkpoint"
            f" every {_steps(d.steps)} (predicted waste {100 * d.predicted_waste:.2f}% without them)"
        )
        return IntervalChoice(
            every_n_train_steps=every,
            chosen_by="auto (CheckpointCadence)",
            budget=interval.budget,
            snapshot_seconds=d.snapshot_s,
            step_seconds=d.step_s,
            reason=why,
            off=not d.snapshots_pay,
            mtbf_hours=d.mtbf_s / 3600.0,
            coverage=d.coverage,
            persistent_interval_s=d.steps * d.step_s,
            lost_per_failure_s=d.lost_per_failure_with_snapshots_s,
            lost_alone_s=d.lost_per_failure_s,
            waste_change=change,
        )

    def _explain(self, d: CadenceDecision) -> str:
        """One sentence a user can check by hand: what changed, why, and the figures it came from."""
        user = self._user_steps
        if not d.applied:
            what = f"kept at {_steps(d.steps)}"
        elif not d.previous_steps:
            what = f"set to {_steps(d.steps)} (there was no step interval)"
        elif d.steps < d.previous_steps:
            what = f"shortened from {d.previous_steps} to {_steps(d.steps)}"
        else:
            what = f"lengthened from {d.previous_steps} to {_steps(d.steps)}"
        if d.held_at_user_setting:
            why = (
                f"; the formula asks for {_steps(d.formula_steps)}, but every_n_train_steps={user} was set on"
                " ManifestCheckpoint and is only ever shortened (pass CheckpointCadence(may_lengthen=True) to"
                " let it grow)"
            )
        elif d.applied and d.steps > d.previous_steps and user is not None and d.steps > user:
            why = f", beyond the every_n_train_steps={user} set on ManifestCheckpoint, because may_lengthen=True"
        elif d.applied and user is None and d.steps > d.previous_steps:
            why = "; no every_n_train_steps was set on ManifestCheckpoint, so the cadence chooses it"
        elif not d.applied:
            why = f"; the formula's {_steps(d.formula_steps)} is within the {self.hysteresis:.0%} hysteresis"
        else:
            why = ""
        if self._save_costs:
            n = len(self._save_costs)
            save = f"a measured save cost of {d.save_s:.3g} s (median of {n} save{'s' if n > 1 else ''})"
        else:
            save = f"an assumed save cost of {d.save_s:.3g} s (save_cost_prior_s)"
        mtbf = f"an MTBF of {d.mtbf_s / 3600:.3g} h"
        if d.lost_per_failure_with_snapshots_s is not None:  # the persistent tier covers only the failures
            # the snapshots do not survive
            mtbf += f" ({100 * (1 - (d.coverage or 0.0)):.0f}% of failures beyond the snapshots)"
        if self._interruptions:
            mtbf += f" (prior {self.mtbf_prior_s / 3600:.3g} h, {self._interruptions} interruption(s) seen)"
        lost = f" Expected work lost per failure: {d.lost_per_failure_s:.3g} s from the persistent checkpoints alone"
        if d.lost_per_failure_with_snapshots_s is not None:
            every = _steps(d.snapshot_every_steps or 0)
            lost += (
                f", {d.lost_per_failure_with_snapshots_s:.3g} s with a snapshot every {every}"
                f" (each holding training {d.snapshot_s or 0.0:.3g} s; {100 * (d.coverage or 0.0):.0f}% of failures"
                f" resume from one); predicted waste {d.predicted_waste_with_snapshots or 0.0:.2%} with the snapshots,"
                f" {d.predicted_waste:.2%} without"
            )
        elif d.snapshots_pay is False:
            lost += (
                f"; snapshots (each holding training {d.snapshot_s or 0.0:.3g} s) would cost more than they save:"
                f" off; predicted waste {d.predicted_waste:.2%}"
            )
        else:
            lost += f"; predicted waste {d.predicted_waste:.2%}"
        return (
            f"CheckpointCadence: checkpoint interval {what}{why}. {d.formula.capitalize()}'s formula gives"
            f" {d.interval_s:.1f} s between saves from {save} and {mtbf}, at {d.step_s:.3g} s per step.{lost}."
        )

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero or self.decision is None:
            return
        ledger = goodput_ledger(read_run_events(field_run_dir(trainer)), now=time.time())
        b = ledger.buckets
        spent = b["checkpoint_save"] + b["snapshot_overhead"] + b["lost_progress"] + b["restart_overhead"]
        realised = (spent + b["checkpoint_load"]) / max(ledger.elapsed_s, 1e-9)
        held = f", held at every_n_train_steps={self._user_steps}" if self.decision.held_at_user_setting else ""
        predicted = self.decision.predicted_waste_with_snapshots
        # With snapshots on, the realised waste holds their overhead: compare it with the prediction that does.
        predicted_text = (
            f"predicted waste {predicted:.2%} with the snapshots ({self.decision.predicted_waste:.2%} without)"
            if predicted is not None
            else f"predicted waste {self.decision.predicted_waste:.2%}"
        )
        share = b["snapshot_overhead"] / max(ledger.elapsed_s, 1e-9)
        snapshots = f" (snapshot overhead {share:.2%} of the elapsed time)" if predicted is not None else ""
        log.info(
            "Checkpoint cadence: every %d steps%s (%s asks for %.1f s; save %.2f s, MTBF %.2f h); %s, realised"
            " %.2f%%%s",
            self.decision.steps,
            held,
            self.formula,
            self.decision.interval_s,
            self.decision.save_s,
            self.decision.mtbf_s / 3600,
            predicted_text,
            100 * realised,
            snapshots,
        )
        for logger in trainer.loggers:
            logger.log_metrics({"cadence/realised_waste": realised}, step=trainer.global_step)
