"""field-train as users start it: killed and rerun, under DDP, under -m, refusing what it cannot do."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import python_program, run_child

from lightning_field import read_events, read_manifest
from lightning_field.checkpoint.resolver import latest_recoverable

pytestmark = pytest.mark.slow  # every test here starts processes (tests/suite_budget.py)

APP = ["-m", "lightning_field.cli.train_app"]
QUIET = ["experiment=demo", "progress_bar=none", "trainer.enable_model_summary=false"]


def field_train(root: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    flags = [a for a in args if a.startswith("-")]  # Hydra's flags come before the overrides
    overrides = [a for a in args if not a.startswith("-")]
    return run_child([*APP, *flags, *QUIET, f"paths.root_dir={root}", *overrides], timeout=timeout, cwd=root)


def test_a_killed_run_resumes_by_itself_when_the_same_command_is_rerun_and_ends_with_a_summary(tmp_path: Path) -> None:
    killed = field_train(tmp_path, "fault.kill_at_step=25")
    assert killed.returncode == -9, killed.stdout[-3000:]
    run_dir = tmp_path / "outputs" / "field-train" / "demo"
    resume_point = latest_recoverable(run_dir / "checkpoints")
    assert read_manifest(resume_point).step < 25  # the kill came before step 25's save
    assert "starting fresh" in killed.stdout and "Plan (estimates)" in killed.stdout
    assert "badput budget" in killed.stdout and "checkpoint cadence: every 10 step(s)" in killed.stdout
    assert "fault drill: SIGKILL of this job at step 25" in killed.stdout

    # The same command again, drill included: the drill fired once in this run and is not armed again.
    resumed = field_train(tmp_path, "fault.kill_at_step=25")
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "fault.kill_at_step=25: already fired in this run" in resumed.stdout
    assert f"resuming from {resume_point}" in resumed.stdout
    assert "Time to quality (val_loss <= 0.8)" in resumed.stdout and "1 interruption(s)" in resumed.stdout
    assert f"[field-train] checkpoints: {run_dir / 'checkpoints'}" in resumed.stdout
    final = latest_recoverable(run_dir / "checkpoints")
    # The interval save at step 60 is the final state (CheckpointCadence keeps the configured 10 steps,
    # so no extra "final-step" save is needed at the end).
    assert final.name == "epoch=1-step=60" and read_manifest(final).step == 60
    attempts = {e["attempt"] for e in read_events(run_dir)}
    assert attempts == {1, 2}

    again = field_train(tmp_path)  # a requeue after the end: nothing is redone
    assert again.returncode == 0 and "resuming from" in again.stdout
    assert latest_recoverable(run_dir / "checkpoints") == final


def test_resume_false_refuses_a_run_directory_that_already_has_a_recovery_point(tmp_path: Path) -> None:
    assert field_train(tmp_path, "trainer.max_steps=10").returncode == 0
    refused = field_train(tmp_path, "resume=false")
    assert refused.returncode == 2 and "already holds the recoverable checkpoint" in refused.stdout


def test_cfg_job_prints_the_config_alone_and_trains_nothing(tmp_path: Path) -> None:
    shown = field_train(tmp_path, "--cfg=job")
    assert shown.returncode == 0 and "_target_: lightning_field.workloads.demo.DemoRegressor" in shown.stdout
    assert "Plan (estimates)" not in shown.stdout and not (tmp_path / "outputs").exists()


def test_a_multirun_of_ddp_jobs_keeps_every_rank_of_every_job_in_that_jobs_directory(tmp_path: Path) -> None:
    """Lightning #16694: ranks Lightning starts under -m would rerun the sweep elsewhere."""
    result = field_train(
        tmp_path, "-m", "seed=0,1", "trainer=ddp_cpu", "trainer.max_steps=20",
        "callbacks.straggler_monitor.report_interval_s=0.2", timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:]
    sweep = tmp_path / "multirun" / "field-train" / "demo"
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [[o for o in p.name.split(",") if o.startswith("seed=")] for p in jobs] == [["seed=0"], ["seed=1"]]
    for seed, run_dir in enumerate(jobs):
        profiles = sorted(p.name for p in (run_dir / "field" / "profile").glob("rank-*.jsonl"))
        assert profiles == ["rank-00000.jsonl", "rank-00001.jsonl"]  # rank 1 wrote here too
        manifest = read_manifest(latest_recoverable(run_dir / "checkpoints"))
        assert manifest.world_size == 2 and manifest.step == 20
        assert manifest.provenance["config"]["resolved"]["seed"] == seed
    assert not (tmp_path / "outputs").exists()  # no rank fell back to the single-run directory
    summary = json.loads((jobs[0] / "field" / "time_to_quality.json").read_text())
    assert summary["monitor"] == "val_loss"


def test_an_unimportable_model_target_is_named_before_training(tmp_path: Path) -> None:
    proc = subprocess.run(
        [python_program(), *APP, *QUIET, f"paths.root_dir={tmp_path}", "model._target_=nowhere.Model"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode != 0 and "nowhere.Model" in proc.stderr


def test_wandb_offline_keeps_one_run_across_a_kill_and_the_automatic_resume(tmp_path: Path, monkeypatch) -> None:
    from lightning_field import read_offline_run
    from lightning_field.integrations import offline_segments, read_wandb_identity

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    assert field_train(tmp_path, "logger=wandb", "fault.kill_at_step=25").returncode == -9
    resumed = field_train(tmp_path, "logger=wandb")
    assert resumed.returncode == 0, resumed.stdout[-3000:]

    run_dir = tmp_path / "outputs" / "field-train" / "demo"
    run_id = read_wandb_identity(run_dir)["run_id"]
    segments = offline_segments(run_dir)
    assert len(segments) == 2 and segments[0].parent != segments[1].parent  # one directory per attempt
    assert all(s.name.endswith(f"-{run_id}") for s in segments)  # wandb names each segment by its run id
    runs = [read_offline_run(s) for s in segments]
    # The kill may come before wandb's first flush (every second), leaving the first file without records.
    assert {r["run_id"] for r in runs} - {None} == {run_id}
    final = runs[1]
    assert final["complete"] and final["summary"]["field/target_reached"] is True
    assert final["summary"]["field/time_to_target_s"] > 0 and final["summary"]["field/interruptions"] == 1
    assert 0 < final["summary"]["field/goodput"] < 1
    manifests = [a for a in final["artifacts"] if a["type"] == "checkpoint-manifest"]
    assert manifests and all("recoverable" in a["metadata"] and "step" in a["metadata"] for a in manifests)
    assert any(a["metadata"]["step"] == 60 for a in manifests)
    assert final["config"]["model"]["_target_"] == "lightning_field.workloads.demo.DemoRegressor"


def test_an_api_key_on_the_command_line_is_in_no_file_of_the_run_directory_and_the_rerun_resumes(
    tmp_path: Path,
) -> None:
    key, token = "0123456789abcdef0123456789abcdef01234567", "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567"
    secrets = [f"+wandb_api_key={key}", f"+data_source=https://user:{token}@example.com/data", "trainer.max_steps=4"]
    first = field_train(tmp_path, *secrets)
    assert first.returncode == 0, first.stdout[-3000:]
    run_dir = tmp_path / "outputs" / "field-train" / "demo"
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert any(p.name == "overrides.yaml" for p in files) and any(p.name == "hydra.yaml" for p in files)
    holding = [str(p) for p in files if key.encode() in p.read_bytes() or token.encode() in p.read_bytes()]
    assert not holding, f"the secret is written in {holding}"
    assert "+wandb_api_key=<redacted:pbkdf2:" in (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert "max_steps: 4" in (run_dir / ".hydra" / "config.yaml").read_text()  # the rest in full

    again = field_train(tmp_path, *secrets[:2], "trainer.max_steps=6")
    assert again.returncode == 0, again.stdout[-3000:]
    assert "resuming from" in again.stdout and key not in again.stdout + first.stdout
    assert read_manifest(latest_recoverable(run_dir / "checkpoints")).step == 6
