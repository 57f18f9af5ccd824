"""The W&B integration against the real wandb package in offline mode, read back from the files it wrote.

The main scenario is a real requeue: a training job SIGKILLed (with wandb's service process) a while
after a checkpoint, then started again on the same run directory. Run as a script, this module is
that job (``python tests/test_wandb.py --root DIR ...``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from conftest import run_child
from lightning.pytorch.callbacks import Callback

from lightning_field import ManifestCheckpoint, TimeToQuality, TrainingPreempted, read_events, read_manifest
from lightning_field.cli.wandb import main as wandb_cli
from lightning_field.integrations import (
    WANDB_RELPATH,
    FieldWandbLogger,
    WandbReview,
    field_summary,
    log_evidence_bundle,
    offline_segments,
    read_offline_run,
    read_wandb_identity,
)
from lightning_field.profiling import StragglerMonitor
from lightning_field.quality.ledger import BUCKETS
from lightning_field.state.secrets import is_redacted, redact
from lightning_field.workloads.demo import DemoDataModule, DemoRegressor

pytest.importorskip("wandb", reason="the optional wandb extra is not installed")

THIS = Path(__file__)
SECRET_CONFIG = {"api_key": "sk-123", "wandb": {"password": "hunter2-x"}, "optim": {"lr": 0.01}}
EVERY, KILL_AFTER, MAX_STEPS = 4, 14, 24  # commits at 4, 8, 12; killed after step 14; resumed from 12


def wandb_env(root: Path) -> dict[str, str]:
    """Offline, quiet, no git/code/system probes, every wandb folder under ``root``: no network, fast start."""
    return {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_DISABLE_CODE": "true",
        "WANDB__DISABLE_STATS": "true",
        "WANDB__DISABLE_META": "true",
        "WANDB_DIR": str(root / "wandb-default"),
        "WANDB_CONFIG_DIR": str(root / "wandb-config"),
        "WANDB_CACHE_DIR": str(root / "wandb-cache"),
        "WANDB_DATA_DIR": str(root / "wandb-data"),
        "WANDB_ARTIFACT_DIR": str(root / "wandb-artifacts"),
    }


def close_wandb() -> None:
    """Finish the run and wait for wandb's service to exit: ``wandb.finish()`` returns before the service
    has written the run's last records to the ``.wandb`` file (wandb 0.31), and these tests read it."""
    import wandb

    wandb.finish()
    wandb.teardown()


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    for key, value in wandb_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    for key in ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID", "WANDB_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    yield tmp_path
    close_wandb()


def trainer_for(root: Path, max_steps: int, logger: Any, *extra: Callback, target: float = 0.05) -> pl.Trainer:
    callbacks: list[Callback] = [
        TimeToQuality(monitor="val_loss", target=target, price_per_device_hour=2.0),
        WandbReview(),
        *extra,
        ManifestCheckpoint(dirpath=root / "ckpts", every_n_train_steps=EVERY, save_top_k=-1),
    ]
    return pl.Trainer(
        default_root_dir=root, max_steps=max_steps, accelerator="cpu", logger=logger, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, val_check_interval=EVERY, check_val_every_n_epoch=None,
        limit_val_batches=2, log_every_n_steps=1, callbacks=callbacks,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------- the job
class KillAfterStep(Callback):
    """SIGKILL this job's whole process group (wandb's service too, as a scheduler does) after a step.

    It waits 2.5 s first: a job is rarely killed the instant after a save, and wandb writes its
    buffered records every second (FieldWandbLogger's setting); what is lost is what a kill loses.
    """

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, idx: int) -> None:
        if trainer.global_step == self.step:
            time.sleep(2.5)
            os.killpg(os.getpgid(0), signal.SIGKILL)


def job() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--kill-after-step", type=int, default=None)
    args = parser.parse_args()
    pl.seed_everything(0)
    logger = FieldWandbLogger(run_dir=args.root, project="field-tests", config=SECRET_CONFIG, tags=["requeue"])
    extra = [KillAfterStep(args.kill_after_step)] if args.kill_after_step is not None else []
    trainer = trainer_for(args.root, MAX_STEPS, logger, *extra)
    trainer.fit(DemoRegressor(), datamodule=DemoDataModule(size=256), ckpt_path="last")


# ------------------------------------------------------------------------------------------ a killed and requeued job
@pytest.fixture(scope="module")
def requeued(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("requeued")
    with pytest.MonkeyPatch.context() as mp:
        for key, value in wandb_env(root.parent / f"{root.name}-wandb").items():
            mp.setenv(key, value)
        killed = run_child([THIS, "--root", root, "--kill-after-step", KILL_AFTER])
        assert killed.returncode == -signal.SIGKILL, killed.stdout[-4000:]
        resumed = run_child([THIS, "--root", root])
        assert resumed.returncode == 0, resumed.stdout[-4000:]
    segments = offline_segments(root)
    return {
        "root": root,
        "identity": json.loads((root / WANDB_RELPATH).read_text()),
        "segments": segments,
        "runs": [read_offline_run(s) for s in segments],
    }


@pytest.mark.slow
def test_a_requeued_job_continues_the_same_wandb_run_in_a_segment_of_its_own(requeued: dict[str, Any]) -> None:
    root, identity, runs = requeued["root"], requeued["identity"], requeued["runs"]
    assert [s.parent.parent.name for s in requeued["segments"]] == ["attempt-1", "attempt-2"]
    assert len({s.resolve() for s in requeued["segments"]}) == 2
    assert [r["run_id"] for r in runs] == [identity["run_id"]] * 2
    assert [s["attempt"] for s in identity["segments"]] == [1, 2]
    killed, finished = runs
    assert not killed["complete"] and finished["complete"] and finished["exit_code"] == 0
    assert killed["project"] == finished["project"] == "field-tests" and finished["tags"] == ["requeue"]
    # the segment numbers are the event log's attempt numbers
    events = [json.loads(line) for line in (root / "field" / "events.jsonl").read_text().splitlines()]
    assert sorted({e["attempt"] for e in events}) == [1, 2]


@pytest.mark.slow
def test_the_resumed_segment_continues_the_history_rows_and_the_global_step(requeued: dict[str, Any]) -> None:
    killed, finished = requeued["runs"]
    assert killed["steps"] and finished["steps"]
    assert min(finished["steps"]) > max(killed["steps"])  # merged in order, nothing to drop on sync
    assert killed["steps"] == sorted(killed["steps"]) and finished["steps"] == sorted(finished["steps"])
    killed_steps = [r["trainer/global_step"] for r in killed["history"] if "trainer/global_step" in r]
    resumed_steps = [r["trainer/global_step"] for r in finished["history"] if "trainer/global_step" in r]
    resumed_from = KILL_AFTER // EVERY * EVERY
    assert max(resumed_steps) == MAX_STEPS
    # Continued, never back to 0: the restart first runs the validation that followed the committed step
    # (val_check_interval=EVERY; its values logged, as Lightning logs a validation after a batch, under
    # the step before that batch's optimizer step), then trains from the commit on.
    val_rows = [r for r in finished["history"] if r.get("trainer/global_step") == resumed_from - 1]
    assert min(resumed_steps) == resumed_from - 1 and val_rows and all("val_loss" in r for r in val_rows)
    trained = [r["trainer/global_step"] for r in finished["history"] if "train_loss" in r]
    assert min(trained) == resumed_from
    # Lightning logs a batch under the global step before its optimizer step: the batch after the commit
    # was trained (and logged) by the killed attempt, lost, and trained again by the restart.
    redone = [[r["train_loss"] for r in run["history"] if r.get("trainer/global_step") == resumed_from and
               "train_loss" in r] for run in (killed, finished)]  # fmt: skip
    assert len(redone[0]) == len(redone[1]) == 1 and max(killed_steps) == resumed_from
    assert finished["history"][0]["field/attempt"] == 2 and killed["history"][0]["field/attempt"] == 1


@pytest.mark.slow
def test_each_commit_is_logged_as_a_manifest_artifact_when_it_happens(requeued: dict[str, Any]) -> None:
    root = requeued["root"]
    killed, finished = requeued["runs"]
    manifests = [a for a in killed["artifacts"] if a["type"] == "checkpoint-manifest"]
    # the killed attempt never reached the end of fit: these were logged at save time
    assert [a["metadata"]["step"] for a in manifests] == [4, 8, 12]
    for artifact in manifests:
        meta = artifact["metadata"]
        on_disk = read_manifest(root / "ckpts" / meta["checkpoint"])
        assert artifact["files"] == ["manifest.json"] and f"step-{meta['step']}" in artifact["aliases"]
        assert meta["recoverable"] is True and meta["missing"] == [] and meta["restore_tested"] is False
        assert meta["hash_algorithm"] == "blake3"
        assert meta["files"] == {n: {"size": e.size, "hash": e.hash, "rank": e.rank} for n, e in on_disk.files.items()}
        assert meta["config_hash"] == on_disk.provenance["config"]["hash"]
        assert meta["files_digest"].startswith("blake3:")
    resumed = [a for a in finished["artifacts"] if "resumed-from" in a["aliases"]]
    assert [a["metadata"]["step"] for a in resumed] == [12]
    later = [a["metadata"]["step"] for a in finished["artifacts"] if "resumed-from" not in a["aliases"]]
    assert later == [16, 20, 24]


@pytest.mark.slow
def test_the_summary_reports_time_to_quality_goodput_and_the_interruption(requeued: dict[str, Any]) -> None:
    summary = requeued["runs"][1]["summary"]
    quality = json.loads((requeued["root"] / "field" / "time_to_quality.json").read_text())
    assert summary["field/interruptions"] == 1 and summary["field/attempts"] == 2
    assert summary["field/lost_steps"] == KILL_AFTER - KILL_AFTER // EVERY * EVERY
    assert 0 < summary["field/goodput"] <= 1 and summary["field/goodput/lost_progress_s"] > 0
    assert {f"field/goodput/{b}_s" for b in BUCKETS} <= set(summary)
    assert sum(summary[f"field/goodput/{b}_s"] for b in BUCKETS) == pytest.approx(summary["field/elapsed_s"], rel=0.01)
    # the W&B summary is TimeToQuality's own final summary, to the digit
    assert summary["field/goodput"] == quality["goodput"]["goodput"]
    assert summary["field/target_reached"] is False and quality["reached"] is None  # 0.05: out of reach here
    for key in ("field/time_to_target_s", "field/time_to_target_device_hours", "field/time_to_target_cost"):
        assert key in summary and summary[key] is None  # present, and null: not reached, not "not measured"
    assert summary["field/cost"] == pytest.approx(summary["field/device_hours"] * 2.0)
    assert summary["field/checkpoint/step"] == MAX_STEPS and summary["field/checkpoint/recoverable"] is True


@pytest.mark.slow
def test_secrets_never_reach_wandb(requeued: dict[str, Any]) -> None:
    for run in requeued["runs"]:
        assert is_redacted(run["config"]["api_key"]) and is_redacted(run["config"]["wandb"]["password"])
        assert run["config"]["optim"] == {"lr": 0.01} and run["config"]["hidden"] == 32  # hparams logged too
    for file in (requeued["root"] / "wandb").rglob("*"):
        if file.is_file():
            data = file.read_bytes()
            assert b"sk-123" not in data and b"hunter2-x" not in data, file


@pytest.mark.slow
def test_sync_dry_run_lists_every_segment_in_attempt_order_under_one_id(
    requeued: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    root, run_id = requeued["root"], requeued["identity"]["run_id"]
    assert wandb_cli(["sync", str(root), "--project", "elsewhere", "--dry-run"]) == 0
    out = capsys.readouterr().out
    command = out.strip().splitlines()[-1].split()
    assert command[1:5] == ["-m", "wandb", "sync", "--id"] and command[5] == run_id and command.count("--id") == 1
    assert command[command.index("--project") + 1] == "elsewhere"
    assert command[-2:] == [str(s) for s in requeued["segments"]]
    assert out.index("attempt-1") < out.index("attempt-2")


def test_sync_refuses_a_run_without_identity_or_segments_with_the_problem_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert wandb_cli(["sync", str(tmp_path), "--dry-run"]) == 2
    assert "field/wandb.json not found" in capsys.readouterr().err
    (tmp_path / "field").mkdir()
    (tmp_path / "field" / "wandb.json").write_text(
        json.dumps({"format": "lightning_field.wandb/1", "run_id": "abc12345", "segments": []})
    )
    assert wandb_cli(["sync", str(tmp_path), "--dry-run"]) == 2
    assert "no offline segments of W&B run abc12345" in capsys.readouterr().err
    (tmp_path / "field" / "wandb.json").write_text("{not json")
    assert wandb_cli(["sync", str(tmp_path)]) == 2
    assert "unreadable W&B identity" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- in-process runs
def test_a_reached_target_is_reported_with_its_time_device_hours_cost_mfu_and_checkpoint_files(offline: Path) -> None:
    root = offline / "run"
    logger = FieldWandbLogger(run_dir=root, log_checkpoints=True)
    monitor = StragglerMonitor(report_interval_s=0.01, warmup_steps=1, peak_flops=1e12)
    trainer = trainer_for(root, 8, logger, monitor, target=100.0)  # reached at the first evaluation
    trainer.fit(DemoRegressor(), datamodule=DemoDataModule(size=64))
    close_wandb()
    (segment,) = offline_segments(root)
    run = read_offline_run(segment)
    summary = run["summary"]
    assert summary["field/target_reached"] is True and summary["field/target_step"] == EVERY
    assert summary["field/time_to_target_s"] > 0 and summary["field/time_to_target_device_hours"] > 0
    assert summary["field/time_to_target_cost"] == pytest.approx(summary["field/time_to_target_device_hours"] * 2)
    assert summary["field/straggler_flags"] == 0 and summary["field/straggler_flagged"] == []
    assert 0 < summary["field/mfu"] < 1
    files = [a for a in run["artifacts"] if a["type"] == "checkpoint"]
    assert [a["metadata"]["step"] for a in files] == [4, 8]
    assert sorted(files[0]["files"]) == ["manifest.json", "rank-00000.pt", "state.pt"]


class SigtermAtStep(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, idx: int) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def test_a_preempted_attempt_ends_as_preempted_in_the_segment_the_event_log_and_with_its_summaries(
    offline: Path,
) -> None:
    root = offline / "run"
    logger = FieldWandbLogger(run_dir=root)
    trainer = trainer_for(root, 12, logger, SigtermAtStep(5))
    with pytest.raises(TrainingPreempted) as stop:
        trainer.fit(DemoRegressor(), datamodule=DemoDataModule(size=64))
    close_wandb()
    assert stop.value.code == 75 and stop.value.step == 6 and stop.value.signal_name == "SIGTERM"
    assert [s["status"] for s in read_wandb_identity(root)["segments"]] == ["preempted"]  # not "failed"
    ends = [e["payload"]["status"] for e in read_events(root) if e["event"] == "attempt_end"]
    assert ends == ["preempted"]
    # Lightning calls neither on_fit_end nor teardown on this path: the summaries are written anyway.
    quality = json.loads((root / "field" / "time_to_quality.json").read_text())
    assert quality["final"] is True and quality["so_far"]["wall_s"] > 0
    summary = read_offline_run(offline_segments(root)[0])["summary"]
    assert summary["field/target_reached"] is False


@pytest.mark.slow
def test_restoring_a_checkpoint_of_another_wandb_run_warns_with_both_ids(offline: Path) -> None:
    root = offline / "run"
    first = FieldWandbLogger(run_dir=root)
    trainer_for(root, 4, first).fit(DemoRegressor(), datamodule=DemoDataModule(size=64))
    close_wandb()
    (root / WANDB_RELPATH).unlink()  # lost, so the restart gets a new identity
    second = FieldWandbLogger(run_dir=root)
    assert second.run_id != first.run_id
    with pytest.warns(UserWarning, match=rf"logged to W&B run '{first.run_id}'.*logs to '{second.run_id}'"):
        trainer_for(root, 8, second).fit(DemoRegressor(), datamodule=DemoDataModule(size=64), ckpt_path="last")


def test_hyperparameters_logged_later_are_redacted_too(offline: Path) -> None:
    logger = FieldWandbLogger(run_dir=offline / "run", config={"db": {"password": "pw-1"}}, offline=True)
    logger.log_hyperparams({"model": {"auth_token": "t0k3n-value", "tokenizer": "gpt2", "max_tokens": 128}, "width": 8})
    close_wandb()
    run = read_offline_run(offline_segments(offline / "run")[0])
    assert run["config"] == {
        "db": {"password": redact("pw-1")},
        "model": {"auth_token": redact("t0k3n-value"), "tokenizer": "gpt2", "max_tokens": 128},
        "width": 8,
    }


def test_only_global_rank_zero_creates_the_identity(offline: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for env in ({"LOCAL_RANK": "1"}, {"RANK": "3"}, {"NODE_RANK": "1", "LOCAL_RANK": "0"}):
        root = offline / "-".join(f"{k}{v}" for k, v in env.items())
        with monkeypatch.context() as mp:
            for key, value in env.items():
                mp.setenv(key, value)
            assert FieldWandbLogger(run_dir=root).run_id is None
        assert not (root / WANDB_RELPATH).exists(), env
    rank0 = FieldWandbLogger(run_dir=offline / "rank0")
    again = FieldWandbLogger(run_dir=offline / "rank0")
    assert rank0.run_id is not None and again.run_id == rank0.run_id
    with monkeypatch.context() as mp:
        mp.setenv("LOCAL_RANK", "1")
        assert FieldWandbLogger(run_dir=offline / "rank0").run_id == rank0.run_id  # other ranks read it


@pytest.mark.slow
def test_straggler_flags_from_every_attempt_reach_the_summary(requeued: dict[str, Any], tmp_path: Path) -> None:
    root = tmp_path / "copy"
    shutil.copytree(requeued["root"] / "field", root / "field")
    flag = {"rank": 1, "host": "node-b", "section": "data", "score": 0.4}
    event = {"run_id": "r", "attempt": 1, "event": "straggler", "wall_time": time.time(), "step": 9,
             "payload": {"flagged": [flag, {**flag, "score": 0.3}]}}  # fmt: skip
    with open(root / "field" / "events.jsonl", "a") as f:
        f.write(json.dumps(event) + "\n")
    summary = field_summary(root)
    assert summary["field/straggler_flags"] == 1 and summary["field/straggler_flagged"] == ["rank 1 (node-b): data"]
    assert summary["field/mfu"] is None and summary["field/interruptions"] == 1


# ---------------------------------------------------------------------------------------------- evidence and reading
def make_bundle(bundle: Path) -> None:
    from matplotlib.figure import Figure

    from lightning_field.evidence.bundle_format import FORMAT

    ckpt = bundle / "runs" / "kill-1" / "checkpoints" / "step=4"
    ckpt.mkdir(parents=True)
    (ckpt / "manifest.json").write_text("{}")
    (ckpt / "state.pt").write_bytes(b"\0" * 1024)
    for name in ("loss", "divergence"):
        fig = Figure(figsize=(2, 2))
        fig.add_subplot().plot([0, 1], [1, 0])
        fig.savefig(bundle / f"{name}.png")
    (bundle / "evidence.md").write_text("# Resume evidence\n")
    evidence = {
        "format": FORMAT, "id": "ev-2026", "created": "2026-01-01T00:00:00+00:00", "verdict": "bitwise",
        "summary": "identical to the uninterrupted control",
        "gate": {"passed": True, "failed": [], "rule": "all critical conditions"},
        "critical_conditions": [{"name": "restore_ok", "passed": True, "detail": ""}],
        "tested_configuration": {"config_hash": "c0ffee"},
    }  # fmt: skip
    (bundle / "evidence.json").write_text(json.dumps(evidence))


def test_an_evidence_bundle_is_logged_with_its_verdict_gate_and_plots(offline: Path) -> None:
    import wandb

    bundle = offline / "bundle"
    make_bundle(bundle)
    (offline / "ev").mkdir()
    run = wandb.init(project="field-tests", dir=offline / "ev")
    long_note = "x" * 100_000  # a record split over several 32 KiB blocks: the reader must join it
    run.summary["note"] = long_note
    log_evidence_bundle(run, bundle)
    close_wandb()
    logged = read_offline_run(Path(run.settings.sync_dir))
    (artifact,) = logged["artifacts"]
    assert artifact["type"] == "evidence" and artifact["name"] == "evidence-ev-2026"
    meta = artifact["metadata"]
    assert meta["verdict"] == "bitwise" and meta["gate_passed"] is True and meta["gate_failed"] == []
    assert meta["critical_conditions"] == {"restore_ok": True} and meta["config_hash"] == "c0ffee"
    assert sorted(artifact["files"]) == sorted(
        ["divergence.png", "evidence.json", "evidence.md", "loss.png", "runs/kill-1/checkpoints/step=4/manifest.json"]
    )  # the checkpoint's manifest is evidence, its state file is not
    images = {k: v for row in logged["history"] for k, v in row.items() if k.startswith("evidence/")}
    assert set(images) == {"evidence/loss", "evidence/divergence"}
    assert all(v["_type"] == "image-file" for v in images.values())
    assert logged["summary"]["field/evidence/verdict"] == "bitwise" and logged["summary"]["note"] == long_note


def test_bad_input_fails_with_the_problem_named(offline: Path) -> None:
    with pytest.raises(ValueError, match="needs run_dir"):
        FieldWandbLogger()
    with pytest.raises(ValueError, match="sets id, resume itself"):
        FieldWandbLogger(run_dir=offline, id="mine", resume="must")
    with pytest.raises(FileNotFoundError, match=r"not an evidence bundle: evidence\.json is missing"):
        log_evidence_bundle(object(), offline)
    not_a_log = offline / "run-x.wandb"
    not_a_log.write_bytes(b"hello world")
    with pytest.raises(ValueError, match="not a W&B transaction log"):
        read_offline_run(not_a_log)
    (offline / "empty").mkdir()
    with pytest.raises(ValueError, match=r"expected one \.wandb file in this run directory, found none"):
        read_offline_run(offline / "empty")
    trainer = pl.Trainer(
        default_root_dir=offline, max_steps=1, logger=False, callbacks=[WandbReview()], enable_progress_bar=False
    )
    with pytest.raises(ValueError, match="no WandbLogger"):
        trainer.fit(DemoRegressor(), datamodule=DemoDataModule(size=16))


def _record_spans(data: bytes, block: int = 32768, header: int = 7) -> list[tuple[int, int]]:
    """(offset, payload length) of every record in a .wandb log: LevelDB's log format, 7-byte record
    headers in 32 KiB blocks whose tails (under a header's size, or zero-filled) are padding."""
    spans, pos = [], header  # past the file header (":W&B", magic, version)
    while pos + header <= len(data):
        if block - pos % block < header:
            pos += block - pos % block
            continue
        length = int.from_bytes(data[pos + 4 : pos + 6], "little")
        if data[pos : pos + header] == bytes(header):
            pos += block - pos % block
            continue
        spans.append((pos, length))
        pos += header + length
    return spans


@pytest.mark.slow
def test_a_log_cut_off_by_a_kill_reads_back_up_to_the_damage(requeued: dict[str, Any], tmp_path: Path) -> None:
    source = Path(requeued["runs"][1]["path"])
    whole = read_offline_run(source)
    cut = tmp_path / source.name
    data = source.read_bytes()
    # Cut inside a record about two thirds in: a cut that happened to fall between two records
    # would be a clean (if early) end, not a tear.
    start, length = next((o, n) for o, n in _record_spans(data) if o >= len(data) * 2 // 3 and n >= 2)
    cut.write_bytes(data[: start + 7 + length // 2])
    partial = read_offline_run(cut)
    assert partial["torn"] and not whole["torn"] and not partial["complete"]
    assert 0 < len(partial["history"]) < len(whole["history"])
    assert partial["history"] == whole["history"][: len(partial["history"])]


if __name__ == "__main__":
    job()
