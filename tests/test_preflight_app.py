"""`field preflight` as users run it: a clean run passes; each seeded fault fails naming itself."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import TESTS_DIR, run_child
from hydra import compose, initialize_config_dir

from lightning_field.cli.preflight_app import run
from lightning_field.conf import CONFIG_DIR as CONF_DIR
from lightning_field.integrations.hydra_configs import register_configs

FAST = ["preflight.baseline_steps=4", "preflight.baseline_warmup_steps=1", "preflight.sample_batches=8"]
CLASSIFIER = ["experiment=demo", "model._target_=preflight_models.Classifier",
              "data._target_=preflight_models.ClassificationData", "+data.fault=none"]  # fmt: skip


def preflight(tmp_path: Path, *overrides: str) -> int:
    register_configs()
    if str(TESTS_DIR) not in sys.path:
        sys.path.insert(0, str(TESTS_DIR))
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="field_preflight", overrides=[f"paths.output_dir={tmp_path}", *FAST, *overrides])
    return run(cfg)


@pytest.mark.slow
def test_a_clean_run_passes_every_check_and_writes_its_record(tmp_path: Path) -> None:
    result = run_child(["-m", "lightning_field.cli.main", "preflight", "experiment=demo", f"paths.root_dir={tmp_path}",
                        *FAST], timeout=180, cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]
    assert "PREFLIGHT PASSED" in result.stdout and "Tiny overfit:" in result.stdout
    out = tmp_path / "outputs" / "field-preflight" / "demo" / "field" / "preflight"
    record = json.loads((out / "preflight.json").read_text())
    assert record["passed"] and record["baseline"]["steps_measured"] == 4 and record["fit"]["fits"] is True
    fit = record["fit"]
    assert fit["state_bytes"] == fit["params_bytes"] + fit["grads_bytes"] + fit["optimizer_bytes"]
    assert fit["grads_bytes"] == fit["params_bytes"] and fit["optimizer_bytes"] >= 2 * fit["params_bytes"]  # Adam m, v
    assert (out / "baseline.png").read_bytes()[:4] == b"\x89PNG"
    # The step split comes from the profiling timers, over the same measured steps.
    split = record["baseline"]["breakdown_s"]
    assert set(split) == {"data", "forward", "backward", "optimizer"}
    assert split["forward"] > 0 and split["backward"] > 0 and split["optimizer"] > 0
    assert sum(split.values()) <= 2 * record["baseline"]["step_s_p90"]
    assert "SectionTimer (perf_counter), 4 steps" in record["baseline"]["breakdown_source"]
    assert "median split: data" in result.stdout


@pytest.mark.parametrize(
    ("fault", "failed", "message"),
    [
        ("label_out_of_range", "label_range", "outside [0, 4)"),
        ("nan_input", "non_finite", "NaN"),
        ("duplicates", "leakage", "3"),
    ],
)
@pytest.mark.slow
def test_each_seeded_data_fault_fails_naming_it(
    fault: str, failed: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert preflight(tmp_path, *CLASSIFIER[:-1], f"+data.fault={fault}") == 1
    record = json.loads((tmp_path / "field" / "preflight" / "preflight.json").read_text())
    assert failed in record["failed"]
    bad = next(c for c in record["data_checks"] if c["name"] == failed and not c["passed"])
    assert message in bad["detail"]
    assert f"PREFLIGHT FAILED: {failed}" in capsys.readouterr().out


@pytest.mark.slow
def test_the_classifier_passes_clean_and_fails_the_overfit_when_its_loss_is_detached(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert preflight(tmp_path / "clean", *CLASSIFIER) == 0
    assert preflight(tmp_path / "detached", *CLASSIFIER, "+model.detach=true") == 1
    printed = capsys.readouterr().out
    assert "PREFLIGHT FAILED: tiny_overfit" in printed and "detached" in printed


@pytest.mark.parametrize(
    ("override", "message"),
    [("preflight.baseline_steps=0", "baseline_steps must be >= 1"),
     ("preflight.overfit_max_steps=0", "overfit_max_steps must be >= 1"),
     ("preflight.overfit_target_ratio=1.5", "overfit_target_ratio must be in (0, 1)")],
)  # fmt: skip
def test_a_step_budget_of_zero_or_a_bad_ratio_is_refused_before_anything_runs(
    override: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert preflight(tmp_path, "experiment=demo", override) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "field").exists()
