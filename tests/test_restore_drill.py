"""RestoreDrill: a separate process replays the step after a checkpoint; good ones are marked, bad ones are loud."""

from __future__ import annotations

import csv
import errno
import json
import logging
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import fsspec
import lightning.pytorch as pl
import pytest
from conftest import rewrite_shared_state
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger

from lightning_field import (
    ManifestCheckpoint,
    RestoreDrill,
    TrainingPreempted,
    latest_recoverable,
    read_events,
    read_manifest,
    verify_checkpoint,
)
from lightning_field.checkpoint.resolver import committed_checkpoints
from lightning_field.cli.main import main as field_main
from lightning_field.evidence import RestoreDrillError, drill_runs
from lightning_field.record.collect import collect
from lightning_field.record.conditions import evaluate_conditions
from lightning_field.record.config import load_record_config
from lightning_field.workloads.demo import DemoDataModule, DemoRegressor

pytestmark = pytest.mark.usefixtures("warm_children")  # each drill is a process of its own


class OptimizerSaboteur(Callback):
    """After the checkpoint of ``step`` commits, triple its Adam moments and fix the manifest so every hash passes."""

    def __init__(self, checkpoint: ManifestCheckpoint, step: int) -> None:
        self.checkpoint, self.step, self.done = checkpoint, step, False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        committed = self.checkpoint.last_committed
        if self.done or committed is None or committed[1] != self.step:
            return
        self.done = True

        def triple_moments(state: dict) -> None:
            for moments in state["optimizer_states"][0]["state"].values():
                moments["exp_avg"].mul_(3.0)

        rewrite_shared_state(Path(committed[0]), triple_moments)


@pytest.mark.slow
def test_drills_mark_good_checkpoints_and_loudly_flag_one_whose_optimizer_state_was_edited(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    pl.seed_everything(0)
    checkpoint = ManifestCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=3, save_top_k=-1)
    drill = RestoreDrill(every_n_checkpoints=1)
    trainer = pl.Trainer(
        default_root_dir=tmp_path,
        max_steps=10,
        accelerator="cpu",
        deterministic=True,
        logger=CSVLogger(tmp_path, name="logs", version=0),
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[OptimizerSaboteur(checkpoint, 6), drill, checkpoint],
    )
    with caplog.at_level(logging.ERROR, logger="lightning_field"):
        trainer.fit(DemoRegressor(), datamodule=DemoDataModule())

    ckpts = tmp_path / "ckpts"
    good, bad, also_good = (read_manifest(ckpts / f"epoch=0-step={s}") for s in (3, 6, 9))
    assert good.restore_tested and also_good.restore_tested
    # The drills are recorded beside each manifest; the manifests stay as their commits wrote them.
    for step in (3, 6, 9):
        assert not json.loads((ckpts / f"epoch=0-step={step}" / "manifest.json").read_text())["restore_tested"]
        assert (ckpts / f"epoch=0-step={step}" / "restore_drill.json").is_file()
    assert good.restore_drill["checks"]["loss"]["passed"] and good.restore_drill["checks"]["batch"]["passed"]
    # The sabotage passes every hash, and even the replayed loss: only the update after it differs.
    assert not bad.restore_tested
    checks = bad.restore_drill["checks"]
    assert checks["loss"]["passed"] and checks["batch"]["passed"] and not checks["weights_after_step"]["passed"]
    # Loud: an error in the live run's log, an event, and a metric in its logger.
    assert any("RESTORE DRILL FAILED" in r.getMessage() and "step=6" in r.getMessage() for r in caplog.records)
    drills = [e for e in read_events(tmp_path) if e["event"] == "restore_drill"]
    assert sorted((e["step"], e["payload"]["passed"]) for e in drills) == [(3, True), (6, False), (9, True)]
    with open(tmp_path / "logs" / "version_0" / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("field/restore_drill_failures")]
    assert max(float(r["field/restore_drill_failures"]) for r in rows) == 1.0
    assert drill.failures == 1 and len(drill.results) == 3
    # Listings and the resolver show it: the failed one is never chosen to resume from.
    assert field_main(["ckpt", "list", str(ckpts)]) == 0
    listing = capsys.readouterr().out
    assert "tested" in listing and "FAILED" in listing
    (ckpts / "epoch=0-step=9").rename(tmp_path / "moved-away")
    assert latest_recoverable(ckpts) == ckpts / "epoch=0-step=3"


def test_drills_are_off_by_default(tmp_path: Path) -> None:
    pl.seed_everything(0)
    checkpoint = ManifestCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=2, save_top_k=-1)
    drill = RestoreDrill()
    trainer = pl.Trainer(
        default_root_dir=tmp_path, max_steps=4, accelerator="cpu", logger=False, enable_progress_bar=False,
        limit_val_batches=0, callbacks=[drill, checkpoint],
    )  # fmt: skip
    trainer.fit(DemoRegressor(), datamodule=DemoDataModule())
    assert drill.results == [] and not (tmp_path / "field" / "drills").exists()
    assert read_manifest(tmp_path / "ckpts" / "epoch=0-step=2").restore_drill is None


class ScriptLocalModel(DemoRegressor):
    pass


ScriptLocalModel.__module__ = "__main__"  # as if defined in the user's training script


@pytest.mark.parametrize(
    ("model", "callbacks", "message"),
    [
        (ScriptLocalModel, "both", "defined in the main script"),
        (DemoRegressor, "drill-only", "needs a lightning_field.ManifestCheckpoint"),
    ],
)
def test_a_drill_that_cannot_run_fails_before_training_with_what_to_pass(
    tmp_path: Path, model: type, callbacks: str, message: str
) -> None:
    drill = RestoreDrill(every_n_checkpoints=1)
    chosen: list[Callback] = [drill]
    if callbacks == "both":
        chosen.append(ManifestCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=2))
    trainer = pl.Trainer(
        default_root_dir=tmp_path, max_steps=2, accelerator="cpu", logger=False, enable_progress_bar=False,
        callbacks=chosen,
    )  # fmt: skip
    with pytest.raises(RestoreDrillError, match=message):
        trainer.fit(model(), datamodule=DemoDataModule())


@pytest.mark.slow
def test_a_drill_of_a_checkpoint_whose_name_was_reused_never_marks_its_successor(tmp_path: Path) -> None:
    pl.seed_everything(0)
    checkpoint = ManifestCheckpoint(
        dirpath=tmp_path / "ckpts", filename="latest", every_n_train_steps=2, save_top_k=1, enable_version_counter=False
    )
    drill = RestoreDrill(every_n_checkpoints=1)
    trainer = pl.Trainer(
        default_root_dir=tmp_path, max_steps=8, accelerator="cpu", deterministic=True, logger=False,
        enable_progress_bar=False, limit_val_batches=0, callbacks=[drill, checkpoint],
    )  # fmt: skip
    trainer.fit(DemoRegressor(), datamodule=DemoDataModule())
    assert len(drill.results) == 3 and drill.failures == 0
    # Each drill ran on its own copy, though a save of the same name replaced the checkpoint meanwhile.
    assert {r["outcome"] for r in drill.results} == {"passed"}
    final = read_manifest(tmp_path / "ckpts" / "latest")
    assert final.step == 8 and (final.restore_drill is None or final.restore_drill["step"] == 8)
    assert latest_recoverable(tmp_path / "ckpts") == tmp_path / "ckpts" / "latest"


def keep_one_run(tmp_path: Path, *extra: Callback) -> RestoreDrill:
    """ManifestCheckpoint's default retention (save_top_k=1), a save every 3 steps, a drill of each: the
    save at step 6 removes step 3's checkpoint while its drill process is still starting."""
    pl.seed_everything(0)
    checkpoint = ManifestCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=3)
    drill = RestoreDrill(every_n_checkpoints=1)
    trainer = pl.Trainer(
        default_root_dir=tmp_path, max_steps=8, accelerator="cpu", deterministic=True, logger=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
        callbacks=[*extra, drill, checkpoint],
    )  # fmt: skip
    trainer.fit(DemoRegressor(), datamodule=DemoDataModule())
    return drill


class DrillsWaitForStep(Callback):
    """Holds every drill process before its first line until training has passed ``step`` (its
    checkpoint saved and retention done), so the race of a removal against a drill's start is decided:
    the removal comes first, however loaded the machine."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, flag: Path, step: int) -> None:
        self.flag, self.step = flag, step
        real = drill_runs.subprocess.Popen

        def held(argv: list[str], **kwargs: Any) -> Any:
            python, _, module, *args = argv  # python -m lightning_field.evidence.drill_replay <spec>
            code = (
                f"import os, runpy, sys, time\nwhile not os.path.exists({str(flag)!r}): time.sleep(0.02)\n"
                f"sys.argv[0] = {module!r}\nrunpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
            )
            return real([python, "-c", code, *args], **kwargs)

        monkeypatch.setattr(drill_runs.subprocess, "Popen", held)

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step >= self.step:
            self.flag.touch()

    def on_train_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self.flag.touch()


@pytest.mark.slow
def test_with_save_top_k_1_every_drill_runs_on_a_private_copy_while_retention_still_removes_the_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="lightning_field"):
        drill = keep_one_run(tmp_path)
    outcomes = [(r["step"], r["outcome"], r["protected_copy"]) for r in drill.results]
    assert outcomes == [(3, "passed", True), (6, "passed", True)]
    assert drill.errors == 0 and drill.failures == 0 and not caplog.records
    # Only the newest checkpoint is left: it is also the newest whose drill passed, so step 3, which
    # was kept (or put back from its copy) for its drill only until a newer one passed, is gone too.
    ckpts = tmp_path / "ckpts"
    assert [e.path for e in committed_checkpoints(ckpts)] == [ckpts / "epoch=0-step=6"]
    assert read_manifest(ckpts / "epoch=0-step=6").restore_tested
    # The private copies are gone once their drills are recorded; the drills' logs and results stay.
    left = sorted(p.name for p in ckpts.iterdir())
    assert left == ["LAST", "SNAPSHOT_LINEAGE", "epoch=0-step=6", "epoch=0-step=6.ckpt"]
    assert len(list((tmp_path / "field" / "drills").glob("*/result.json"))) == 2
    drills = [e for e in read_events(tmp_path) if e["event"] == "restore_drill"]
    assert sorted((e["step"], e["payload"]["outcome"]) for e in drills) == [(3, "passed"), (6, "passed")]


def default_checkpoint(run_dir: Path) -> ManifestCheckpoint:
    """ManifestCheckpoint's default retention (save_top_k=1), a save every 3 steps and one at the end, in
    ``run_dir/checkpoints``, where the release record reads them."""
    return ManifestCheckpoint(dirpath=run_dir / "checkpoints", every_n_train_steps=3, save_on_train_end=True)


def fit_with_drills(
    run_dir: Path, checkpoint: ManifestCheckpoint, *callbacks: Callback, max_steps: int
) -> RestoreDrill:
    """Fit with a drill of every checkpoint; ``callbacks`` run first."""
    pl.seed_everything(0)
    drill = RestoreDrill(every_n_checkpoints=1)
    trainer = pl.Trainer(
        default_root_dir=run_dir, max_steps=max_steps, accelerator="cpu", deterministic=True, logger=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
        callbacks=[*callbacks, drill, checkpoint],
    )  # fmt: skip
    trainer.fit(DemoRegressor(), datamodule=DemoDataModule())
    return drill


def restore_drill_condition(run_dir: Path) -> dict[str, Any]:
    """The release record's restore-drill condition on ``run_dir``, collected and evaluated as
    ``field record build`` does."""
    config = load_record_config()
    collection = collect([run_dir], config.config_keys)
    sources = {source.id: source.to_dict() for source in collection.sources}
    results = evaluate_conditions(config.conditions, collection.figures, sources, collection.release, time.time())
    return next(r for r in results if r["name"] == "checkpoint_restore_tested")


def names(checkpoints: Path) -> list[str]:
    """The committed checkpoints, newest first."""
    return [Path(e.path).name for e in committed_checkpoints(checkpoints)]


@pytest.mark.slow
def test_with_save_top_k_1_the_newest_drill_passed_checkpoint_stays_beside_the_final_one_so_the_record_can_go(
    tmp_path: Path,
) -> None:
    drill = fit_with_drills(tmp_path, default_checkpoint(tmp_path), max_steps=8)
    assert [(r["step"], r["outcome"]) for r in drill.results] == [(3, "passed"), (6, "passed")]
    # The final save is never drilled (no step follows it); the newest drill-passed one is kept beside it,
    # whole (here the final save removed it before its drill ended, and the drill put its copy back).
    checkpoints = tmp_path / "checkpoints"
    assert names(checkpoints) == ["final-step=8", "epoch=0-step=6"]
    kept = read_manifest(checkpoints / "epoch=0-step=6")
    assert kept.restore_tested and kept.restore_drill is not None and kept.restore_drill["step"] == 6
    assert verify_checkpoint(checkpoints / "epoch=0-step=6").intact
    assert latest_recoverable(checkpoints) == checkpoints / "final-step=8"
    assert not [p for p in checkpoints.iterdir() if p.name.startswith(".")]  # no private copy left behind
    condition = restore_drill_condition(tmp_path)
    assert condition["status"] == "pass", condition
    assert "epoch=0-step=6" in condition["detail"]
    # What the record said when retention left the final checkpoint alone:
    shutil.rmtree(checkpoints / "epoch=0-step=6")
    assert restore_drill_condition(tmp_path)["status"] == "missing"


class WaitForDrills(Callback):
    """Before each batch, wait for the drills in flight (so each is recorded at the end of this batch)
    and note the committed checkpoints and the one ModelCheckpoint's retention keeps, by step."""

    def __init__(self, checkpoint_dir: Path) -> None:
        self.checkpoint_dir = checkpoint_dir
        self.seen: dict[int, tuple[list[str], str]] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        drill = next(c for c in trainer.callbacks if isinstance(c, RestoreDrill))
        for running in drill.running:
            running.process.wait(timeout=120)
        checkpoint = next(c for c in trainer.callbacks if isinstance(c, ManifestCheckpoint))
        kept = Path(checkpoint.best_model_path).name.removesuffix(checkpoint.FILE_EXTENSION)  # its folder's name
        self.seen[trainer.global_step] = (names(self.checkpoint_dir), kept)


@pytest.mark.slow
def test_once_a_newer_checkpoint_passes_its_drill_the_one_kept_for_an_older_drill_is_removed(tmp_path: Path) -> None:
    pl.seed_everything(0)
    checkpoints = tmp_path / "ckpts"
    checkpoint = ManifestCheckpoint(dirpath=checkpoints, every_n_train_steps=3)
    drill = RestoreDrill(every_n_checkpoints=1)
    waiter = WaitForDrills(checkpoints)
    trainer = pl.Trainer(
        default_root_dir=tmp_path, max_steps=10, accelerator="cpu", deterministic=True, logger=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
        callbacks=[waiter, drill, checkpoint],
    )  # fmt: skip
    trainer.fit(DemoRegressor(), datamodule=DemoDataModule())
    assert [(r["step"], r["outcome"]) for r in drill.results] == [(3, "passed"), (6, "passed"), (9, "passed")]
    # Step 3's drill passed (after step 4) before the save at step 6, whose retention keeps it
    # until step 6's drill passes (after step 7); then it goes. The same for step 6 at step 9.
    assert waiter.seen[6][0] == ["epoch=0-step=6", "epoch=0-step=3"]
    assert waiter.seen[8][0] == ["epoch=0-step=6"]
    assert waiter.seen[9][0] == ["epoch=0-step=9", "epoch=0-step=6"]
    # Never more than one checkpoint kept for a drill besides the one save_top_k=1 keeps.
    for step, (present, kept_by_retention) in waiter.seen.items():
        assert len([n for n in present if n != kept_by_retention]) <= 1, (step, present)
    assert names(checkpoints) == ["epoch=0-step=9"] and read_manifest(checkpoints / "epoch=0-step=9").restore_tested


@pytest.mark.slow
@pytest.mark.parametrize("drill_ends", ["before the next save", "after the next save"])
def test_a_checkpoint_whose_drill_found_a_mismatch_is_kept_and_the_release_record_fails_naming_it(
    tmp_path: Path, drill_ends: str
) -> None:
    checkpoint = default_checkpoint(tmp_path)
    waiter = WaitForDrills(tmp_path / "checkpoints")
    # Before: retention, at the save of step 6, keeps step 3 for its recorded mismatch. After: it has
    # removed step 3 by the time the drill ends, and the drill puts its copy back.
    callbacks = [OptimizerSaboteur(checkpoint, 3), *([waiter] if drill_ends == "before the next save" else [])]
    drill = fit_with_drills(tmp_path, checkpoint, *callbacks, max_steps=7)
    assert [(r["step"], r["outcome"]) for r in drill.results] == [(3, "mismatch"), (6, "passed")]
    # Kept as the record's evidence of the failure; the resolver never resumes from it.
    checkpoints = tmp_path / "checkpoints"
    assert names(checkpoints) == ["final-step=7", "epoch=0-step=6", "epoch=0-step=3"]
    failed = read_manifest(checkpoints / "epoch=0-step=3")
    assert not failed.restore_tested and failed.restore_drill is not None
    assert failed.restore_drill["outcome"] == "mismatch"
    if waiter.seen:
        assert waiter.seen[6][0] == ["epoch=0-step=6", "epoch=0-step=3"]
    condition = restore_drill_condition(tmp_path)
    assert condition["status"] == "fail", condition
    assert "epoch=0-step=3" in condition["detail"]


@pytest.mark.slow
def test_where_no_private_copy_can_be_made_a_removed_checkpoints_drill_is_reported_skipped_with_its_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As on a filesystem without hard links: the drill falls back to loading the checkpoint itself,
    # which is what every drill did before the copies, and retention wins the race.
    def no_hard_links(src: str, dst: str, **_: object) -> None:
        raise OSError(errno.EPERM, "hard links not supported here", src)

    monkeypatch.setattr(os, "link", no_hard_links)
    with caplog.at_level(logging.WARNING, logger="lightning_field"):
        drill = keep_one_run(tmp_path, DrillsWaitForStep(monkeypatch, tmp_path / "step-6-saved", 6))
    outcomes = [(r["step"], r["outcome"], r["protected_copy"]) for r in drill.results]
    assert outcomes == [(3, "skipped", False), (6, "passed", False)]
    assert "removed by retention" in drill.results[0]["reason"] and drill.errors == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    cannot_keep = [w for w in warnings if w.startswith("RestoreDrill cannot keep checkpoints")]
    assert len(cannot_keep) == 1 and "hard links not supported here" in cannot_keep[0]  # once, not per drill
    assert "save_top_k=1" in cannot_keep[0]
    assert any("step=3" in w and "skipped" in w and "removed by retention" in w for w in warnings)
    drills = [e for e in read_events(tmp_path) if e["event"] == "restore_drill"]
    assert sorted((e["step"], e["payload"]["outcome"]) for e in drills) == [(3, "skipped"), (6, "passed")]


class _SigtermWhileDrilling(Callback):
    """At ``step``, note the drill processes running, then ask for a preemption (SIGTERM to self)."""

    def __init__(self, drill: RestoreDrill, step: int) -> None:
        self.drill, self.step = drill, step
        self.seen: list = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            self.seen = [running.process for running in self.drill.running]
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.slow
def test_a_preemption_stops_running_drills_at_once_instead_of_leaving_them_behind(tmp_path: Path) -> None:
    pl.seed_everything(0)
    checkpoint = ManifestCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=3, save_top_k=-1)
    drill = RestoreDrill(every_n_checkpoints=1)
    probe = _SigtermWhileDrilling(drill, 5)  # the drill of step 3 starts after step 4
    trainer = pl.Trainer(
        default_root_dir=tmp_path, max_steps=10, accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, callbacks=[probe, drill, checkpoint],
    )  # fmt: skip
    with pytest.raises(TrainingPreempted):
        trainer.fit(DemoRegressor(), datamodule=DemoDataModule())
    assert probe.seen, "no drill was running when the preemption came"
    assert all(process.poll() is not None for process in probe.seen) and drill.running == []


@pytest.mark.slow
def test_a_drill_of_a_checkpoint_in_an_s3_bucket_loads_it_from_the_bucket_and_marks_its_manifest_there(
    tmp_path: Path, s3_bucket: tuple[str, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket, options = s3_bucket
    url = f"{bucket}/run/checkpoints"
    monkeypatch.chdir(tmp_path)  # a manifest written through Path("s3://...") would land here, as s3:/...
    pl.seed_everything(0)
    checkpoint = ManifestCheckpoint(dirpath=url, storage_options=options, every_n_train_steps=3, save_top_k=-1)
    drill = RestoreDrill(every_n_checkpoints=1)
    trainer = pl.Trainer(
        default_root_dir=tmp_path / "run", max_steps=7, accelerator="cpu", deterministic=True, logger=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, callbacks=[drill, checkpoint],
    )  # fmt: skip
    trainer.fit(DemoRegressor(), datamodule=DemoDataModule())
    outcomes = [(r["step"], r["outcome"]) for r in drill.results]
    why = [(r["step"], r.get("error"), r.get("reason")) for r in drill.results]
    assert outcomes == [(3, "passed"), (6, "passed")], why
    fs = fsspec.filesystem("s3", **options)
    for step in (3, 6):
        marked = read_manifest(f"{url}/epoch=0-step={step}", options)
        assert marked.restore_tested and marked.restore_drill is not None and marked.restore_drill["step"] == step
        # Recorded beside the manifest, which keeps the bytes its commit wrote.
        prefix = f"{url}/epoch=0-step={step}".removeprefix("s3://")
        assert not json.loads(fs.cat_file(f"{prefix}/manifest.json"))["restore_tested"]
        assert json.loads(fs.cat_file(f"{prefix}/restore_drill.json"))["restore_tested"]
        assert verify_checkpoint(f"{url}/epoch=0-step={step}", storage_options=options).recoverable
    assert not (tmp_path / "s3:").exists(), "a drill wrote its record beside the run instead of into the bucket"
    assert latest_recoverable(url, options) == f"{url}/epoch=0-step=6"


class DiesInDrillModel(DemoRegressor):
    """Built fine in the live run; in a drill process (its environment says so) it dies at once."""

    def __init__(self, **hparams: Any) -> None:
        super().__init__(**hparams)
        if os.environ.get("FIELD_TEST_DRILL_DIES"):
            print("this model cannot be built on this machine", flush=True)
            os._exit(3)


@pytest.mark.slow
def test_a_drill_process_that_dies_without_a_result_is_an_error_naming_its_exit_status_and_its_logs_last_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pl.seed_everything(0)
    model = DiesInDrillModel()
    monkeypatch.setenv("FIELD_TEST_DRILL_DIES", "1")  # after the live model is built: only drills see it
    checkpoint = ManifestCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=2, save_top_k=-1)
    drill = RestoreDrill(every_n_checkpoints=1)
    trainer = pl.Trainer(
        default_root_dir=tmp_path, max_steps=3, accelerator="cpu", logger=False, enable_progress_bar=False,
        limit_val_batches=0, callbacks=[drill, checkpoint],
    )  # fmt: skip
    trainer.fit(model, datamodule=DemoDataModule())
    [result] = drill.results
    assert result["outcome"] == "error" and not result["passed"]
    assert "drill process exited 3 without a result" in result["error"]
    assert "drill.log ends: this model cannot be built on this machine" in result["error"]
    assert not read_manifest(tmp_path / "ckpts" / "epoch=0-step=2").restore_tested
