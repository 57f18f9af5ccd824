"""The examples run as a user runs them, at toy size: the main job and the seed sweep."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import run_child

from lightning_field import read_manifest
from lightning_field.checkpoint.resolver import latest_recoverable

pytestmark = pytest.mark.slow  # every test here starts processes (tests/suite_budget.py)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_the_main_job_is_killed_resumes_by_itself_reaches_its_target_and_passes_the_evidence_gate(tmp_path: Path):
    result = run_child([EXAMPLES / "main_job.py", "--tiny", "--root", tmp_path, "progress_bar=none"], timeout=400)
    assert result.returncode == 0, result.stdout[-5000:]
    out = result.stdout
    assert "killed by SIGKILL after step 25" in out and "resuming from" in out
    assert "reached at step" in out and "1 interruption(s)" in out
    assert "[field-evidence] gate: PASSED" in out and "evidence gate: passed" in out
    # The work lost is bounded by the interval in force at the kill: the default step snapshots' where
    # they pay, else the persistent checkpoints' (every 10 steps); the summary says which and why.
    lost = int(re.search(r"interruption\(s\), (\d+) step\(s\) lost", out).group(1))
    said = re.search(r"snapshots at the kill: (off|every (\d+) step\(s\)) \(auto[^)]*\): a snapshot costs", out)
    assert said is not None, out[-3000:]
    assert lost <= (10 if said.group(1) == "off" else int(said.group(2))), out[-3000:]
    run_dir = tmp_path / "outputs" / "field-train" / "main_job"
    assert read_manifest(latest_recoverable(run_dir / "checkpoints")).step == 40
    assert (run_dir / "field" / "evidence" / "char_gpt_tiny" / "evidence.json").is_file()


def test_the_seed_sweep_reports_time_to_quality_per_seed_and_its_spread(tmp_path: Path) -> None:
    result = run_child([EXAMPLES / "seed_sweep.py", "--tiny", "--seeds", "0,1", "--root", tmp_path,
                        "progress_bar=none"], timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:]
    assert "Time to quality over 2 seed(s)" in result.stdout
    assert "seed 0: step" in result.stdout and "seed 1: step" in result.stdout
    assert "seconds to target: mean" in result.stdout and "2/2 seed(s) reached the target" in result.stdout
