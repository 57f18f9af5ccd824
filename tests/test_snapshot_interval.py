"""``snapshot_every_n_train_steps="auto"`` (the default): snapshots every step while their cost is
measured, then the smallest interval whose cost stays within the budget, agreed by every rank from the
slowest one's cost, said in the log, the event log and the manifests; a user's integer is kept; a
failing snapshot turns ``"auto"`` off with one warning instead of one per step."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
import torch
from conftest import make_trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_field import latest_recoverable, read_manifest
from lightning_field.checkpoint.snapshot_interval import (
    COUNTED,
    PROBES,
    RECHECK_EVERY,
    SnapshotInterval,
    check_every_n_train_steps,
)
from lightning_field.checkpoint.snapshots import snapshot_dir_for
from lightning_field.core.events import read_events


def measured(interval: SnapshotInterval, cost: float, step: float, snapshots: int) -> None:
    for _ in range(snapshots):
        interval.step_ended(step)
        interval.snapshot_taken(cost)


def alone(figures: tuple[float, float]) -> list[tuple[float, float]]:
    return [figures]


@pytest.mark.parametrize(
    ("cost_ms", "step_ms", "every"),
    [(0.5, 100.0, 1), (1.0, 100.0, 1), (1.01, 100.0, 2), (6.0, 154.0, 4), (9.8, 241.0, 5), (50.0, 10.0, 500)],
)
def test_auto_keeps_the_smallest_interval_whose_measured_cost_is_within_the_budget(
    cost_ms: float, step_ms: float, every: int
) -> None:
    interval = SnapshotInterval("auto")
    measured(interval, cost_ms / 1e3, step_ms / 1e3, PROBES - 1)
    assert not interval.choice_due() and interval.every_n_train_steps == 1  # every step while measuring
    measured(interval, cost_ms / 1e3, step_ms / 1e3, 1)
    choice = interval.choose(alone)
    assert choice is not None and choice.every_n_train_steps == every == interval.every_n_train_steps
    assert choice.overhead is not None and choice.overhead <= 0.01 + 1e-12
    if every > 1:  # the smallest: one step fewer would be over the budget
        assert cost_ms / ((every - 1) * step_ms) > 0.01
    assert f"a crash redoes at most {every} step" in choice.reason


def test_only_the_newest_probes_count_and_the_slowest_rank_decides_for_all() -> None:
    interval = SnapshotInterval("auto")
    measured(interval, 0.050, 0.1, PROBES - COUNTED)  # the first snapshots fault in fresh pages
    measured(interval, 0.001, 0.1, COUNTED)
    ranks = [(0.001, 0.1), (0.003, 0.1)]
    choice = interval.choose(lambda mine: [mine, ranks[1]])
    assert choice is not None and choice.every_n_train_steps == 3 and choice.snapshot_seconds == 0.003
    assert ranks[0] == interval.local_figures()


def test_auto_rechecks_and_says_so_only_when_the_interval_changes() -> None:
    interval = SnapshotInterval("auto")
    measured(interval, 0.004, 0.1, PROBES)
    assert interval.choose(alone) is not None and interval.every_n_train_steps == 4
    measured(interval, 0.004, 0.1, RECHECK_EVERY - 1)
    assert not interval.choice_due()
    measured(interval, 0.004, 0.1, 1)
    assert interval.choice_due() and interval.choose(alone) is None  # the same interval: nothing to say
    measured(interval, 0.012, 0.1, RECHECK_EVERY)  # the state grew
    choice = interval.choose(alone)
    assert choice is not None and choice.every_n_train_steps == 12


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
    with pytest.raises(ValueError, match=r"snapshot_every_n_train_steps|snapshot_overhead_budget"):
        check_every_n_train_steps(every, budget)


def test_by_default_a_run_measures_its_snapshots_and_says_the_interval_in_log_events_and_manifests(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    torch.manual_seed(0)
    trainer = make_trainer(  # no snapshot arguments
        tmp_path, 12, every_n_train_steps=100, snapshot_dir=tmp_path / "shm", save_on_train_end=True
    )
    with caplog.at_level(logging.INFO):
        trainer.fit(BoringModel())
    said = [r.getMessage() for r in caplog.records if "lightning_field: snapshots" in r.getMessage()]
    assert said[0].startswith("lightning_field: snapshots (auto: every step while their cost is measured")
    chosen = [e for e in read_events(tmp_path) if e["event"] == "snapshot_interval"]
    assert len(chosen) == 1 and chosen[0]["step"] == PROBES
    every = chosen[0]["payload"]["every_n_train_steps"]
    assert chosen[0]["payload"]["chosen_by"] == "auto" and chosen[0]["payload"]["requested"] == "auto"
    assert f"lightning_field: snapshots every {every} step" in said[1]
    committed = sorted(e["step"] for e in read_events(tmp_path) if e["event"] == "snapshot_committed")
    assert committed[:PROBES] == list(range(1, PROBES + 1))
    assert all(step % every == 0 for step in committed[PROBES:])
    assert trainer.checkpoint_callback.snapshots.every_n_train_steps == every
    where = snapshot_dir_for(tmp_path / "ckpts", tmp_path / "shm")
    assert not where.is_dir()  # the end's persistent save supersedes them: released
    # Every manifest says the interval in force then and why: the end's save the chosen one.
    final = read_manifest(latest_recoverable(tmp_path / "ckpts") or tmp_path / "missing")
    assert final.snapshot_interval is not None and final.snapshot_interval["every_n_train_steps"] == every
    assert final.snapshot_interval["chosen_by"] == "auto"
    assert final.snapshot_interval["reason"] == chosen[0]["payload"]["reason"]


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
    assert len(off) == 1 and "No space left on device" in off[0] and "snapshot_dir" in off[0]
    assert trainer.checkpoint_callback.snapshots.every_n_train_steps is None
    failed = [e for e in read_events(tmp_path) if e["event"] == "ckpt_save_failed"]
    assert len(failed) == 1  # one failure, not one a step
