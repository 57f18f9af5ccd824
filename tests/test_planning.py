"""`field plan`: the method's worked example, Daly's published examples, layout, and refused inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TESTS_DIR, run_child

from lightning_field.cli.main import main as field_main
from lightning_field.planning.intervals import daly_interval

WORKED = ["plan", "--params", "8B", "--tokens", "10B", "--devices", "8", "--device-tflops", "100",
          "--save-seconds", "60", "--mtbf-hours", "6", "--device-memory-gb", "80",
          "--price-per-device-hour", "2"]  # fmt: skip


def plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert field_main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_field_plan_reproduces_the_methods_worked_example(capsys: pytest.CaptureFixture[str]) -> None:
    figures = plan_json(capsys, *WORKED)["figures"]
    assert figures["total_flops"]["value"] == pytest.approx(4.8e20)
    assert figures["ideal_time"]["value"] == pytest.approx(600_000)
    assert figures["ideal_time_hours"]["value"] == pytest.approx(166.7, abs=0.05)
    assert figures["persistent_state"]["value"] == pytest.approx(128.0)
    assert figures["checkpoint_interval_young"]["value"] / 60 == pytest.approx(26.8, abs=0.05)
    # every figure names its inputs, and estimates say so
    assert figures["total_flops"]["from"] == ["params", "tokens"] and figures["total_flops"]["estimate"]
    assert figures["cost"]["value"] == pytest.approx(figures["device_hours"]["value"] * 2)
    assert figures["time_to_budget"]["value"] > figures["ideal_time"]["value"]


def test_dalys_published_examples() -> None:
    assert daly_interval(300, 24 * 3600) / 60 == pytest.approx(117, abs=0.5)
    assert daly_interval(300, 6 * 3600) / 60 == pytest.approx(57, abs=0.5)


def test_the_layout_is_the_simplest_one_whose_state_fits(capsys: pytest.CaptureFixture[str]) -> None:
    small = plan_json(capsys, "plan", "--params", "1B", "--tokens", "1B", "--devices", "8", "--device-tflops", "100",
                      "--device-memory-gb", "80")  # fmt: skip
    assert small["layout"]["recommendation"] == "ddp"
    eight_b = plan_json(capsys, *WORKED)
    assert eight_b["layout"]["recommendation"] == "zero1"  # 128 GB full; 44 GB with the optimizer sharded over 8
    huge = plan_json(capsys, "plan", "--params", "400B", "--tokens", "1T", "--devices", "8", "--device-tflops", "100",
                     "--device-memory-gb", "80", "--interconnect", "nvlink")  # fmt: skip
    assert huge["layout"]["recommendation"] == "does_not_fit" and "at least" in huge["layout"]["reason"]


def test_from_run_takes_the_save_cost_mtbf_and_measured_flops_from_a_run_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = TESTS_DIR / "jobs" / "quality_job.py"
    args = [job, "--root", tmp_path, "--max-steps", "40", "--step-seconds", "0"]
    run_child([*args, "--kill-after-step", "25"])
    # Unprofiled, the run measured no FLOP/s: the plan needs the rate from the command line and says so.
    assert field_main(["plan", "--params", "1B", "--tokens", "1B", "--devices", "1", "--from-run", str(tmp_path)]) == 2
    assert "--device-tflops is required (or --from-run a run profiled by StragglerMonitor)" in capsys.readouterr().err
    assert run_child([*args, "--profile-flops-per-batch", "1e9"]).returncode == 0  # resumes, profiled
    # No --device-tflops: the useful rate the run measured is the plan's input.
    plan = plan_json(capsys, "plan", "--params", "1B", "--tokens", "1B", "--devices", "1", "--from-run", str(tmp_path))
    sources = plan["inputs"]["sources"]
    assert "median of" in sources["save_seconds"] and "1 interruption" in sources["mtbf_hours"]
    assert plan["figures"]["checkpoint_interval_daly"]["value"] > 0
    assert "StragglerMonitor report" in sources["device_tflops"]
    reports = [json.loads(line) for line in (tmp_path / "field" / "profile" / "reports.jsonl").read_text().splitlines()]
    rates = sorted(r["throughput"]["per_rank"][0]["flops_per_s"] for r in reports)
    assert rates[0] / 1e12 <= plan["inputs"]["device_tflops"] <= rates[-1] / 1e12
    assert plan["figures"]["ideal_time"]["value"] == pytest.approx(6e18 / (plan["inputs"]["device_tflops"] * 1e12))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--price-per-device-hour", "-1"], "--price-per-device-hour must be >= 0"),
        (["--mtbf-hours", "0"], "--mtbf-hours must be > 0"),
        (["--mtbf-hours", "6 fortnights"], "unknown unit 'fortnights'"),
        (["--params", "8Q"], "unknown unit 'Q'"),
    ],
)
def test_bad_plan_inputs_are_refused_with_a_message_naming_them(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["plan", "--params", "8B", "--tokens", "10B", "--devices", "8", "--device-tflops", "100", *extra]
    assert field_main(args) == 2
    assert message in capsys.readouterr().err
