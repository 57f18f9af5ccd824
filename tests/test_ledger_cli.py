"""``field ledger RUN_DIR`` on the event logs of real runs: a crash loop the no-progress guard ended,
and a run SIGKILLed in the middle of a save then resumed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TESTS_DIR, run_child, run_train_job

from lightning_field.cli.main import main as field_main

pytestmark = pytest.mark.slow

JOB = TESTS_DIR / "jobs" / "no_progress_job.py"


def ledger_of(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> tuple[dict, str]:
    assert field_main(["ledger", str(run_dir), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert field_main(["ledger", str(run_dir)]) == 0
    return document, capsys.readouterr().out


def test_the_ledger_of_a_crash_loop_shows_each_attempts_redone_steps_and_no_attempt_after_the_last(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "run"
    # The failure comes after the optimizer step began: no resume point at step 22, each restart redoes 21-22.
    args = [JOB, "--root", root, "--fail-at-step", 23, "--fail-in-optimizer-step", "--no-snapshots"]
    args.append("--time-to-quality")
    codes = [run_child(args, timeout=180).returncode for _ in range(4)]
    assert codes == [1, 1, 1, 77]
    ledger, table = ledger_of(root, capsys)
    attempts = ledger["attempts"]
    assert [a["status"] for a in attempts] == ["failed", "failed", "failed", "refused"]
    assert [a["resumed_from_step"] for a in attempts] == [None, 20, 20, 20]
    assert [a["last_step"] for a in attempts] == [22, 22, 22, 20]
    assert [a["lost_steps"] for a in attempts] == [2, 2, 2, 0]
    assert [a["cut_back_to"] for a in attempts] == ["persistent", "persistent", "persistent", None]
    assert ledger["lost_steps"] == 6 and ledger["redone_steps"]["persistent"] == 6
    assert "4 attempt(s), 3 interruption(s), 6 step(s) redone (persistent 6)" in table
    last_row = table.splitlines()[-3].split()
    assert last_row[:2] == ["4", "refused"] and "no later attempt" in table.splitlines()[-3]


def test_the_ledger_of_a_run_killed_inside_a_save_counts_the_steps_redone_since_the_previous_commit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], s3_bucket: tuple[str, dict[str, str]]
) -> None:
    bucket, options = s3_bucket
    s3 = ["--ckpt-url", f"{bucket}/run/checkpoints", "--endpoint-url", options["endpoint_url"], "--max-steps", "20"]
    root = tmp_path / "run"
    # SIGKILLed after step 15's objects were uploaded, before its manifest: step 10 is the last commit.
    run_train_job(root, tmp_path / "r.pt", *s3, "--no-snapshots", "--kill-before-commit-step", "15", expect_rc=-9)
    killed, _ = ledger_of(root, capsys)
    (only,) = killed["attempts"]
    assert only["status"] == "crashed" and only["last_step"] == 15
    assert only["cut_back_to"] is None and only["lost_steps"] == 0  # no later attempt yet: nothing redone
    run_train_job(root, tmp_path / "r.pt", *s3, "--no-snapshots", "--resume")
    ledger, table = ledger_of(root, capsys)
    first, second = ledger["attempts"]
    assert (first["status"], second["status"]) == ("crashed", "finished")
    assert second["resumed_from_step"] == 10 and second["last_step"] == 20
    assert first["lost_steps"] == 5 and first["cut_back_to"] == "persistent"  # steps 11-15, trained twice
    assert second["cut_back_to"] is None and ledger["lost_steps"] == 5
    assert "5 step(s) redone (persistent 5)" in table and "no later attempt" in table
