"""A finished run rerun with the same command and ``ckpt_path="last"`` does nothing and says so; a
rerun that would train on (larger limits, the stopping callback removed or changed, a stop of
unknown origin) continues. The stop-point saves record why fit ended (``Manifest.stopped``), and
:func:`~lightning_field.checkpoint.stop_points.finished_detail` decides from that record and the
rerun's own settings. On Lightning's BoringModel beside plain ModelCheckpoint, whose rerun trains
steps again; the EarlyStopping case on a user's classifier is the conformance row
``rerun-after-early-stopping``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_field import ManifestCheckpoint
from lightning_field.checkpoint.stop_points import early_stopping_settings, finished_detail
from lightning_field.core.events import read_events
from lightning_field.core.manifest import read_manifest

sys.path.insert(0, str(Path(__file__).parent / "jobs"))
from conformance_job import StopAtStep

ES = early_stopping_settings(EarlyStopping(monitor="val_loss", patience=2))
RERUN = {"max_steps": -1, "max_epochs": 10, "min_steps": None, "min_epochs": None, "max_time_s": [],
         "early_stopping": []}  # fmt: skip
BY_ES = {"by": "EarlyStopping", "detail": "EarlyStopping on val_loss", "finished": True, "epochs_done": 2,
         "stopper": ES}  # fmt: skip
BY_TIME = {"by": "max_time", "detail": "max_time=0:00:10 reached", "finished": True, "epochs_done": 0,
           "stopper": {"max_time_s": 10.0, "elapsed_s": 10.2}}  # fmt: skip
BY_STEPS = {"by": "max_steps", "detail": "max_steps=20 reached", "finished": True, "epochs_done": 2}


@pytest.mark.parametrize(
    ("stopped", "rerun", "expected"),
    [
        # EarlyStopping: the same callback still there stops the rerun at once; removed or changed, it trains on.
        (BY_ES, {**RERUN, "early_stopping": [ES]}, "EarlyStopping on val_loss"),
        (BY_ES, RERUN, None),
        (BY_ES, {**RERUN, "early_stopping": [{**ES, "patience": 5}]}, None),
        (BY_ES, {**RERUN, "early_stopping": [early_stopping_settings(EarlyStopping(monitor="val_acc"))]}, None),
        (BY_ES, {**RERUN, "early_stopping": [ES], "min_epochs": 3}, None),  # Lightning would not stop before it
        # max_time: a limit no larger than the time already trained; a larger one, or none, trains on.
        (BY_TIME, {**RERUN, "max_time_s": [10.0]}, "max_time=0:00:10 reached"),
        (BY_TIME, {**RERUN, "max_time_s": [5.0]}, "max_time=0:00:10 reached"),
        (BY_TIME, {**RERUN, "max_time_s": [20.0]}, None),
        (BY_TIME, RERUN, None),
        # Limits: reached already (equal or smaller) ends it as Lightning's own loop would; larger trains on.
        (BY_STEPS, {**RERUN, "max_steps": 20}, "max_steps=20 reached"),
        (BY_STEPS, {**RERUN, "max_steps": 30}, None),
        (BY_STEPS, {**RERUN, "max_steps": -1, "max_epochs": 2}, "max_epochs=2 reached"),
        (BY_ES, {**RERUN, "max_steps": 20}, "max_steps=20 reached"),
        # Not finished, or nothing recorded (an earlier version's checkpoint): trains on.
        ({**BY_ES, "finished": False}, {**RERUN, "early_stopping": [ES]}, None),
        ({"by": "should_stop", "detail": "trainer.should_stop was set", "finished": False}, {**RERUN, "max_steps": 20},
         None),
        (None, {**RERUN, "max_steps": 20}, None),
        ({**BY_TIME, "stopper": {"elapsed_s": "long"}}, {**RERUN, "max_time_s": [1.0]}, None),
    ],
)
def test_a_rerun_has_nothing_to_do_exactly_when_the_stop_would_hold_again_at_once(
    stopped: dict[str, Any] | None, rerun: dict[str, Any], expected: str | None
) -> None:
    assert finished_detail(stopped, 20, rerun) == expected


class CountBatches(Callback):
    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_start(self, *args: Any) -> None:
        self.batches += 1


class SlowSteps(Callback):
    def on_train_batch_end(self, *args: Any) -> None:
        time.sleep(0.1)


def _fit(root: Path, callback: ModelCheckpoint, max_steps: int, *extra: Callback, resume: bool = False,
         **trainer: Any) -> tuple[pl.Trainer, int]:  # fmt: skip
    counted = CountBatches()
    fit = pl.Trainer(
        default_root_dir=root, max_steps=max_steps, accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, callbacks=[callback, counted, *extra], **trainer,
    )  # fmt: skip
    pl.seed_everything(7)
    fit.fit(BoringModel(), ckpt_path="last" if resume else None)
    return fit, counted.batches


def _field(root: Path) -> ManifestCheckpoint:
    return ManifestCheckpoint(dirpath=root / "ckpts", every_n_train_steps=4, save_top_k=-1, save_on_train_end=True,
                              snapshot_dir=root / "snapshots")  # fmt: skip


def test_a_run_at_its_max_steps_rerun_does_nothing_and_says_so_where_plain_lightning_trains_its_last_steps_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _fit(tmp_path, _field(tmp_path), 10)
    assert read_manifest(tmp_path / "ckpts" / "final-step=10").stopped == {
        "by": "max_steps", "detail": "max_steps=10 reached", "finished": True, "epochs_done": 0,
    }  # fmt: skip
    caplog.clear()
    rerun, batches = _fit(tmp_path, _field(tmp_path), 10, resume=True)
    assert (rerun.global_step, batches) == (10, 0)
    assert "training had already stopped at step 10 (max_steps=10 reached); nothing to do" in caplog.text
    finished = [e for e in read_events(tmp_path) if e["event"] == "fit_already_finished"]
    assert [(e["step"], e["payload"]["by"]) for e in finished] == [(10, "max_steps")]
    larger, batches = _fit(tmp_path, _field(tmp_path), 14, resume=True)
    assert (larger.global_step, batches) == (14, 4), "a rerun with a larger limit did not train on"

    plain = ModelCheckpoint(dirpath=tmp_path / "plain", every_n_train_steps=4, save_last=True)
    _fit(tmp_path / "p", plain, 10)
    _, batches = _fit(tmp_path / "p", ModelCheckpoint(dirpath=tmp_path / "plain", every_n_train_steps=4,
                                                      save_last=True), 10, resume=True)  # fmt: skip
    assert batches == 2, "plain Lightning's rerun trains again what its last checkpoint lacked"


def test_a_run_stopped_by_max_time_rerun_with_the_same_limit_does_nothing_and_with_a_larger_one_trains_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first, _ = _fit(tmp_path, _field(tmp_path), 100, SlowSteps(), max_time={"seconds": 1})
    stopped = read_manifest(tmp_path / "ckpts" / f"stopped-step={first.global_step}").stopped
    assert stopped is not None and (stopped["by"], stopped["finished"]) == ("max_time", True)
    assert stopped["stopper"]["max_time_s"] == 1.0 and stopped["stopper"]["elapsed_s"] >= 1.0
    caplog.clear()
    _, batches = _fit(tmp_path, _field(tmp_path), 100, SlowSteps(), resume=True, max_time={"seconds": 1})
    assert batches == 0
    said = f"training had already stopped at step {first.global_step} (max_time=0:00:01 reached); nothing to do"
    assert said in caplog.text
    _, batches = _fit(tmp_path, _field(tmp_path), first.global_step + 3, resume=True, max_time={"seconds": 30})
    assert batches == 3


def test_a_stop_of_unknown_origin_is_recorded_as_not_finished_and_its_rerun_trains_on(tmp_path: Path) -> None:
    _fit(tmp_path, _field(tmp_path), 20, StopAtStep(6))
    assert read_manifest(tmp_path / "ckpts" / "stopped-step=6").stopped == {
        "by": "should_stop", "detail": "trainer.should_stop was set", "finished": False, "epochs_done": 0,
    }  # fmt: skip
    rerun, batches = _fit(tmp_path, _field(tmp_path), 20, resume=True)
    assert (rerun.global_step, batches) == (20, 14)
