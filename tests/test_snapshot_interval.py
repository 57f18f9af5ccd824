"""``SnapshotConfig(every_n_train_steps="auto")`` (the default): snapshots every step while their cost is
measured, then, from the cost model both tiers share, the interval that minimises the predicted waste,
and only where snapshots pay beside the persistent checkpoints; agreed by every rank from the slowest
one's cost, said in the log, the event log and the manifests; a user's integer is kept; a failing
snapshot turns ``"auto"`` off with one warning instead of one per step."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from conftest import make_trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_field import FailureModel, latest_recoverable, read_manifest
from lightning_field.checkpoint.snapshot_interval import (
    COUNTED,
    PROBES,
    RECHECK_EVERY,
    SnapshotInterval,
    check_every_n_train_steps,
)
from lightning_field.checkpoint.snapshots import snapshot_dir_for
from lightning_field.core.events import read_events
from lightning_field.planning.intervals import choose_intervals, lost_work_per_failure, snapshot_interval_s


def measured(interval: SnapshotInterval, cost: float, step: float, snapshots: int) -> None:
    for _ in range(snapshots):
        interval.step_ended(step)
        interval.snapshot_taken(cost)


def alone(figures: tuple[float, float, float]) -> list[tuple[float, float, float]]:
    return [figures]


def every_persistent(seconds: float | None) -> Callable[[float], float | None]:
    """A persistent interval that does not depend on the step time."""
    return lambda step_s: seconds


@pytest.mark.parametrize(
    ("cost_ms", "step_ms", "persistent_s", "pays"),
    [
        (1.0, 100.0, 3600.0, True),  # cheap snapshots, an hour between persistent saves
        (16.0, 154.0, 1570.0, True),  # the seed's persistent interval (a 60 s save, a 6 h MTBF)
        (16.0, 154.0, 30.0, False),  # persistent saves every 30 s already: snapshots would only cost
        (5.0, 10.0, 0.5, False),  # a test-sized job saving every 50 steps
    ],
)
def test_auto_takes_the_interval_the_cost_model_gives_and_only_where_snapshots_pay(
    cost_ms: float, step_ms: float, persistent_s: float, pays: bool
) -> None:
    interval = SnapshotInterval("auto")
    measured(interval, cost_ms / 1e3, step_ms / 1e3, PROBES - 1)
    assert not interval.choice_due() and interval.every_n_train_steps == 1  # every step while measuring
    measured(interval, cost_ms / 1e3, step_ms / 1e3, 1)
    choice = interval.choose(alone, every_persistent(persistent_s))
    model = choose_intervals(FailureModel(), None, cost_ms / 1e3, persistent_s=persistent_s, snapshot_budget=0.01)
    tau = snapshot_interval_s(FailureModel(), cost_ms / 1e3, budget=0.01)
    assert choice is not None and choice.off is (not pays) and model.snapshots_pay is pays
    assert choice.every_n_train_steps == max(1, round(tau / (step_ms / 1e3))) == interval.every_n_train_steps
    assert choice.mtbf_hours == 6.0 and choice.coverage == 0.22 and choice.persistent_interval_s == persistent_s
    assert choice.waste_change == pytest.approx(model.waste_change)
    every = choice.every_n_train_steps
    assert interval.due(every) is pays and interval.due(2 * every) is pays
    if pays:
        assert choice.lost_per_failure_s is not None and choice.lost_alone_s is not None
        assert choice.lost_per_failure_s < choice.lost_alone_s == lost_work_per_failure(persistent_s, 6 * 3600)
        assert "a failure redoes" in choice.reason and choice.record()["every_n_train_steps"] == every
    else:
        assert "so they are off" in choice.reason and choice.record()["every_n_train_steps"] is None
        assert choice.overhead is None


def test_the_budget_caps_what_auto_snapshots_take_of_the_step_time() -> None:
    interval = SnapshotInterval("auto", budget=0.01, failures=FailureModel(mtbf_hours=0.01, snapshot_coverage=0.5))
    measured(interval, 0.5, 1.0, PROBES)  # a 0.5 s snapshot against failures every 36 s: the model wants 6 s
    choice = interval.choose(alone, every_persistent(None))
    assert snapshot_interval_s(FailureModel(mtbf_hours=0.01, snapshot_coverage=0.5), 0.5) < 50
    assert choice is not None and choice.every_n_train_steps == 50 and choice.overhead == pytest.approx(0.01)
    assert "no persistent checkpoint is due before the run's end" in choice.reason


def test_only_the_newest_probes_count_and_the_slowest_rank_decides_for_all() -> None:
    interval = SnapshotInterval("auto")
    measured(interval, 0.050, 0.1, PROBES - COUNTED)  # the first snapshots fault in fresh pages
    measured(interval, 0.001, 0.1, COUNTED)
    ranks = [(0.001, 0.1, 0.0), (0.003, 0.1, 0.5)]
    choice = interval.choose(lambda mine: [mine, ranks[1]], every_persistent(3600.0))
    assert choice is not None and choice.snapshot_seconds == 0.003
    assert choice.every_n_train_steps == round(snapshot_interval_s(FailureModel(), 0.003, budget=0.01) / 0.1)
    assert ranks[0] == interval.local_figures()
    # The slowest commit too: every rank prices the snapshots alike, so all take the same steps.
    agreed = choose_intervals(FailureModel(), None, 0.003, 0.5, persistent_s=3600.0, snapshot_budget=0.01)
    assert choice.waste_change == pytest.approx(agreed.waste_change)


def test_snapshots_replicated_to_a_partner_node_survive_more_failures_and_are_taken_more_often() -> None:
    one, several = SnapshotInterval("auto"), SnapshotInterval("auto")
    for interval in (one, several):
        measured(interval, 0.01, 0.1, PROBES)
    on_one = one.choose(alone, every_persistent(3600.0))
    on_several = several.choose(alone, every_persistent(3600.0), replicated=True)
    assert on_one is not None and on_several is not None
    assert (on_one.coverage, on_several.coverage) == (0.22, 0.95)
    assert on_several.every_n_train_steps < on_one.every_n_train_steps


def test_auto_rechecks_and_says_so_only_when_the_interval_changes() -> None:
    interval = SnapshotInterval("auto", failures=FailureModel(mtbf_hours=0.1, snapshot_coverage=0.5))
    measured(interval, 0.004, 0.1, PROBES)
    first = interval.choose(alone, every_persistent(3600.0))
    assert first is not None and not first.off
    measured(interval, 0.004, 0.1, RECHECK_EVERY - 1)
    assert not interval.choice_due()
    measured(interval, 0.004, 0.1, 1)
    assert interval.choice_due() and interval.choose(alone, every_persistent(3600.0)) is None  # nothing to say
    measured(interval, 0.016, 0.1, RECHECK_EVERY)  # the state grew: four times the cost, twice the interval
    choice = interval.choose(alone, every_persistent(3600.0))
    assert choice is not None and choice.every_n_train_steps == pytest.approx(2 * first.every_n_train_steps, abs=1)


def test_while_off_auto_looks_again_after_a_number_of_steps_every_rank_counts_alike() -> None:
    interval = SnapshotInterval("auto")
    measured(interval, 0.005, 0.01, PROBES)
    choice = interval.choose(alone, every_persistent(0.5))
    assert choice is not None and choice.off and interval.every_n_train_steps > 1
    for _ in range(RECHECK_EVERY * interval.every_n_train_steps - 1):
        interval.step_ended(0.01)
    assert not interval.choice_due()
    interval.step_ended(0.01)
    assert interval.choice_due()
    # The persistent saves became rare (CheckpointCadence lengthened them): the snapshots pay now.
    again = interval.choose(alone, every_persistent(7200.0))
    assert again is not None and not again.off and interval.due(again.every_n_train_steps)


def test_a_users_interval_is_kept_and_its_cost_said_once() -> None:
    interval = SnapshotInterval(1)
    measured(interval, 0.004, 0.1, PROBES)
    choice = interval.choose(alone)
    assert choice is not None and choice.every_n_train_steps == 1 and choice.chosen_by == "user"
    assert "set by the user" in choice.reason and "4.00% of the step time" in choice.reason
    measured(interval, 0.004, 0.1, 10 * RECHECK_EVERY)
    assert not interval.choice_due()


@pytest.mark.parametrize(("every", "budget"), [(0, 0.01), (-1, 0.01), ("often", 0.01), (1.5, 0.01), (True, 0.01),
                                               ("auto", 0.0), ("auto", 1.0), ("auto", "1%"), ("auto", math.nan)])
def test_a_bad_interval_or_budget_is_refused_naming_the_argument(every: object, budget: object) -> None:
    with pytest.raises(ValueError, match=r"snapshots.every_n_train_steps|snapshots.overhead_budget"):
        check_every_n_train_steps(every, budget)


def run_with_defaults(root: Path, caplog: pytest.LogCaptureFixture, **options: object) -> tuple[pl.Trainer, list[str]]:
    torch.manual_seed(0)
    trainer = make_trainer(root, 24, snapshot_dir=root / "shm", save_on_train_end=True, **options)
    with caplog.at_level(logging.INFO):
        trainer.fit(BoringModel())
    return trainer, [r.getMessage() for r in caplog.records if "lightning_field: snapshots" in r.getMessage()]


def test_by_default_a_small_job_with_frequent_saves_measures_its_snapshots_then_turns_them_off_saying_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A persistent save every 100 steps of a few milliseconds against failures every 6 hours: a snapshot
    # would save a fraction of a second per failure, and cost more than that.
    trainer, said = run_with_defaults(tmp_path, caplog, every_n_train_steps=100)
    assert said[0].startswith("lightning_field: snapshots (auto: every step while their cost is measured")
    chosen = [e for e in read_events(tmp_path) if e["event"] == "snapshot_interval"]
    assert len(chosen) == 1 and chosen[0]["step"] == PROBES
    payload = chosen[0]["payload"]
    assert payload["every_n_train_steps"] is None and payload["chosen_by"] == "auto" and payload["requested"] == "auto"
    assert payload["waste_change"] > 0 and payload["mtbf_hours"] == 6.0 and payload["coverage"] == 0.22
    assert "so they are off" in payload["reason"] and said[1].startswith("lightning_field: snapshots off (auto)")
    committed = sorted(e["step"] for e in read_events(tmp_path) if e["event"] == "snapshot_committed")
    assert committed == list(range(1, PROBES + 1))  # the probes, none after the choice
    assert trainer.checkpoint_callback.snapshots.every_n_train_steps is None
    final = read_manifest(latest_recoverable(tmp_path / "ckpts") or tmp_path / "missing")
    assert final.snapshot_interval is not None and final.snapshot_interval["every_n_train_steps"] is None
    assert final.snapshot_interval["reason"] == payload["reason"]


def test_where_failures_are_frequent_against_the_persistent_interval_auto_snapshots_run_at_the_models_interval(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    failures = FailureModel(mtbf_hours=0.001, snapshot_coverage=0.5)  # a failure every 3.6 s
    # A persistent save every million steps: half an hour apart even at 2 ms a step (a
    # thousand steps of 1.6 ms, 1.6 s apart, were within the MTBF, and snapshots rightly did not pay).
    trainer, said = run_with_defaults(tmp_path, caplog, every_n_train_steps=1_000_000, failures=failures)
    chosen = [e for e in read_events(tmp_path) if e["event"] == "snapshot_interval"]
    payload = chosen[0]["payload"]
    every = payload["every_n_train_steps"]
    assert every is not None and payload["waste_change"] < 0 and payload["lost_per_failure_s"] < payload["lost_alone_s"]
    tau = snapshot_interval_s(failures, payload["snapshot_seconds"], budget=0.01)
    assert every == max(1, round(tau / payload["step_seconds"]))
    assert f"lightning_field: snapshots every {every} step" in said[1] and "a failure redoes" in said[1]
    committed = sorted(e["step"] for e in read_events(tmp_path) if e["event"] == "snapshot_committed")
    assert committed[:PROBES] == list(range(1, PROBES + 1))
    assert all(step % every == 0 for step in committed[PROBES:])
    assert trainer.checkpoint_callback.snapshots.every_n_train_steps == every
    assert not snapshot_dir_for(tmp_path / "ckpts", tmp_path / "shm").is_dir()  # superseded by the end's save
    final = read_manifest(latest_recoverable(tmp_path / "ckpts") or tmp_path / "missing")
    assert final.snapshot_interval is not None and final.snapshot_interval["every_n_train_steps"] == every
    assert final.snapshot_interval["reason"] == payload["reason"]


def test_a_failing_auto_snapshot_turns_snapshots_off_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning_field.checkpoint.stores import snapshot as snapshot_store

    def full(*args: object, **kwargs: object) -> tuple[int, str]:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(snapshot_store, "_save_raw", full)
    trainer = make_trainer(tmp_path, 8, every_n_train_steps=100, snapshot_dir=tmp_path / "shm")
    with pytest.warns(UserWarning) as warned:
        trainer.fit(BoringModel())
    off = [str(w.message) for w in warned if "they are off for the rest of this attempt" in str(w.message)]
    assert len(off) == 1 and "No space left on device" in off[0] and "SnapshotConfig(directory=...)" in off[0]
    assert trainer.checkpoint_callback.snapshots.every_n_train_steps is None
    failed = [e for e in read_events(tmp_path) if e["event"] == "ckpt_save_failed"]
    assert len(failed) == 1  # one failure, not one a step
