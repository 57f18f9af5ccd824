"""The goodput ledger and the time-to-quality summary as pure functions of synthetic event logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_field.quality.ledger import BUCKETS, goodput_ledger
from lightning_field.quality.time_to_quality import quality_summary


class Log:
    """Builds an event log the way the callbacks write it, with chosen wall times."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.attempt = 0

    def add(self, event: str, t: float, at_step: int | None = None, **payload: object) -> Log:
        self.events.append(
            {"attempt": self.attempt, "event": event, "wall_time": t, "step": at_step, "payload": payload}
        )
        return self

    def start(self, process_start: float, t: float) -> Log:
        self.attempt += 1
        return self.add("attempt_start", t, process_start_unix=process_start, world_size=2)

    def progress(self, t: float, step: int, first: float, data_wait: float, batches: int, **extra: object) -> Log:
        return self.add("progress", t, step, step=step, first_step_unix=first, last_beat_unix=t,
                        data_wait_s=data_wait, eval_s=0.0, batches=batches, devices=2, **extra)  # fmt: skip

    def crashed(self, t: float, attempt: int, step: int, first: float, last_beat: float, data_wait: float) -> Log:
        return self.add("attempt_crashed", t, step, attempt=attempt, step=step, first_step_unix=first,
                        last_beat_unix=last_beat, data_wait_s=data_wait, eval_s=0.0, batches=step)  # fmt: skip


def assert_partition(ledger) -> None:
    assert set(ledger.buckets) == set(BUCKETS)
    assert sum(ledger.buckets.values()) == pytest.approx(ledger.elapsed_s, abs=1e-9)
    assert all(v >= -1e-9 for v in ledger.buckets.values()), ledger.buckets
    assert ledger.idle_breakdown["unattributed"] == pytest.approx(0.0, abs=1e-9)
    assert all(v >= -1e-9 for v in ledger.idle_breakdown.values()), ledger.idle_breakdown


def test_a_clean_run_splits_into_startup_training_saves_evals_data_wait_and_tail() -> None:
    log = Log().start(process_start=-5.0, t=0.0).add("run_start", 0.5)
    log.add("ckpt_committed", 5.0, 10, blocking_s=0.5).add("eval", 8.0, 15, seconds=1.0, metrics={"val": 2.0})
    log.add("ckpt_committed", 10.0, 20, blocking_s=0.5).progress(11.0, 22, first=1.0, data_wait=0.7, batches=22)
    log.add("attempt_end", 11.5, 22, status="finished")
    ledger = goodput_ledger(log.events)
    assert ledger.elapsed_s == 11.0 and ledger.interruptions == 0 and ledger.lost_steps == 0
    assert ledger.buckets["checkpoint_save"] == 1.0 and ledger.buckets["evaluation"] == 1.0
    assert ledger.buckets["data_wait"] == pytest.approx(0.7)
    assert ledger.buckets["productive"] == pytest.approx(10.0 - 1.0 - 1.0 - 0.7)
    assert (
        ledger.idle_breakdown["startup"] == pytest.approx(0.5) and ledger.idle_breakdown["tail_after_last_step"] == 0.5
    )
    assert_partition(ledger)


def test_two_interruptions_one_inside_a_save_are_measured_from_the_commits_resumed_from() -> None:
    log = Log().start(process_start=0.0, t=1.0).add("run_start", 1.0)
    log.add("ckpt_committed", 10.0, 10, blocking_s=1.0)
    log.progress(10.5, 10, first=2.0, data_wait=0.4, batches=10, commit_step=10)  # counters at the commit
    # killed at step 14 (t=15), heartbeat read by attempt 2
    log.start(process_start=20.0, t=23.0).crashed(23.1, attempt=1, step=14, first=2.0, last_beat=15.0, data_wait=0.6)
    log.add("ckpt_load", 23.5, 10, seconds=0.5).add("ckpt_save_start", 30.0, 20)
    # killed inside the save of step 20 (t=31): that save never committed
    log.start(process_start=40.0, t=42.0).crashed(42.1, attempt=2, step=20, first=25.0, last_beat=31.0, data_wait=0.2)
    log.add("ckpt_load", 42.5, 10, seconds=0.5).add("ckpt_committed", 60.0, 20, blocking_s=1.0)
    log.progress(61.0, 22, first=45.0, data_wait=0.3, batches=12).add("attempt_end", 62.0, 22, status="finished")
    ledger = goodput_ledger(log.events)
    assert ledger.interruptions == 2
    # training exposure (61 s elapsed minus 14 s of downtime) per interruption; restarts include the load
    assert ledger.mean_time_between_interruptions_s == pytest.approx((61.0 - 14.0) / 2)
    assert ledger.mean_restart_s == pytest.approx(5.0)
    assert ledger.device_hours() == pytest.approx((61.0 - 14.0) * 2 / 3600)
    first, second, third = ledger.attempts
    assert (first.status, second.status, third.status) == ("crashed", "crashed", "finished")
    assert first.lost_steps == 4 and second.lost_steps == 10 and ledger.lost_steps == 14
    # attempt 1 loses everything after its step-10 commit; attempt 2 committed nothing, so loses all its training
    assert first.seconds["lost_progress"] == pytest.approx(15.0 - 10.0)
    assert second.seconds["lost_progress"] == pytest.approx(31.0 - 25.0)
    assert ledger.buckets["lost_progress"] == pytest.approx(11.0)
    # restart overhead: process start to first step, minus the checkpoint load
    assert ledger.buckets["restart_overhead"] == pytest.approx((25.0 - 20.0 - 0.5) + (45.0 - 40.0 - 0.5))
    assert ledger.buckets["checkpoint_load"] == pytest.approx(1.0)
    assert ledger.idle_breakdown["downtime_between_attempts"] == pytest.approx((20.0 - 15.0) + (40.0 - 31.0))
    assert ledger.buckets["data_wait"] == pytest.approx(0.4 + 0.3)
    assert_partition(ledger)


def test_a_run_that_never_reaches_its_target_reports_the_latest_value_and_costs_so_far() -> None:
    log = Log().start(process_start=0.0, t=0.0).add("run_start", 0.0)
    for i, value in enumerate([3.0, 2.5, 2.2, 2.1], start=1):
        log.add("eval", 100.0 * i, 10 * i, seconds=1.0, metrics={"val_loss": value})
    log.progress(400.0, 40, first=1.0, data_wait=0.0, batches=40)
    summary = quality_summary(log.events, "val_loss", 1.0, "min", 3.0, deadline_s=1000.0, now=400.0)
    assert summary["reached"] is None and summary["latest"] == {"step": 40, "value": 2.1}
    assert summary["so_far"]["wall_s"] == 400.0
    assert summary["so_far"]["device_hours"] == pytest.approx(400.0 * 2 / 3600)  # 2 devices held for 400 s
    assert summary["so_far"]["cost"] == pytest.approx(summary["so_far"]["device_hours"] * 3.0)
    reached = quality_summary(log.events, "val_loss", 2.2, "min", 3.0, deadline_s=250.0, now=400.0)
    assert reached["reached"]["step"] == 30 and reached["reached"]["wall_s"] == 300.0
    assert reached["deadline_met"] is False


def test_an_empty_log_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        goodput_ledger([])


def test_the_forecast_extrapolates_an_improving_curve_and_declines_when_it_cannot() -> None:
    from lightning_field.quality.forecast import forecast

    curve = [(s, 0.2 + 4.0 * s**-0.5) for s in (10, 20, 40, 80, 160)]
    fc = forecast(curve, target=0.4, mode="min", current_step=160, elapsed_s=160.0, deadline_s=10_000.0)
    assert fc.available and fc.steps_to_target == pytest.approx(400.0, rel=0.05)  # (4 / 0.2)^2
    assert fc.seconds_to_target == pytest.approx(400.0, rel=0.05)  # 1 s per step so far
    assert fc.deadline_miss_probability == 0.0
    assert forecast(curve, 0.4, "min", 160, 160.0, deadline_s=300.0).deadline_miss_probability == 1.0
    assert not forecast(curve[:3], 0.4, "min", 40, 40.0).available  # too few evaluations
    plateau = forecast(curve, target=0.1, mode="min", current_step=160, elapsed_s=160.0)
    assert not plateau.available and "levels off" in plateau.reason
    worsening = forecast([(s, float(s)) for s in (10, 20, 40, 80)], 0.5, "min", 80, 80.0)
    assert not worsening.available and "not improving" in worsening.reason
    accuracy = [(s, 0.9 - 2.0 * s**-0.7) for s in (10, 20, 40, 80)]
    assert forecast(accuracy, 0.85, "max", 80, 80.0).steps_to_target == pytest.approx(40 ** (1 / 0.7), rel=0.05)


def test_a_finished_attempt_extended_from_an_earlier_checkpoint_counts_its_later_steps_once() -> None:
    log = Log().start(process_start=0.0, t=0.0).add("run_start", 0.0)
    log.add("ckpt_committed", 50.0, 50, blocking_s=0.0).progress(50.5, 50, first=1.0, data_wait=0.0, batches=50,
                                                                   commit_step=50)  # fmt: skip
    log.add("ckpt_committed", 100.0, 100, blocking_s=0.0).progress(100.0, 100, first=1.0, data_wait=0.0, batches=100)
    log.add("attempt_end", 101.0, 100, status="finished")
    log.start(process_start=110.0, t=111.0).add("ckpt_load", 112.0, 50, seconds=1.0)
    log.progress(200.0, 150, first=115.0, data_wait=0.0, batches=100).add("attempt_end", 201.0, 150, status="finished")
    ledger = goodput_ledger(log.events)
    first = ledger.attempts[0]
    assert ledger.interruptions == 0 and first.lost_steps == 50
    assert first.seconds["lost_progress"] == pytest.approx(101.0 - 50.0)  # steps 51-100 were trained again
    assert_partition(ledger)


def test_an_attempt_dying_before_it_loads_does_not_erase_what_the_next_one_resumed_from() -> None:
    log = Log().start(process_start=0.0, t=0.0).add("run_start", 0.0)
    log.add("ckpt_committed", 50.0, 50, blocking_s=0.0).progress(50.5, 50, first=1.0, data_wait=0.0, batches=50,
                                                                   commit_step=50)  # fmt: skip
    log.start(process_start=70.0, t=72.0).crashed(72.1, attempt=1, step=60, first=1.0, last_beat=60.0, data_wait=0)
    log.start(process_start=80.0, t=82.0).add("ckpt_load", 83.0, 50, seconds=1.0)  # attempt 2 died in start-up
    log.progress(100.0, 60, first=85.0, data_wait=0.0, batches=10).add("attempt_end", 101.0, 60, status="finished")
    ledger = goodput_ledger(log.events)
    first, second, _ = ledger.attempts
    assert first.lost_steps == 10 and first.seconds["lost_progress"] == pytest.approx(60.0 - 50.0)
    assert second.status == "crashed" and second.first_step_unix is None
    assert ledger.interruptions == 2
    assert_partition(ledger)


def test_attempts_before_the_clock_started_are_outside_the_account() -> None:
    log = Log().start(process_start=0.0, t=0.0).progress(90.0, 90, first=1.0, data_wait=0.0, batches=90)
    log.add("attempt_end", 100.0, 90, status="finished")
    log.start(process_start=200.0, t=201.0).add("run_start", 202.0)  # TimeToQuality added in attempt 2
    log.progress(300.0, 190, first=205.0, data_wait=0.0, batches=100).add("attempt_end", 301.0, 190, status="finished")
    ledger = goodput_ledger(log.events)
    assert [a.attempt for a in ledger.attempts] == [2] and ledger.elapsed_s == pytest.approx(99.0)
    assert_partition(ledger)


def test_a_resume_from_a_step_snapshot_keeps_the_work_before_it_and_counts_its_cost_and_redone_steps_apart() -> None:
    log = Log().start(process_start=0.0, t=1.0).add("run_start", 1.0)
    log.add("ckpt_committed", 10.0, 10, blocking_s=1.0)
    for step in range(11, 15):  # a snapshot every step after the persistent save, 0.1 s of the step each
        log.add("snapshot_committed", 10.0 + (step - 10), step, blocking_s=0.1, commit_s=0.05)
    log.progress(14.5, 14, first=2.0, data_wait=0.0, batches=14, commit_step=14)
    # killed in step 15 (t=14.9); the next attempt resumes from the snapshot of step 14
    log.start(process_start=20.0, t=21.0).crashed(21.1, attempt=1, step=15, first=2.0, last_beat=14.9, data_wait=0.0)
    log.add("ckpt_load", 21.5, 14, seconds=0.5, tier="snapshot")
    log.progress(30.0, 20, first=22.0, data_wait=0.0, batches=6).add("attempt_end", 30.5, 20, status="finished")
    ledger = goodput_ledger(log.events)
    first = ledger.attempts[0]
    # Without snapshot commits as resume points, all 12.9 s of the first attempt's training read as lost.
    assert first.seconds["lost_progress"] == pytest.approx(14.9 - 14.0)
    assert ledger.buckets["snapshot_overhead"] == pytest.approx(0.4) and ledger.buckets["checkpoint_save"] == 1.0
    assert first.lost_steps == 1 and first.cut_back_to == "snapshot"
    assert ledger.redone_steps == {"persistent": 0, "snapshot": 1, "replica": 0, "none": 0}
    assert ledger.attempts[1].resumed_from_tier == "snapshot"
    assert_partition(ledger)


def test_steps_redone_after_a_resume_from_a_replica_or_a_persistent_checkpoint_are_counted_by_that_tier() -> None:
    def run(tier: str | None) -> object:
        log = Log().start(process_start=0.0, t=1.0).add("run_start", 1.0)
        log.add("ckpt_committed", 5.0, 4, blocking_s=0.5).add("snapshot_committed", 8.0, 7, blocking_s=0.1)
        log.start(process_start=12.0, t=13.0).crashed(13.1, attempt=1, step=9, first=2.0, last_beat=10.0, data_wait=0.0)
        load_step = 7 if tier in ("snapshot", "replica") else 4
        log.add("ckpt_load", 13.5, load_step, seconds=0.5, **({"tier": tier} if tier else {}))
        log.progress(20.0, 12, first=14.0, data_wait=0.0, batches=5).add("attempt_end", 20.5, 12, status="finished")
        return goodput_ledger(log.events)

    assert run("replica").redone_steps["replica"] == 2
    assert run(None).redone_steps["persistent"] == 5  # a log written before tiers: a persistent resume
    assert_partition(run("replica"))


def snapshot_resume_log(data_wait_at_step_12: float = 0.0) -> Log:
    """Persistent save at step 10, a snapshot every step after it (0.1 s each), killed in step 16, the
    next attempt resumed from the snapshot of step 14 (its commit at t=14, the kill at t=16.9)."""
    log = Log().start(process_start=0.0, t=1.0).add("run_start", 1.0, monitor="val_loss", target=1.0)
    log.add("ckpt_committed", 10.0, 10, blocking_s=1.0)
    for step in range(11, 16):
        log.add("snapshot_committed", float(step), step, blocking_s=0.1, commit_s=0.05)
        if step == 12:  # TimeToQuality's periodic report; a snapshot's commit writes none
            log.progress(12.5, 12, first=2.0, data_wait=data_wait_at_step_12, batches=12)
    log.progress(15.5, 15, first=2.0, data_wait=data_wait_at_step_12 + 0.5, batches=15)
    log.start(process_start=20.0, t=21.0).crashed(21.1, attempt=1, step=16, first=2.0, last_beat=16.9, data_wait=1.0)
    log.add("ckpt_load", 21.5, 14, seconds=0.5, tier="snapshot")
    log.progress(30.0, 20, first=22.0, data_wait=0.0, batches=6).add("attempt_end", 30.5, 20, status="finished")
    return log


def test_data_wait_before_a_snapshot_resumed_from_is_the_newest_report_before_that_snapshot() -> None:
    ledger = goodput_ledger(snapshot_resume_log(data_wait_at_step_12=0.3).events)
    first = ledger.attempts[0]
    # The report at step 15 (after the snapshot) and the heartbeat count waits whose steps were redone.
    assert first.seconds["data_wait"] == pytest.approx(0.3) and first.seconds["lost_progress"] == pytest.approx(2.9)
    assert first.seconds["snapshot_overhead"] == pytest.approx(4 * 0.1)  # steps 11-14; the one of step 15 was lost
    assert_partition(ledger)


def test_the_run_summary_and_the_printed_summary_show_snapshot_overhead_and_steps_redone_by_tier(
    tmp_path: Path,
) -> None:
    from lightning_field.core.layout import EVENTS_RELPATH
    from lightning_field.quality.run_summary import field_summary
    from lightning_field.quality.target import render_summary

    log = snapshot_resume_log()
    (tmp_path / EVENTS_RELPATH).parent.mkdir(parents=True)
    (tmp_path / EVENTS_RELPATH).write_text("".join(json.dumps(e) + "\n" for e in log.events))
    summary = field_summary(tmp_path, now=31.0)
    assert summary["field/goodput/snapshot_overhead_s"] == pytest.approx(0.4)
    assert summary["field/redone_steps/snapshot"] == 2 and summary["field/redone_steps/persistent"] == 0
    ledger = goodput_ledger(log.events)
    printed = render_summary({
        **quality_summary(log.events, "val_loss", 1.0, "min", None, None, now=31.0),
        "goodput": {**ledger.to_dict(), "buckets_s": ledger.buckets},
    })  # fmt: skip
    assert "2 step(s) lost (redone after a resume from: snapshot 2)" in printed and "snapshot_overhead 0.4 s" in printed


def test_a_crash_loop_counts_the_steps_each_attempt_redid_and_claims_no_attempt_after_the_last() -> None:
    """Four attempts: the first commits step 20 and dies in step 23 (its last report at step 20), each
    next one resumes from 20 and dies in 23 again; the guard refuses the fourth at step 20."""
    log = Log().start(process_start=0.0, t=1.0).add("run_start", 1.0).add("fit_start", 1.5, 0)
    log.add("ckpt_committed", 20.0, 20, blocking_s=0.5).progress(20.5, 20, first=2.0, data_wait=0.0, batches=20)
    log.add("attempt_failed", 23.0, 22, step=22, exception="RuntimeError")
    log.add("attempt_end", 23.1, 22, status="failed: RuntimeError")
    t = 30.0
    for _ in range(2):
        log.start(process_start=t, t=t + 1).add("ckpt_load", t + 1.5, 20, seconds=0.5, tier="persistent")
        log.add("fit_start", t + 2, 20).progress(t + 2.1, 20, first=t + 2.1, data_wait=0.0, batches=0)
        log.add("attempt_failed", t + 3, 22, step=22, exception="RuntimeError")
        log.add("attempt_end", t + 3.1, 22, status="failed: RuntimeError")
        t += 10.0
    log.start(process_start=t, t=t + 1).add("ckpt_load", t + 1.5, 20, seconds=0.5, tier="persistent")
    log.add("fit_start", t + 2, 20).add("no_progress_refused", t + 2, 20)
    log.add("attempt_end", t + 2.1, 20, status="refused: no progress")
    ledger = goodput_ledger(log.events)
    assert [a.status for a in ledger.attempts] == ["failed", "failed", "failed", "refused"]
    assert [a.last_step for a in ledger.attempts] == [22, 22, 22, 20]  # reached, not the last report's step
    assert [a.lost_steps for a in ledger.attempts] == [2, 2, 2, 0]  # steps 21-22, redone by the next attempt
    assert [a.cut_back_to for a in ledger.attempts] == ["persistent", "persistent", "persistent", None]
    assert ledger.lost_steps == 6 and ledger.redone_steps["persistent"] == 6 and ledger.redone_steps["none"] == 0
    assert ledger.interruptions == 3  # a refusal trains nothing: not an interruption
    assert_partition(ledger)


def test_the_last_attempt_dying_claims_no_later_attempt_and_redoes_nothing_yet() -> None:
    log = Log().start(process_start=0.0, t=1.0).add("run_start", 1.0).add("fit_start", 1.5, 0)
    log.progress(9.0, 9, first=2.0, data_wait=0.0, batches=9).add("ckpt_committed", 10.0, 10, blocking_s=0.5)
    log.add("ckpt_save_start", 15.0, 15)  # killed in this save, the last attempt so far
    ledger = goodput_ledger(log.events)
    (only,) = ledger.attempts
    assert only.status == "crashed" and only.last_step == 15 and only.cut_back_to is None and only.lost_steps == 0
    assert ledger.redone_steps["none"] == 0
    assert only.seconds["lost_progress"] == pytest.approx(15.0 - 10.0)  # after its newest commit: at risk
    assert_partition(ledger)
