"""``field scale``: one real study at 1, 2 and 4 gloo ranks (with a data stall on rank 1), shared by the
assertions below, plus the planning and verdict logic tested directly on synthetic numbers."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import python_program

from lightning_field.baseline.scale import (
    RankPlan,
    ScaleInputError,
    StudyConfig,
    compare_gradients,
    find_stragglers,
    max_ranks,
    plan_batches,
    plan_study,
    run_study,
    scaling_efficiency,
    verdict,
)
from lightning_field.baseline.scale_worker import ScaleRunSpec, ScaleWorkloadError, StudyData
from lightning_field.cli import scale as scale_cli

EFFECTIVE_BATCH = 32
TESTS_DIR = Path(__file__).parent


@pytest.fixture(scope="module")
def stalled_study(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("scale")
    config = StudyConfig(
        ranks=[1, 2, 4], steps=6, effective_batch=EFFECTIVE_BATCH, out_dir=out, stall_rank=1, stall_s=0.05,
        timeout_s=120,
    )  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        # The study starts its ranks from sys.executable: from the warm python (tests/warm_python.py).
        patch.setattr(sys, "executable", python_program())
        return run_study(config, cpu_count=2)


@pytest.mark.slow
def test_study_keeps_the_effective_batch_constant_at_every_rank_count(stalled_study: dict[str, Any]) -> None:
    runs = stalled_study["runs"]
    assert [r["ranks"] for r in runs] == [1, 2, 4]
    for r in runs:
        assert r["ranks"] * r["per_rank_batch"] * r["accumulation"] == EFFECTIVE_BATCH
        assert r["measured_samples_per_step"] == EFFECTIVE_BATCH  # counted from the batches the ranks really read
        assert r["steps_to_target"] == runs[0]["steps_to_target"]
    assert [r["per_rank_batch"] for r in runs] == [32, 16, 8]


@pytest.mark.slow
def test_step_one_gradients_match_the_one_rank_gradient_within_tolerance(stalled_study: dict[str, Any]) -> None:
    for r in stalled_study["runs"][1:]:
        assert r["same_first_step_samples"]
        g = r["gradient"]
        assert g["passed"], g
        assert g["max_rel"] <= stalled_study["config"]["tolerance"]
    assert stalled_study["runs"][0]["gradient"] is None  # the reference


@pytest.mark.slow
def test_throughput_efficiency_and_breakdown_are_reported_for_each_rank_count(stalled_study: dict[str, Any]) -> None:
    for r in stalled_study["runs"]:
        assert r["throughput_samples_s"] > 0
        assert r["efficiency"] == pytest.approx(
            r["throughput_samples_s"] / (r["ranks"] * stalled_study["runs"][0]["throughput_samples_s"])
        )
        assert set(r["breakdown_s"]) == {"data_s", "compute_s", "comm_s"}
        assert all(row["comm_measured"] for row in r["per_rank"])  # the bucket timer saw every timed step
    assert stalled_study["runs"][0]["efficiency"] == pytest.approx(1.0)
    for name in ("scale.json", "scale.md", "scale.png"):
        assert Path(stalled_study["records"][name.split(".")[1]]).stat().st_size > 0


@pytest.mark.slow
def test_data_stall_on_one_rank_makes_the_verdict_name_data_and_that_rank(stalled_study: dict[str, Any]) -> None:
    v = stalled_study["verdict"]
    assert v["decision"] == "fix data first"
    assert v["bottleneck"] == "data" and v["straggler_rank"] == 1
    assert "rank 1" in v["message"]
    two = stalled_study["runs"][1]
    assert two["per_rank"][1]["data_s"] >= 0.04  # the injected 50 ms per batch, measured


@pytest.mark.slow
def test_the_builtin_workload_comes_from_the_shipped_configs_and_is_recorded(stalled_study: dict[str, Any]) -> None:
    assert stalled_study["workload"]["model"]["_target_"] == "lightning_field.workloads.demo.DemoRegressor"
    assert stalled_study["workload"]["data"]["_target_"].endswith("ExactRegressionData")
    assert stalled_study["dropout_modules_disabled"] == 0  # its dropout is configured at 0 already


@pytest.mark.slow
def test_a_users_own_module_is_studied_and_a_step_drawing_random_numbers_fails_saying_why(tmp_path: Path) -> None:
    # Run the way a user runs it: from the directory holding their module, named by _target_.
    out = tmp_path / "study"
    argv = [
        python_program(), "-m", "lightning_field.cli.main", "scale", "--ranks", "1,2", "--steps", "3",
        "--effective-batch", "16", "--out", str(out), "--json",
        "model._target_=preflight_models.NoisyStepClassifier", "data._target_=preflight_models.ClassificationData",
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=TESTS_DIR, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((out / "scale.json").read_text())
    assert record["workload"]["model"]["_target_"] == "preflight_models.NoisyStepClassifier"
    two = record["runs"][1]
    assert two["same_first_step_samples"] and two["per_rank_batch"] == 8
    assert not two["gradient"]["passed"] and "draws random numbers" in two["gradient"]["reason"]
    assert record["verdict"]["decision"] == "fix gradients first"


def test_flags_win_over_scale_overrides_and_paths_need_no_hydra_quoting(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    scale_cli.add_parser(parser.add_subparsers(dest="command"))
    out = tmp_path / "a dir=with, odd characters"
    args = parser.parse_args(["scale", "--steps", "9", "--out", str(out), "scale.steps=7", "scale.warmup_steps=1"])
    config = scale_cli.study_config(args)
    assert (config.steps, config.warmup_steps, config.out_dir) == (9, 1, out)
    assert config.stall_s == 0.0  # no stall without a stalled rank, whatever the default seconds


def test_a_dataset_too_small_for_the_study_is_refused_naming_both_numbers() -> None:
    from preflight_models import ClassificationData

    spec = ScaleRunSpec(out_dir="unused", ranks=2, per_rank_batch=8, accumulation=1, steps=10)
    with pytest.raises(ScaleWorkloadError, match="has 64 samples; 10 steps at effective batch 16 need 160"):
        StudyData(ClassificationData(size=64), spec).setup("fit")


# ------------------------------------------------------------------------------------- bad input
def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    scale_cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["scale", *argv])
    return args.func(args)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--ranks", "1,3", "--effective-batch", "32"], ["32", "not divisible", "3 ranks"]),
        (["--ranks", "1,2", "--steps", "0"], ["--steps 0", "step budget"]),
        (["--ranks", "1,1000"], ["1000", "exceeds what this machine can run", "ranks per CPU core"]),
        (["--ranks", "1,two"], ["'two'", "positive integer"]),
        (["--ranks", "1,-2"], ["'-2'", "positive integer"]),
        (["--ranks", "1,2", "scale.no_such_setting=1"], ["no_such_setting"]),
        (["--ranks", "1,2", "--stall-rank", "1", "--stall-s", "-1"], ["--stall-s -1", ">= 0"]),
        (["--ranks", "1,2", "--stall-rank", "2"], ["--stall-rank 2", "no such rank", "0..1"]),
        (["model._target_=null"], ["model", "_target_"]),
    ],
)
def test_bad_input_exits_2_naming_the_problem_before_any_process_starts(
    argv: list[str], words: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_process(*args: object, **kwargs: object) -> None:
        raise AssertionError("a process was started for bad input")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    assert _cli(argv) == 2
    err = capsys.readouterr().err
    for word in words:
        assert word in err, err


# ------------------------------------------------------------------------------------- pure functions
def test_accumulation_takes_over_when_the_per_rank_batch_would_exceed_its_cap() -> None:
    assert plan_batches(32, 1, max_rank_batch=8) == RankPlan(1, 8, 4)
    assert plan_batches(32, 2, max_rank_batch=8) == RankPlan(2, 8, 2)
    assert plan_batches(32, 4, max_rank_batch=8) == RankPlan(4, 8, 1)
    assert all(p.effective_batch == 32 for p in plan_study([1, 2, 4], 5, 32, max_rank_batch=8, cpu_count=2))


def test_rank_limit_is_two_per_cpu_core() -> None:
    assert max_ranks(2) == 4
    plan_study([1, 4], 1, 32, cpu_count=2)
    with pytest.raises(ScaleInputError, match="8 exceeds"):
        plan_study([1, 8], 1, 32, cpu_count=2)


def test_efficiency_is_throughput_over_n_times_the_single_rank_throughput() -> None:
    assert scaling_efficiency(180.0, 2, 100.0) == pytest.approx(0.9)
    assert scaling_efficiency(100.0, 4, 100.0) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        scaling_efficiency(1.0, 2, 0.0)


def test_gradient_comparison_passes_reduction_noise_and_fails_a_real_difference() -> None:
    g = torch.linspace(-1, 1, 100)
    assert compare_gradients(g, g + 1e-7, 1e-5)["passed"]
    off = compare_gradients(g, g * 1.01, 1e-5)
    assert not off["passed"] and off["max_abs"] == pytest.approx(0.01, rel=1e-3)
    assert not compare_gradients(g, g[:50], 1e-5)["passed"]


def _run(ranks: int, eff: float, shares: dict[str, float], step_ms: float = 10.0, **extra: Any) -> dict[str, Any]:
    return {
        "ranks": ranks, "efficiency": eff, "shares": shares, "stragglers": [], "gradient": None,
        "breakdown_s": {f"{k}_s": v * step_ms / 1e3 for k, v in shares.items()}, **extra,
    }  # fmt: skip


def test_verdict_adds_devices_only_when_efficient_without_stragglers() -> None:
    ok = {"passed": True, "max_rel": 0.0, "tolerance": 1e-5}
    base = _run(1, 1.0, {"data": 0.1, "compute": 0.85, "comm": 0.05})
    good = _run(4, 0.85, {"data": 0.1, "compute": 0.75, "comm": 0.15}, gradient=ok)
    assert verdict([base, good], 0.7, cpu_count=8)["decision"] == "add devices"
    comm = _run(4, 0.4, {"data": 0.05, "compute": 0.45, "comm": 0.5}, gradient=ok)
    v = verdict([base, comm], 0.7, cpu_count=8)
    assert v["decision"] == "fix communication first" and "5% at 1 rank -> 50% at 4" in v["message"]
    slow = _run(4, 0.9, {"data": 0.1, "compute": 0.8, "comm": 0.1}, gradient=ok)
    slow["stragglers"] = [{"rank": 3, "section": "compute", "own_s": 0.02, "peers_s": 0.005}]
    v = verdict([base, slow], 0.7, cpu_count=8)
    assert v["decision"] == "fix compute first" and v["straggler_rank"] == 3
    bad = _run(4, 0.9, {"data": 0.1, "compute": 0.8, "comm": 0.1}, gradient={**ok, "passed": False, "max_rel": 1e-2})
    assert verdict([base, bad], 0.7, cpu_count=8)["decision"] == "fix gradients first"


def test_straggler_needs_a_large_ratio_and_a_share_of_the_step() -> None:
    rows = [
        {"rank": r, "wall_s": 0.06, "data_s": d, "compute_s": 0.005, "comm_s": 0.0} for r, d in enumerate([0.001, 0.05])
    ]
    assert [(f["rank"], f["section"]) for f in find_stragglers(rows)] == [(1, "data")]
    tiny = [{**row, "data_s": 0.001 if row["rank"] == 0 else 0.003} for row in rows]  # 3x, but 2 ms of 60
    assert find_stragglers(tiny) == []
