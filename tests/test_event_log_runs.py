"""One event log per run directory, holding runs that unrelated scripts do not share.

Where no ``default_root_dir`` is given, every script run from one working directory writes into the
same ``field/events.jsonl``. Each fresh start is a run of its own; a resume joins the run that wrote
the checkpoint it resumed (the run id travels in the manifest); a scheduler's restart of the same job
continues its run even where it found nothing to resume. ``field ledger`` accounts for one run.
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_field import ManifestCheckpoint, TimeToQuality, goodput_ledger, read_manifest, select_run
from lightning_field.checkpoint.resolver import committed_checkpoints
from lightning_field.cli.main import main as field_main
from lightning_field.core.events import (
    EventLog,
    UnknownRunError,
    read_events,
    read_run_events,
    run_of_attempts,
    runs_in,
)


class LoggingBoringModel(BoringModel):
    """Lightning's BoringModel, logging its validation loss as users' models do."""

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> dict[str, torch.Tensor]:
        out = super().validation_step(batch, batch_idx)
        self.log("val_loss", out["x"])
        return out


def _script(dirpath: Path, seed: int, max_steps: int, resume: bool = False) -> pl.Trainer:
    """A user's script run from the working directory: no default_root_dir, no logger."""
    pl.seed_everything(seed)
    trainer = pl.Trainer(
        max_steps=max_steps, accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, val_check_interval=2, check_val_every_n_epoch=None, limit_val_batches=1,
        num_sanity_val_steps=0,
        callbacks=[ManifestCheckpoint(dirpath=dirpath, every_n_train_steps=2, snapshot_every_n_train_steps=None),
                   TimeToQuality(monitor="val_loss", target=-1.0)],
    )  # fmt: skip
    trainer.fit(LoggingBoringModel(), ckpt_path="last" if resume else None)
    return trainer


def test_unrelated_scripts_in_one_working_directory_are_separate_runs_and_a_resume_joins_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    _script(tmp_path / "a", seed=1, max_steps=4)
    _script(tmp_path / "b", seed=2, max_steps=4)
    _script(tmp_path / "a", seed=1, max_steps=8, resume=True)

    events = read_events(tmp_path)  # the working directory's one log
    runs = runs_in(events)
    assert sorted(runs.values()) == [[1, 3], [2]], runs
    run_a = next(run for run, attempts in runs.items() if attempts == [1, 3])
    run_b = next(run for run, attempts in runs.items() if attempts == [2])
    # Every manifest of a lineage names its run, before the resume and after it.
    for entry in committed_checkpoints(tmp_path / "a"):
        assert read_manifest(entry.path).provenance["run_id"] == run_a
    for entry in committed_checkpoints(tmp_path / "b"):
        assert read_manifest(entry.path).provenance["run_id"] == run_b

    ledger_a = goodput_ledger(select_run(events, run_a))
    assert [a.attempt for a in ledger_a.attempts] == [1, 3]
    assert [a.resumed_from_step for a in ledger_a.attempts] == [None, 4]
    assert ledger_a.interruptions == 0 and ledger_a.lost_steps == 0
    ledger_b = goodput_ledger(select_run(events, run_b))
    assert [(a.attempt, a.status, a.last_step) for a in ledger_b.attempts] == [(2, "finished", 4)]
    # TimeToQuality's summary is the newest run's (run a's two attempts), not the whole directory's.
    summary = json.loads((tmp_path / "field" / "time_to_quality.json").read_text())
    assert [a["attempt"] for a in summary["goodput"]["attempts"]] == [1, 3]

    assert field_main(["ledger", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert f"run {run_a}: 2 attempt(s), 0 interruption(s)" in table
    assert f"other runs in this log: {run_b} (attempts 2)" in table
    assert field_main(["ledger", str(tmp_path), "--run-id", run_b, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["run_id"] == run_b and [a["attempt"] for a in document["attempts"]] == [2]
    assert field_main(["ledger", str(tmp_path), "--run-id", "nosuchrun"]) == 1
    assert "run 'nosuchrun' is not in the event log; its runs:" in capsys.readouterr().err


def _attempt(run_dir: Path, environ: dict[str, str]) -> EventLog:
    log = EventLog(run_dir, environ=environ)
    log.end("crashed")  # ended, so the next EventLog of this process is a new attempt
    return log


def test_a_schedulers_restart_of_the_same_job_continues_its_run_and_anything_else_starts_a_new_one(
    tmp_path: Path,
) -> None:
    first = _attempt(tmp_path, {"SLURM_JOB_ID": "77"})
    requeued = _attempt(tmp_path, {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "1"})
    assert requeued.run_id == first.run_id  # found nothing to resume, still the job's run: its restart loss
    other_job = _attempt(tmp_path, {"SLURM_JOB_ID": "78", "SLURM_RESTART_COUNT": "1"})
    rerun_by_hand = _attempt(tmp_path, {"SLURM_JOB_ID": "77"})
    elastic = _attempt(tmp_path, {"TORCHELASTIC_RUN_ID": "t1"})
    elastic_restart = _attempt(tmp_path, {"TORCHELASTIC_RUN_ID": "t1", "TORCHELASTIC_RESTART_COUNT": "2"})
    assert elastic_restart.run_id == elastic.run_id
    assert len({first.run_id, other_job.run_id, rerun_by_hand.run_id, elastic.run_id}) == 4
    assert run_of_attempts(read_events(tmp_path)) == {
        1: first.run_id, 2: first.run_id, 3: other_job.run_id, 4: rerun_by_hand.run_id,
        5: elastic.run_id, 6: elastic.run_id,
    }  # fmt: skip


def test_a_resumed_attempt_joins_the_checkpoints_run_for_every_opener_in_the_process(tmp_path: Path) -> None:
    earlier = _attempt(tmp_path, {})
    checkpoint = EventLog(tmp_path, environ={})  # ManifestCheckpoint's opener
    quality = EventLog(tmp_path, environ={})  # TimeToQuality's, in the same process: the same attempt
    assert (quality.attempt, quality.run_id) == (checkpoint.attempt, checkpoint.run_id) == (2, checkpoint.run_id)
    assert checkpoint.run_id != earlier.run_id
    checkpoint.join(earlier.run_id)
    quality.follow()
    assert quality.run_id == earlier.run_id
    quality.emit("progress", step=3, payload={"step": 3})
    assert runs_in(read_events(tmp_path)) == {earlier.run_id: [1, 2]}
    assert [e["event"] for e in read_run_events(tmp_path)][-2:] == ["attempt_joined", "progress"]


def test_a_log_written_before_runs_were_told_apart_reads_as_the_one_run_it_was(tmp_path: Path) -> None:
    legacy = [
        {"run_id": "old", "attempt": n, "event": name, "wall_time": 100.0 + n, "monotonic": 1.0, "step": None,
         "payload": {"pid": 1} if name == "attempt_start" else {"status": "finished"}}
        for n in (1, 2) for name in ("attempt_start", "attempt_end")
    ]  # fmt: skip
    (tmp_path / "field").mkdir()
    (tmp_path / "field" / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in legacy))
    assert runs_in(read_events(tmp_path)) == {"old": [1, 2]}
    assert len(read_run_events(tmp_path)) == 4
    with pytest.raises(UnknownRunError, match="run 'new' is not in the event log; its runs: old"):
        read_run_events(tmp_path, "new")


@pytest.mark.parametrize("callback", ["plain", "field"])
def test_with_no_logger_and_checkpoints_elsewhere_nothing_is_written_into_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, callback: str
) -> None:
    """As plain Lightning writes nothing there; the run's log is kept with its checkpoints."""
    cwd, dirpath = tmp_path / "cwd", tmp_path / "checkpoints"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    pl.seed_everything(3)
    callbacks: list[pl.Callback] = (
        [pl.callbacks.ModelCheckpoint(dirpath=dirpath)]
        if callback == "plain"
        else [ManifestCheckpoint(dirpath=dirpath), TimeToQuality(monitor="val_loss", target=-1.0)]
    )
    trainer = pl.Trainer(max_steps=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=callbacks, limit_val_batches=1, num_sanity_val_steps=0)  # fmt: skip
    trainer.fit(LoggingBoringModel())
    assert list(cwd.iterdir()) == []
    if callback == "field":
        assert read_events(dirpath)[0]["event"] == "attempt_start"
        assert (dirpath / "field" / "time_to_quality.json").is_file()


@pytest.mark.parametrize("callback", ["plain", "field"])
def test_setup_called_by_hand_writes_nothing_as_model_checkpoints_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, callback: str
) -> None:
    monkeypatch.chdir(tmp_path)
    checkpoint = pl.callbacks.ModelCheckpoint() if callback == "plain" else ManifestCheckpoint()
    checkpoint.setup(pl.Trainer(enable_progress_bar=False), BoringModel(), stage="fit")
    assert checkpoint.dirpath is not None and list(tmp_path.iterdir()) == []


def test_an_evaluation_after_training_belongs_to_the_run_it_evaluates_and_a_new_fit_starts_another(
    tmp_path: Path,
) -> None:
    """fit, then validate and test (of the in-memory model, of best_model_path) in one script: one run,
    the one the ledger shows by default, as before runs were told apart. A second fit from scratch
    in the same process is a run of its own; an evaluation of the first run's checkpoint joins it."""
    pl.seed_everything(4)
    checkpoint = ManifestCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=2)
    trainer = pl.Trainer(default_root_dir=tmp_path, max_steps=4, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=1, limit_test_batches=1,
                         num_sanity_val_steps=0, callbacks=[checkpoint])  # fmt: skip
    model = LoggingBoringModel()
    trainer.fit(model)
    trainer.validate(model, verbose=False)
    trainer.test(ckpt_path=checkpoint.best_model_path, verbose=False)
    first = runs_in(read_events(tmp_path))
    assert list(first.values()) == [[1, 2, 3]], first
    (trained,) = first
    assert goodput_ledger(read_run_events(tmp_path)).attempts[0].last_step == 4

    pl.seed_everything(5)
    again = pl.Trainer(default_root_dir=tmp_path, max_steps=2, logger=False, enable_progress_bar=False,
                       enable_model_summary=False, limit_val_batches=1, num_sanity_val_steps=0,
                       callbacks=[ManifestCheckpoint(dirpath=tmp_path / "other")])  # fmt: skip
    again.fit(LoggingBoringModel())
    evaluator = ManifestCheckpoint(dirpath=tmp_path / "ckpts")
    evaluation = pl.Trainer(default_root_dir=tmp_path, logger=False, enable_progress_bar=False,
                            limit_val_batches=1, callbacks=[evaluator])  # fmt: skip
    pl.seed_everything(4)
    evaluation.validate(LoggingBoringModel(), ckpt_path=checkpoint.best_model_path, verbose=False)
    runs = runs_in(read_events(tmp_path))
    assert runs[trained] == [1, 2, 3, 5] and len(runs) == 2, runs  # attempt 4, the second fit, is the other run


def test_the_run_directory_is_default_root_dir_unless_only_checkpoints_are_written_and_they_go_elsewhere(
    tmp_path: Path,
) -> None:
    from lightning_field.core.layout import run_directory

    root, elsewhere = tmp_path / "root", tmp_path / "ckpts"
    assert run_directory(root, has_logger=True, checkpoint_dir=elsewhere) == root  # a logger writes there
    assert run_directory(root, has_logger=False, checkpoint_dir=None) == root
    assert run_directory(root, has_logger=False, checkpoint_dir=root / "checkpoints") == root  # inside it
    assert run_directory(root, has_logger=False, checkpoint_dir=elsewhere) == elsewhere
    assert run_directory(root, has_logger=False, checkpoint_dir=f"file://{elsewhere}") == elsewhere
    assert run_directory(root, has_logger=False, checkpoint_dir="s3://bucket/ckpts") == root  # never a URL
