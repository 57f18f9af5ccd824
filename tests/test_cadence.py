"""CheckpointCadence: the interval follows Daly's formula from the measured save cost and the MTBF."""

from __future__ import annotations

import json
import time
from pathlib import Path

import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import Callback

from lightning_field import CheckpointCadence, ManifestCheckpoint, read_events
from lightning_field.demo import DemoDataModule, DemoRegressor
from lightning_field.planning.intervals import daly_interval, young_interval
from lightning_field.quality.cadence import choose_steps, updated_mtbf

SAVE_DELAY_S = 2.0
STEP_S = 0.05


class SlowSaveCheckpoint(ManifestCheckpoint):
    """Every save blocks training for an extra ``SAVE_DELAY_S`` while it gathers state, like a slow filesystem."""

    def _rank_state(self, trainer, checkpoint, rng):  # type: ignore[no-untyped-def]
        time.sleep(SAVE_DELAY_S)
        return super()._rank_state(trainer, checkpoint, rng)


class SteadySteps(Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        time.sleep(STEP_S)


def test_with_a_2s_save_and_a_5min_mtbf_the_interval_matches_dalys_formula(tmp_path: Path) -> None:
    checkpoint = SlowSaveCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=4, save_top_k=-1)
    cadence = CheckpointCadence(mtbf_hours=5 / 60)
    trainer = pl.Trainer(
        default_root_dir=tmp_path, max_steps=8, accelerator="cpu", logger=False, enable_progress_bar=False,
        limit_val_batches=0, callbacks=[SteadySteps(), cadence, checkpoint],
    )  # fmt: skip
    trainer.fit(DemoRegressor(), datamodule=DemoDataModule())
    decision = cadence.decision
    assert decision is not None and decision.applied
    assert decision.save_s == pytest.approx(SAVE_DELAY_S, rel=0.05)
    assert decision.interval_s == pytest.approx(daly_interval(SAVE_DELAY_S, 300.0), rel=0.05)
    assert decision.steps == round(decision.interval_s / decision.step_s)
    assert checkpoint.every_n_train_steps == decision.steps  # it drives the checkpoint callback
    assert 0 < decision.predicted_waste < 1
    assert [e["payload"]["steps"] for e in read_events(tmp_path) if e["event"] == "cadence"] == [decision.steps]


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


def test_every_ddp_rank_applies_the_same_interval_at_the_same_step(tmp_path: Path) -> None:
    from conftest import TESTS_DIR, run_child

    job = TESTS_DIR / "jobs" / "quality_job.py"
    result = run_child([job, "--root", tmp_path, "--devices", "2", "--max-steps", "30", "--every", "5",
                        "--step-seconds", "0.01", "--cadence-mtbf-hours", "0.002"], timeout=180)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]
    per_rank = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("cadence-rank*.json"))]
    assert len(per_rank) == 2, result.stdout[-3000:]
    assert per_rank[0] == per_rank[1] and per_rank[0]["decisions"] != []
