"""`field plan`: the method's worked example, Daly's published examples, layout, and refused inputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import TESTS_DIR, make_trainer, run_child
from lightning.pytorch.demos.boring_classes import BoringModel
from omegaconf import OmegaConf

from lightning_field.cli.main import main as field_main
from lightning_field.conf import CONFIG_DIR
from lightning_field.core.events import read_events
from lightning_field.planning.intervals import (
    DEFAULT_RESTART_SECONDS,
    FailureModel,
    choose_intervals,
    daly_interval,
    lost_work_per_failure,
)
from lightning_field.planning.launch import LaunchInputs
from lightning_field.planning.plan import PlanInputError, PlanInputs
from lightning_field.quality.ledger import goodput_ledger

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


@pytest.mark.slow
def test_from_run_takes_the_save_cost_mtbf_and_measured_flops_from_a_run_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = TESTS_DIR / "jobs" / "quality_job.py"
    # Steps of 0.1 s: with steps of microseconds the run's MTBF (a few seconds of attempts) is about its
    # restart time, and the plan it measures is refused as >= 100% waste on a loaded machine.
    args = [job, "--root", tmp_path, "--max-steps", "40", "--step-seconds", "0.1"]
    run_child([*args, "--kill-after-step", "25"])
    # Unprofiled, the run measured no FLOP/s: the plan needs the rate from the command line and says so.
    assert field_main(["plan", "--params", "1B", "--tokens", "1B", "--devices", "1", "--from-run", str(tmp_path)]) == 2
    assert "--device-tflops is required (or --from-run a run profiled by StragglerMonitor)" in capsys.readouterr().err
    assert run_child([*args, "--profile-flops-per-batch", "1e9"]).returncode == 0  # resumes, profiled
    # No --device-tflops: the useful rate the run measured is the plan's input.
    plan = plan_json(capsys, "plan", "--params", "1B", "--tokens", "1B", "--devices", "1", "--from-run", str(tmp_path))
    sources = plan["inputs"]["sources"]
    assert "median of" in sources["save_seconds"] and "1 interruption" in sources["mtbf_hours"]
    # The seconds it names are the ones the MTBF was computed over (attempts running), and the
    # elapsed time with the downtime is named as such, not passed off as training time.
    ledger = goodput_ledger(read_events(tmp_path))
    exposure = ledger.elapsed_s - ledger.idle_breakdown["downtime_between_attempts"]
    assert ledger.idle_breakdown["downtime_between_attempts"] > 0
    assert f"1 interruption(s) in {exposure:.0f} s of attempts running" in sources["mtbf_hours"]
    assert f"({ledger.elapsed_s:.0f} s elapsed" in sources["mtbf_hours"]
    assert plan["inputs"]["mtbf_hours"] == pytest.approx(exposure / 3600)
    assert "mean process start to first step" in sources["restart_seconds"]
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


BASE = ["plan", "--params", "8B", "--tokens", "10B", "--devices", "8", "--device-tflops", "100"]


@pytest.mark.parametrize(
    ("extra", "cause"),
    [
        (["--save-seconds", "1e9", "--mtbf-hours", "6"], "is as long as the best interval between saves"),
        (["--save-seconds", "60", "--mtbf-hours", "6", "--restart-seconds", "1e9"], "expected waste"),
        (["--save-seconds", "600", "--mtbf-hours", "10min"], "as long as the best interval"),
        (["--device-tflops", "inf"], "--device-tflops must be a finite number"),
        (
            ["--restart-seconds", "nan", "--save-seconds", "60", "--mtbf-hours", "6"],
            "--restart-seconds must be a finite",
        ),
        (["--restart-seconds", "-1"], "--restart-seconds must be >= 0"),
        (["--save-seconds", "0", "--mtbf-hours", "6"], "--save-seconds must be > 0"),
        (["--devices", "0"], "--devices must be >= 1"),
    ],
)
def test_input_whose_result_is_meaningless_is_refused_with_one_line(
    extra: list[str], cause: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert field_main([*BASE, *extra]) == 2
    out, err = capsys.readouterr()
    assert out == "" and cause in err and err.startswith("field plan: ") and err.count("\n") == 1


def test_a_bad_but_possible_plan_is_still_given(capsys: pytest.CaptureFixture[str]) -> None:
    figures = plan_json(capsys, *BASE, "--save-seconds", "3000", "--mtbf-hours", "6")["figures"]
    assert 0.5 < figures["expected_waste"]["value"] < 1
    assert "restart_seconds" in figures["time_to_budget"]["from"]  # the waste it divides by depends on it


def test_the_layout_is_labelled_not_checked_without_device_memory(capsys: pytest.CaptureFixture[str]) -> None:
    assert field_main(BASE) == 0
    out = capsys.readouterr().out
    assert "layout: not checked: pass --device-memory-gb" in out and "None" not in out
    assert field_main([*BASE, "--params", "400B", "--device-memory-gb", "80"]) == 0
    assert "layout: does not fit: even fully sharded" in capsys.readouterr().out


def test_field_plan_and_field_train_assume_the_same_restart_time(capsys: pytest.CaptureFixture[str]) -> None:
    train_default = OmegaConf.load(CONFIG_DIR / "field_train.yaml").plan.restart_seconds
    assert DEFAULT_RESTART_SECONDS == train_default == LaunchInputs(1, 1, 1).restart_seconds
    assert PlanInputs(1, 1, 1, 1).restart_seconds == DEFAULT_RESTART_SECONDS
    plan = plan_json(capsys, *BASE, "--save-seconds", "60", "--mtbf-hours", "6")
    assert plan["inputs"]["restart_seconds"] == DEFAULT_RESTART_SECONDS
    assert "assumed 30 s, as field-train's estimate" in plan["inputs"]["sources"]["restart_seconds"]
    given = plan_json(capsys, *BASE, "--save-seconds", "60", "--mtbf-hours", "6", "--restart-seconds", "0")
    assert given["inputs"]["restart_seconds"] == 0 and given["inputs"]["sources"]["restart_seconds"] == "command line"


def test_field_plan_shows_lost_work_and_waste_with_snapshots_beside_the_persistent_checkpoints_alone(
    capsys: pytest.CaptureFixture[str],
) -> None:
    plain = plan_json(capsys, *WORKED)["figures"]
    daly = plain["checkpoint_interval_daly"]["value"]
    assert plain["lost_work_per_failure"]["value"] == pytest.approx(lost_work_per_failure(daly, 6 * 3600))
    assert "expected_waste_with_snapshots" not in plain
    # The main job's measured figures: a 16 ms snapshot every 154 ms step, committed in line, on one node.
    figures = plan_json(capsys, *WORKED, "--snapshot-seconds", "0.016", "--snapshot-interval", "0.154")["figures"]
    model = choose_intervals(FailureModel(), 60.0, 0.016, snapshot_every_s=0.154)
    assert figures["snapshot_coverage"]["value"] == 0.22
    assert figures["snapshot_overhead"]["value"] == pytest.approx(0.016 / 0.154)
    assert figures["checkpoint_interval_with_snapshots"]["value"] == pytest.approx(
        daly_interval(60.0, 6 * 3600 / 0.78)
    )  # the persistent tier covers only the failures the snapshots do not survive
    assert figures["lost_work_per_failure_with_snapshots"]["value"] == pytest.approx(
        0.22 * lost_work_per_failure(0.154, 6 * 3600) + 0.78 * lost_work_per_failure(model.persistent_s, 6 * 3600)
    )
    assert figures["expected_waste_with_snapshots"]["value"] == pytest.approx(model.waste)
    assert figures["expected_waste_with_snapshots"]["estimate"] and figures["snapshots_pay"]["value"] is False
    assert figures["time_to_budget_with_snapshots"]["value"] > figures["time_to_budget"]["value"]
    field_main([*WORKED, "--snapshot-seconds", "0.016", "--snapshot-interval", "0.154"])
    assert "lost_work_per_failure_with_snapshots" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--snapshot-interval", "2"], "--snapshot-interval needs --snapshot-seconds"),
        (["--snapshot-seconds", "0.02", "--snapshot-coverage", "1"], "--snapshot-coverage must be a share in [0, 1)"),
        (["--snapshot-seconds", "0.02", "--step-seconds", "0"], "--step-seconds must be > 0"),
        (["--snapshot-seconds", "-1", "--snapshot-interval", "1"], "--snapshot-seconds: cannot read '-1'"),
        (["--snapshot-seconds", "0.02", "--snapshot-interval", "1", "--snapshot-commit-seconds", "-1"],
         "--snapshot-commit-seconds must be >= 0"),
        (["--snapshot-seconds", "2", "--snapshot-interval", "1"],
         "--snapshot-seconds (2 s) must be shorter than --snapshot-interval (1 s)"),
        # The run's own interval, whose saves take longer than its training between them: named as such,
        # not blamed on the snapshots (and never a negative time to the budget).
        (["--snapshot-seconds", "0.002", "--step-seconds", "0.05", "--checkpoint-every-steps", "1000"],
         "expected waste 120.25% >= 100% at the run's interval: saves of 60 s every 1000 steps of 0.05 s"
         " (50 s of training) leave no time to train"),
        (["--snapshot-seconds", "0.97", "--snapshot-interval", "1"],
         "expected waste with snapshots 104% >= 100%: snapshots of 0.97 s every 1 s beside saves of 60 s leave no"
         " time to train (check --snapshot-seconds and --snapshot-interval)"),
    ],
)  # fmt: skip
def test_bad_or_meaningless_snapshot_inputs_to_field_plan_are_refused_naming_the_flags(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert field_main([*WORKED, *extra]) == 2
    assert message in capsys.readouterr().err


def test_from_run_takes_the_snapshot_cost_and_interval_a_run_measured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_trainer(tmp_path, 8, every_n_train_steps=4, snapshot_every_n_train_steps=1,
                 snapshot_dir=tmp_path / "shm").fit(BoringModel())  # fmt: skip
    snapshots = [e for e in read_events(tmp_path) if e["event"] == "snapshot_committed"]
    assert len(snapshots) == 6 and all(e["payload"]["in_line"] for e in snapshots)  # 4 and 8 are persistent
    plan = plan_json(capsys, *BASE, "--mtbf-hours", "6", "--from-run", str(tmp_path))
    inputs = plan["inputs"]
    assert inputs["snapshot_seconds"] > 0 and inputs["snapshot_interval_seconds"] > 0
    assert inputs["snapshot_commit_seconds"] == 0.0  # committed in line: resumable at once
    assert "median over 6 step snapshots" in inputs["sources"]["snapshot_seconds"]
    # The user's interval, priced as the run took it: 22 % of failures resume from a snapshot.
    save, snapshot, every = (inputs[k] for k in ("save_seconds", "snapshot_seconds", "snapshot_interval_seconds"))
    model = choose_intervals(FailureModel(), save, snapshot, snapshot_every_s=every)
    assert plan["figures"]["lost_work_per_failure_with_snapshots"]["value"] == pytest.approx(
        0.22 * lost_work_per_failure(every, 6 * 3600) + 0.78 * lost_work_per_failure(model.persistent_s, 6 * 3600)
    )


def test_from_run_shows_the_snapshot_interval_auto_chose_and_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_trainer(tmp_path, 10, every_n_train_steps=100, snapshot_dir=tmp_path / "shm").fit(BoringModel())  # defaults
    chosen = [e["payload"] for e in read_events(tmp_path) if e["event"] == "snapshot_interval"][-1]
    assert chosen["every_n_train_steps"] is None  # a persistent save every 100 short steps: they do not pay
    plan = plan_json(capsys, *BASE, "--mtbf-hours", "6", "--from-run", str(tmp_path))
    said = plan["inputs"]["sources"]["snapshot_every_n_train_steps"]
    assert said == f"off in {tmp_path}: {chosen['reason']}"
    # "auto": the plan chooses the interval itself, from the cost the run measured.
    assert plan["inputs"]["snapshot_interval_seconds"] is None and plan["inputs"]["snapshot_seconds"] > 0
    assert field_main([*BASE, "--mtbf-hours", "6", "--from-run", str(tmp_path)]) == 0
    assert "input snapshot_every_n_train_steps: off in" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("figures", "named"),
    [
        ({"save_s": -1.0}, "the save cost must be a positive"),
        ({"persistent_s": 0.0}, "the checkpoint interval must be a positive"),
        ({"snapshot_every_s": math.inf}, "the snapshot interval must be a positive"),
        ({"snapshot_commit_s": math.nan}, "the snapshot commit must be a non-negative"),
        ({"snapshot_s": -0.1}, "the snapshot cost must be a non-negative"),
    ],
)
def test_the_cost_model_refuses_a_meaningless_figure_naming_it(figures: dict, named: str) -> None:
    good = {"save_s": 60.0, "snapshot_s": 0.016, "snapshot_commit_s": 0.0}
    with pytest.raises(ValueError, match=named):
        choose_intervals(FailureModel(), **{**good, **figures})


def test_a_non_finite_snapshot_interval_is_refused_by_its_flags_name() -> None:
    with pytest.raises(PlanInputError, match="--snapshot-interval must be a finite number"):
        PlanInputs(8e9, 1e10, 8, 100.0, snapshot_seconds=0.1, snapshot_interval_seconds=math.inf).validate()


def test_without_a_save_cost_or_mtbf_field_plan_shows_the_snapshots_overhead_alone(
    capsys: pytest.CaptureFixture[str],
) -> None:
    figures = plan_json(capsys, *BASE, "--snapshot-seconds", "0.016", "--snapshot-interval", "0.154",
                        "--snapshot-commit-seconds", "0.05")["figures"]  # fmt: skip
    assert figures["snapshot_overhead"]["value"] == pytest.approx(0.016 / 0.154)
    # The work a failure loses with them needs the persistent interval, so a save cost and an MTBF.
    assert "lost_work_per_failure_with_snapshots" not in figures and "lost_work_per_failure" not in figures
    assert "expected_waste_with_snapshots" not in figures


def test_from_run_takes_the_snapshot_cost_of_auto_snapshots_and_lets_the_plan_choose_their_interval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = tmp_path / "field" / "events.jsonl"
    events.parent.mkdir(parents=True)
    lines = [(1, "attempt_start", 0.0, None, {}), (1, "snapshot_committed", 5.0, 5, {"blocking_s": 0.02}),
             (2, "attempt_start", 20.0, None, {}), (2, "snapshot_committed", 25.0, 10, {"blocking_s": 0.02}),
             (2, "attempt_end", 30.0, 10, {"status": "finished"})]  # fmt: skip
    events.write_text("".join(
        json.dumps({"attempt": a, "event": name, "wall_time": t, "step": step, "payload": payload}) + "\n"
        for a, name, t, step, payload in lines
    ))  # fmt: skip
    plan = plan_json(capsys, *BASE, "--save-seconds", "60", "--mtbf-hours", "6", "--from-run", str(tmp_path))
    assert plan["inputs"]["snapshot_seconds"] == 0.02 and plan["inputs"]["snapshot_interval_seconds"] is None
    assert "median over 2 step snapshots" in plan["inputs"]["sources"]["snapshot_seconds"]
    chosen = choose_intervals(FailureModel(), 60.0, 0.02, snapshot_budget=0.01)
    assert chosen.snapshots_pay and plan["figures"]["snapshots_pay"]["value"] is True
    assert plan["figures"]["snapshot_interval"]["value"] == pytest.approx(chosen.snapshot_s)
    assert plan["figures"]["expected_waste_with_snapshots"]["value"] == pytest.approx(chosen.waste)
