"""CheckpointCadence: the interval follows Daly's formula from the measured save cost and the MTBF."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import Callback

from lightning_field import CheckpointCadence, ManifestCheckpoint, TimeToQuality, read_events
from lightning_field.checkpoint.stores import LocalStore
from lightning_field.planning.intervals import (
    FailureModel,
    choose_intervals,
    daly_interval,
    lost_work_per_failure,
    young_interval,
)
from lightning_field.quality.cadence import choose_steps, updated_mtbf
from lightning_field.quality.ledger import goodput_ledger
from lightning_field.workloads.demo import DemoDataModule, DemoRegressor

SAVE_DELAY_S = 2.0
STEP_S = 0.05


class SlowStore(LocalStore):
    """The real local commit, with every rank's write taking ``SAVE_DELAY_S`` longer, like a slow filesystem."""

    def write(self, final, token, rank, files):  # type: ignore[no-untyped-def]
        time.sleep(SAVE_DELAY_S)
        return super().write(final, token, rank, files)


def slow_save_checkpoint(**options: object) -> ManifestCheckpoint:
    """A ManifestCheckpoint whose every save blocks training for an extra ``SAVE_DELAY_S``."""
    return ManifestCheckpoint(store=SlowStore(), **options)


class SteadySteps(Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        time.sleep(STEP_S)


def cadence_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the cadence printed: rank-zero INFO lines, which Lightning's own handler shows by default."""
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("CheckpointCadence:")]


@pytest.mark.slow
def test_with_may_lengthen_a_2s_save_and_a_5min_mtbf_grow_the_users_interval_to_dalys_and_say_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoint = slow_save_checkpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=4, save_top_k=-1)
    cadence = CheckpointCadence(mtbf_hours=5 / 60, may_lengthen=True)
    trainer = pl.Trainer(
        default_root_dir=tmp_path, max_steps=8, accelerator="cpu", logger=False, enable_progress_bar=False,
        limit_val_batches=0, callbacks=[SteadySteps(), cadence, checkpoint],
    )  # fmt: skip
    with caplog.at_level(logging.INFO):
        trainer.fit(DemoRegressor(), datamodule=DemoDataModule())
    decision = cadence.decision
    assert decision is not None and decision.applied
    assert decision.save_s == pytest.approx(SAVE_DELAY_S, rel=0.05)
    # The default "auto" snapshots pay against failures every 5 minutes: they take the 22 % of failures a
    # process survives, so the persistent interval is Daly's for the other 78 % (one model, both tiers).
    assert decision.snapshots_pay and decision.coverage == 0.22
    assert decision.interval_s == pytest.approx(daly_interval(SAVE_DELAY_S, 300.0 / 0.78), rel=0.05)
    assert checkpoint.snapshots.every_n_train_steps == decision.snapshot_every_steps  # applied with it
    assert decision.steps == round(decision.interval_s / decision.step_s)
    assert checkpoint.every_n_train_steps == decision.steps  # it drives the checkpoint callback
    assert 0 < decision.predicted_waste < 1
    assert [e["payload"]["steps"] for e in read_events(tmp_path) if e["event"] == "cadence"] == [decision.steps]
    # Printed, with the old and new interval, why it may exceed the user's, and the figures behind it.
    (line,) = cadence_lines(caplog)
    assert f"lengthened from 4 to {decision.steps} steps" in line and "because may_lengthen=True" in line
    assert "Daly's formula" in line and "measured save cost of 2" in line and "MTBF of 0.0833 h" in line


def tour_run(
    tmp_path: Path, cadence: CheckpointCadence, *extra: Callback, **options: object
) -> tuple[ManifestCheckpoint, list[int]]:
    """The README tour's pair, ManifestCheckpoint(every_n_train_steps=10) and a cadence, for 40 steps;
    returns the checkpoint callback and the steps at which checkpoints committed."""
    checkpoint = ManifestCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=10, **options)
    trainer = pl.Trainer(
        default_root_dir=tmp_path, max_steps=40, accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, callbacks=[SteadySteps(), cadence, checkpoint, *extra],
    )  # fmt: skip
    trainer.fit(DemoRegressor(), datamodule=DemoDataModule())
    return checkpoint, [e["step"] for e in read_events(tmp_path) if e["event"] == "ckpt_committed"]


@pytest.mark.slow
def test_a_users_every_10_steps_is_never_lengthened_by_default_and_the_hold_is_printed_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cadence = CheckpointCadence(mtbf_hours=6)
    with caplog.at_level(logging.INFO):
        checkpoint, commits = tour_run(tmp_path, cadence)
    # Daly's interval for a cheap save and a 6 h MTBF is thousands of steps; the user's 10 stands.
    assert cadence.decisions and all(d.steps <= 10 and d.held_at_user_setting for d in cadence.decisions)
    assert all(d.formula_steps > 100 for d in cadence.decisions)
    assert checkpoint.every_n_train_steps == 10 and commits == [10, 20, 30, 40]  # a kill redoes at most 10 steps
    (line,) = cadence_lines(caplog)  # once, not after every save
    formula_steps = cadence.decisions[0].formula_steps
    assert "kept at 10 steps" in line and f"the formula asks for {formula_steps} steps" in line
    assert "every_n_train_steps=10 was set on ManifestCheckpoint" in line and "may_lengthen=True" in line
    assert "measured save cost of" in line and "MTBF of 6 h" in line
    events = [e["payload"] for e in read_events(tmp_path) if e["event"] == "cadence"]
    assert [(e["previous_steps"], e["steps"], e["applied"]) for e in events] == [(10, 10, False)] * 3
    assert events[0]["reason"] == line


@pytest.mark.slow
def test_with_snapshots_each_decision_shows_the_work_a_failure_loses_with_and_without_them_from_their_cost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        tour_run(tmp_path / "plain", plain := CheckpointCadence(mtbf_hours=6), snapshot_every_n_train_steps=None)
        snapshots = {"snapshot_every_n_train_steps": 2, "snapshot_dir": tmp_path / "shm"}
        # TimeToQuality writes the training clock the goodput ledger (the realised waste at the end) reads.
        clock = TimeToQuality(monitor="val_loss", target=0.0)
        tour_run(tmp_path / "snapshots", cadence := CheckpointCadence(mtbf_hours=6), clock, **snapshots)
    without, with_ = plain.decisions[0], cadence.decisions[0]
    assert without.lost_per_failure_with_snapshots_s is None and without.snapshot_s is None
    assert without.lost_per_failure_s == pytest.approx(lost_work_per_failure(10 * without.step_s, without.mtbf_s))
    # A snapshot every 2 steps, committed in line on CPU, on one node: the 22 % of failures a snapshot
    # survives lose half of 2 steps, the others half of the persistent interval.
    assert with_.snapshot_every_steps == 2 and with_.snapshot_commit_s == 0.0 and 0 < with_.snapshot_s < with_.step_s
    assert with_.coverage == 0.22 and with_.restart_s == 30.0  # nothing measured: the model's default restart
    lost = 0.22 * lost_work_per_failure(2 * with_.step_s, with_.mtbf_s)
    lost += 0.78 * lost_work_per_failure(10 * with_.step_s, with_.mtbf_s)
    assert with_.lost_per_failure_with_snapshots_s == pytest.approx(lost)
    assert with_.lost_per_failure_with_snapshots_s < with_.lost_per_failure_s
    event = next(e["payload"] for e in read_events(tmp_path / "snapshots") if e["event"] == "cadence")
    assert event["lost_per_failure_with_snapshots_s"] == with_.lost_per_failure_with_snapshots_s
    model = choose_intervals(
        FailureModel(mtbf_hours=6), with_.save_s, with_.snapshot_s, persistent_s=10 * with_.step_s,
        snapshot_every_s=2 * with_.step_s,
    )  # a user's interval is priced as it is, whether or not it pays
    assert with_.predicted_waste_with_snapshots == pytest.approx(model.waste)
    assert with_.predicted_waste == pytest.approx(model.waste_alone)
    line = next(line for line in cadence_lines(caplog) if "with a snapshot every 2 steps" in line)
    assert "Expected work lost per failure:" in line and "from the persistent checkpoints alone" in line
    assert f"predicted waste {with_.predicted_waste_with_snapshots:.2%} with the snapshots" in line
    # At the end of fit the realised waste, which holds the snapshots' overhead, meets the prediction that does.
    assert goodput_ledger(read_events(tmp_path / "snapshots")).buckets["snapshot_overhead"] > 0
    plain_end, snapshots_end = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Checkpoint cad")]
    assert "with the snapshots" not in plain_end and "snapshot overhead" not in plain_end
    assert "with the snapshots" in snapshots_end and "(snapshot overhead " in snapshots_end


@pytest.mark.slow
def test_the_same_run_with_may_lengthen_grows_past_10_steps_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # What every run did before may_lengthen existed: one save at step 10, then none until step 40's end.
    cadence = CheckpointCadence(mtbf_hours=6, may_lengthen=True)
    with caplog.at_level(logging.INFO):
        checkpoint, commits = tour_run(tmp_path, cadence)
    decision = cadence.decisions[0]
    assert decision.applied and decision.steps > 100 and checkpoint.every_n_train_steps == decision.steps
    assert commits == [10]
    (line,) = cadence_lines(caplog)
    assert f"lengthened from 10 to {decision.steps} steps" in line and "because may_lengthen=True" in line


@pytest.mark.slow
def test_a_users_interval_is_shortened_when_saves_are_cheap_against_failures_and_the_change_is_printed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cadence = CheckpointCadence(mtbf_hours=0.00002)  # 72 ms: Daly's interval is at most that, 1 or 2 steps
    with caplog.at_level(logging.INFO):
        checkpoint, commits = tour_run(tmp_path, cadence)
    first = cadence.decisions[0]
    assert first.applied and first.previous_steps == 10 and first.steps < 10 and not first.held_at_user_setting
    assert checkpoint.every_n_train_steps <= first.steps < 10 and commits[0] == 10
    assert commits[1] - commits[0] <= first.steps  # the next save came sooner than the user's 10 steps
    lines = cadence_lines(caplog)
    assert lines and len(lines) == sum(d.applied for d in cadence.decisions)
    assert f"shortened from 10 to {first.steps} step" in lines[0] and "MTBF of 2e-05 h" in lines[0]
    assert "Daly's formula gives" in lines[0] and "measured save cost of" in lines[0]


@pytest.mark.slow
def test_without_a_users_step_interval_the_cadence_sets_one_freely(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoint = ManifestCheckpoint(dirpath=tmp_path / "ckpts", every_n_epochs=1)  # no step interval
    cadence = CheckpointCadence(mtbf_hours=6)
    trainer = pl.Trainer(
        default_root_dir=tmp_path, max_steps=34, accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, callbacks=[SteadySteps(), cadence, checkpoint],
    )  # fmt: skip
    with caplog.at_level(logging.INFO):
        trainer.fit(DemoRegressor(), datamodule=DemoDataModule())  # 32 batches: the epoch's save is at step 32
    (decision,) = cadence.decisions
    assert decision.applied and decision.previous_steps == 0 and decision.steps > 100
    assert not decision.held_at_user_setting and checkpoint.every_n_train_steps == decision.steps
    (line,) = cadence_lines(caplog)
    assert f"set to {decision.steps} steps (there was no step interval)" in line
    assert "no every_n_train_steps was set on ManifestCheckpoint" in line


def test_the_interval_moves_with_the_mtbf_as_theory_says() -> None:
    short, long = daly_interval(2.0, 300.0), daly_interval(2.0, 1200.0)
    assert long / short == pytest.approx(2.0, rel=0.03)  # ~sqrt(M) for small δ/M
    assert young_interval(2.0, 1200.0) / young_interval(2.0, 300.0) == pytest.approx(2.0)
    assert daly_interval(700.0, 300.0) == 300.0  # δ >= 2M: checkpoint every M
    # observed interruptions pull the MTBF estimate down; long clean exposure pushes it up
    assert updated_mtbf(3600.0, 3600.0, 3) == pytest.approx(1800.0)
    assert updated_mtbf(3600.0, 36000.0, 0) == pytest.approx(39600.0)


def test_the_step_interval_is_clamped_and_does_not_flap() -> None:
    assert choose_steps(33.3, 0.05, current=4, min_steps=1, max_steps=None, hysteresis=0.2) == (666, True)
    assert choose_steps(33.3, 0.05, current=600, min_steps=1, max_steps=None, hysteresis=0.2) == (600, False)
    assert choose_steps(33.3, 0.05, current=4, min_steps=1, max_steps=100, hysteresis=0.2) == (100, True)
    assert choose_steps(0.01, 0.05, current=50, min_steps=5, max_steps=None, hysteresis=0.2) == (5, True)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"mtbf_hours": 0}, "mtbf_hours must be > 0"), ({"mtbf_hours": 1, "formula": "lucky"}, "formula must be one of")],
)
def test_bad_cadence_settings_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CheckpointCadence(**kwargs)


@pytest.mark.slow
def test_every_ddp_rank_applies_the_same_interval_at_the_same_step(tmp_path: Path) -> None:
    from conftest import TESTS_DIR, run_child

    job = TESTS_DIR / "jobs" / "quality_job.py"
    result = run_child([job, "--root", tmp_path, "--devices", "2", "--max-steps", "30", "--every", "5",
                        "--step-seconds", "0.01", "--cadence-mtbf-hours", "0.002"], timeout=180)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]
    per_rank = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("cadence-rank*.json"))]
    assert len(per_rank) == 2, result.stdout[-3000:]
    assert per_rank[0] == per_rank[1] and per_rank[0]["decisions"] != []
