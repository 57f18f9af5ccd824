"""One cost model for both tiers: the snapshot and persistent intervals chosen together (multi-level
Young/Daly), snapshots only where they pay, and the same numbers in the run's log, CheckpointCadence's
decision and ``field plan --from-run``."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from conftest import run_child

from lightning_field import FailureModel, read_events
from lightning_field.cli.main import main as field_main
from lightning_field.planning.intervals import (
    choose_intervals,
    daly_interval,
    lost_work_per_failure,
    snapshot_interval_s,
)

M = 6 * 3600.0  # the seed's MTBF
SEED = ["plan", "--params", "8B", "--tokens", "10B", "--devices", "8", "--device-tflops", "100",
        "--save-seconds", "60", "--mtbf-hours", "6"]  # fmt: skip


def ell(interval_s: float) -> float:
    """The mean work since the last save when a failure comes at random: τ/2 to first order."""
    return lost_work_per_failure(interval_s, M)


def test_the_work_a_failure_redoes_is_half_an_interval_to_first_order_and_never_more_than_the_mtbf() -> None:
    assert ell(60.0) == pytest.approx(30.0, rel=1e-3) and ell(60.0) < 30.0
    assert ell(1570.0) == pytest.approx(1570 / 2 - 1570**2 / (12 * M), rel=1e-4)  # the next term
    assert ell(100 * M) == pytest.approx(M) and ell(math.inf) == M  # a run that never saves loses M
    assert lost_work_per_failure(1570.0) == 785.0  # without an MTBF: Young's and Daly's τ/2
    with pytest.raises(ValueError, match="the checkpoint interval"):
        lost_work_per_failure(math.nan, M)


def test_each_tier_is_the_one_tier_problem_of_the_failures_it_covers() -> None:
    failures = FailureModel(snapshot_coverage=0.5)
    tiers = choose_intervals(failures, 60.0, 1.0)
    assert tiers.coverage == 0.5 and tiers.snapshots_pay
    assert tiers.snapshot_s == pytest.approx(daly_interval(1.0, M / 0.5))  # failures every 12 h for them
    assert tiers.persistent_s == pytest.approx(daly_interval(60.0, M / 0.5))  # and every 12 h for the others
    lost = 0.5 * ell(tiers.snapshot_s) + 0.5 * ell(tiers.persistent_s)
    assert tiers.lost_per_failure_s == pytest.approx(lost)
    assert tiers.waste == pytest.approx(60 / tiers.persistent_s + 1 / tiers.snapshot_s + (lost + 30) / M)
    # Persistent checkpoints alone: Daly's interval for every failure, half of it lost to each.
    assert tiers.persistent_alone_s == pytest.approx(daly_interval(60.0, M))
    assert tiers.lost_alone_s == pytest.approx(ell(tiers.persistent_alone_s))
    assert tiers.waste_alone == pytest.approx(60 / tiers.persistent_alone_s + (tiers.lost_alone_s + 30) / M)
    assert tiers.waste_change == pytest.approx(tiers.waste - tiers.waste_alone)


@pytest.mark.parametrize(("snapshot_s", "pays"), [(0.016, True), (1.0, True), (5.0, False), (60.0, False)])
def test_snapshots_pay_where_they_are_cheap_against_the_persistent_save_and_not_where_they_are_not(
    snapshot_s: float, pays: bool
) -> None:
    tiers = choose_intervals(FailureModel(), 60.0, snapshot_s)  # one node: 22 % of failures
    assert tiers.snapshots_pay is pays
    assert (tiers.waste_change or 0.0) < 0 if pays else (tiers.waste_change or 0.0) >= 0
    if not pays:  # off: the persistent interval and the waste are those of persistent checkpoints alone
        assert tiers.snapshot_s is None and tiers.persistent_s == tiers.persistent_alone_s
        assert tiers.waste == tiers.waste_alone


def test_snapshots_that_survive_no_failure_never_pay_and_a_user_interval_is_priced_as_given() -> None:
    never = choose_intervals(FailureModel(snapshot_coverage=0.0), 60.0, 0.001)
    assert not never.snapshots_pay and math.isinf(snapshot_interval_s(FailureModel(snapshot_coverage=0.0), 0.001))
    given = choose_intervals(FailureModel(), 60.0, 0.016, snapshot_every_s=0.154)  # the user's, every step
    assert given.snapshot_s == 0.154 and given.waste_change is not None and given.waste_change > 0
    assert given.snapshots_on and not given.snapshots_pay  # on, as asked, and said not to pay


@pytest.mark.parametrize(
    ("options", "named"),
    [({"mtbf_hours": 0}, "mtbf_hours"), ({"restart_seconds": -1}, "restart_seconds"),
     ({"snapshot_coverage": 1.0}, "snapshot_coverage"), ({"formula": "guess"}, "formula")],
)  # fmt: skip
def test_a_failure_model_out_of_range_is_refused_naming_the_setting(options: dict, named: str) -> None:
    with pytest.raises(ValueError, match=f"FailureModel {named}"):
        FailureModel(**options)


def plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert field_main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_seed_scenarios_table_in_the_docs_is_what_field_plan_prints(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/plan.md's table: 8B on 8 devices, a 60 s persistent save, a 6 h MTBF, a 1 s snapshot."""
    table = (Path(__file__).parents[1] / "docs" / "plan.md").read_text()
    rows = {
        "persistent checkpoints alone": plan_json(capsys, *SEED)["figures"],
        "with snapshots, one node (8 devices)": plan_json(capsys, *SEED, "--snapshot-seconds", "1")["figures"],
        "with snapshots, 8 nodes (a partner's replica)": plan_json(
            capsys, *SEED, "--snapshot-seconds", "1", "--devices-per-node", "1"
        )["figures"],
    }
    for label, figures in rows.items():
        with_ = "expected_waste_with_snapshots" in figures
        persistent = figures["checkpoint_interval_with_snapshots" if with_ else "checkpoint_interval_daly"]["value"]
        lost = figures["lost_work_per_failure_with_snapshots" if with_ else "lost_work_per_failure"]["value"]
        waste = figures["expected_waste_with_snapshots" if with_ else "expected_waste"]["value"]
        snapshot = f"{figures['snapshot_interval']['value']:.0f} s" if with_ else "none"
        row = f"| {label} | {snapshot} | {persistent:.0f} s | {lost:.0f} s | {100 * waste:.2f} % |"
        assert row in table, f"docs/plan.md lacks the row {row!r}"


@pytest.mark.slow
def test_the_main_jobs_log_field_plan_from_run_and_the_cadence_agree_on_the_intervals_and_the_waste(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = run_child(
        ["-m", "lightning_field.cli.train_app", "experiment=demo", "progress_bar=none",
         "trainer.enable_model_summary=false", f"paths.root_dir={tmp_path}"],
        timeout=180, cwd=tmp_path,
    )  # fmt: skip
    assert job.returncode == 0, job.stdout[-3000:]
    run_dir = tmp_path / "outputs" / "field-train" / "demo"
    decisions = [e["payload"] for e in read_events(run_dir) if e["event"] == "cadence"]
    decision = decisions[-1]
    if decision["predicted_waste"] >= 1:
        # A loaded machine can stretch the demo's 25 ms save past its 10 steps of training: the cadence
        # prints that waste, and the plan of the same run refuses it by the same figure.
        assert field_main([*SEED[:9], "--from-run", str(run_dir)]) == 2
        said = f"expected waste {decision['predicted_waste']:.2%} >= 100% at the run's interval"
        assert said in capsys.readouterr().err and f"predicted waste {decision['predicted_waste']:.2%}" in (
            decision["reason"]
        )
        return
    plan = plan_json(capsys, *SEED[:9], "--from-run", str(run_dir))  # the run's own figures, no flags
    figures, inputs = plan["figures"], plan["inputs"]
    assert inputs["save_seconds"] == decision["save_s"] and inputs["step_seconds"] == decision["step_s"]
    assert inputs["mtbf_hours"] == pytest.approx(decision["mtbf_s"] / 3600)
    pays = bool(decision["snapshots_pay"])
    persistent = figures["checkpoint_interval_with_snapshots" if pays else "checkpoint_interval_daly"]["value"]
    assert persistent == pytest.approx(decision["interval_s"])
    assert figures["checkpoint_interval_steps"]["value"] == decision["steps"]
    assert figures["expected_waste"]["value"] == pytest.approx(decision["predicted_waste"])
    assert figures["lost_work_per_failure"]["value"] == pytest.approx(decision["lost_per_failure_s"])
    assert figures["snapshots_pay"]["value"] is pays
    if pays:
        assert figures["snapshot_interval_steps"]["value"] == decision["snapshot_every_steps"]
        waste = figures["expected_waste_with_snapshots"]["value"]
        assert waste == pytest.approx(decision["predicted_waste_with_snapshots"])
    # The log prints each decision's sentence (a hold once per fit), which says the plan's numbers.
    said = [line for line in job.stdout.splitlines() if line.startswith("CheckpointCadence:")]
    assert said and set(said) <= {d["reason"] for d in decisions}
    assert f"predicted waste {figures['expected_waste']['value']:.2%}" in decision["reason"]
    assert re.search(rf"(kept at|to) {figures['checkpoint_interval_steps']['value']} steps", decision["reason"])
