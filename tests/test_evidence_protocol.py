"""field-evidence end to end: real child processes, real SIGKILLs, the verdict, the bundle and the gate.

Each test runs the protocol on a model importable from the current directory (as a user's would be),
so these also prove that `_target_` reaches code outside the package.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import TESTS_DIR, child_env, make_trainer, python_program

from lightning_field.cli.main import main as field_main
from lightning_field.workloads.demo import DemoDataModule, DemoRegressor

pytestmark = pytest.mark.slow  # every test here starts processes (tests/suite_budget.py)

STEPS = "evidence.steps=20"


def run_field_evidence(
    cwd: Path, *overrides: str, timeout: float = 400, parallel: bool = True
) -> tuple[int, str, dict | None]:
    bundle = cwd / "bundle"
    if parallel:  # the controls side by side: same verdicts, less wall time for the suite
        overrides = ("evidence.parallel_controls=true", *overrides)
    proc = subprocess.run(
        [python_program(), "-m", "lightning_field.cli.evidence_app", f"hydra.run.dir={cwd / 'hydra'}",
         f"evidence.bundle_dir={bundle}", *overrides],
        cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    evidence_path = bundle / "evidence.json"
    evidence = json.loads(evidence_path.read_text()) if evidence_path.is_file() else None
    return proc.returncode, out, evidence


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    """A directory holding the user's own module, as the current directory of the command."""
    shutil.copy(TESTS_DIR / "evidence_models.py", tmp_path / "evidence_models.py")
    return tmp_path


def conditions(evidence: dict) -> dict[str, bool]:
    return {c["name"]: c["passed"] for c in evidence["critical_conditions"]}


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str, dict | None]:
    """One protocol run on the demo model with its checkpoints kept, shared by the tests that only read
    it (the bundle's contents, and what `field evidence check` says about it): one run less for the suite."""
    cwd = tmp_path_factory.mktemp("demo_evidence")
    shutil.copy(TESTS_DIR / "evidence_models.py", cwd / "evidence_models.py")
    return cwd, *run_field_evidence(cwd, STEPS, "evidence.keep_checkpoints=true")


def test_demo_model_resumes_exactly_after_a_sigkill_and_the_bundle_holds_everything(
    demo_run: tuple[Path, int, str, dict | None],
) -> None:
    user_dir, rc, out, ev = demo_run
    assert rc == 0, out[-3000:]
    assert ev is not None and ev["verdict"] == "exact" and ev["gate"]["passed"]
    assert ev["reproducible_without_interruption"] is True
    assert all(conditions(ev).values())
    bundle = user_dir / "bundle"
    # machine-readable record: configuration, identity hashes, versions, hardware, date, population, limitations
    tested = ev["tested_configuration"]
    assert tested["resolved"]["model"]["_target_"] == "lightning_field.workloads.demo.DemoRegressor"
    assert tested["identity"]["config.hash"] and tested["identity"]["data.fingerprint"]
    assert ev["versions"]["torch"] and ev["hardware"]["cpu_count"] and ev["created"].startswith("20")
    assert ev["population"]["controls"] == 2 and ev["population"]["interrupted_runs"] == 1
    assert ev["population"]["steps_per_run"] == 20 and ev["population"]["records_compared"] >= 60
    assert any("CPU only" in item for item in ev["limitations"])
    # recovery cost: kill -> first new step by phase, and the work redone since the last commit
    (cost,) = ev["recovery"]
    assert cost["kill_to_first_new_step_s"] > 0 and cost["steps_recomputed"] == cost["kill_step"] - cost["resumed_step"]
    assert set(cost["phases_s"]) == {"restart_gap", "process_start", "setup_and_restore", "data_fast_forward"}
    assert cost["seconds_recomputed"] >= 0 and cost["checkpoint_load_s"] > 0
    # raw artifacts: every run's per-step log and every manifest, hashed, plus the plots
    for entry in tested["manifests"]:
        assert (bundle / entry["manifest"]).is_file()
    for run in ev["artifacts"]["runs"].values():
        assert run["traces"] and all((bundle / p).is_file() for p in run["traces"] + run["logs"])
    for plot in ("loss.png", "divergence.png"):
        assert (bundle / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (bundle / "evidence.md").read_text()
    assert "EXACT" in md and "](runs/interrupted-1/trace/rank-00000.jsonl)" in md and "manifests/" in md


def test_three_interruptions_one_of_them_inside_a_save_are_exact(user_dir: Path) -> None:
    rc, out, ev = run_field_evidence(user_dir, STEPS, "evidence.interruptions=3", "evidence.kill_mode=mixed")
    assert rc == 0, out[-3000:]
    assert ev["verdict"] == "exact" and ev["population"]["interrupted_runs"] == 3
    modes = [k["mode"] for k in ev["population"]["kills"]]
    assert modes == ["step", "save", "step"]
    saved_kill = ev["recovery"][1]
    # killed with its files written but the manifest not committed: the resume used an earlier checkpoint
    assert saved_kill["kill_mode"] == "save" and saved_kill["resumed_step"] < saved_kill["kill_step"]
    assert not any("inside a save" in item for item in ev["limitations"])
    # checkpoint tensors are not kept by default: the manifests are the artifact
    assert not (user_dir / "bundle" / "runs" / "control-1" / "checkpoints").exists()


def test_state_outside_every_state_dict_fails_naming_the_first_divergent_step(user_dir: Path) -> None:
    rc, out, ev = run_field_evidence(
        user_dir, STEPS, "model._target_=evidence_models.HiddenStateRegressor", "evidence.kill_steps=[12]"
    )
    assert rc == 1, out[-3000:]
    assert ev["verdict"] == "fail" and not ev["gate"]["passed"] and "verdict_not_fail" in ev["gate"]["failed"]
    run = ev["comparisons"][1]
    divergence = run["first_divergence"]
    assert divergence["step"] == run["resume_step"] + 1 == 11  # the first step after resuming from step 10
    assert divergence["component"] in {"loss", "weights"}
    assert "gate: FAILED" in out


def test_a_broken_rng_restore_fails_naming_rng(user_dir: Path) -> None:
    rc, out, ev = run_field_evidence(
        user_dir,
        STEPS,
        "callbacks.checkpoint._target_=evidence_models.RngForgettingCheckpoint",
        "evidence.kill_steps=[12]",
    )
    assert rc == 1, out[-3000:]
    assert ev["verdict"] == "fail"
    divergence = ev["comparisons"][1]["first_divergence"]
    assert divergence["component"] == "RNG" and divergence["step"] == 11


def test_unseeded_randomness_is_reported_as_irreproducible_without_blaming_the_resume(user_dir: Path) -> None:
    rc, out, ev = run_field_evidence(
        user_dir,
        "evidence.steps=30",
        "evidence.kill_steps=[8]",
        "model._target_=evidence_models.NondeterministicRegressor",
        parallel=False,  # the default, sequential path
    )
    assert ev is not None, out[-3000:]
    assert ev["reproducible_without_interruption"] is False
    controls = ev["comparisons"][0]
    assert controls["name"] == "control-2" and controls["first_divergence"]["step"] == 1
    assert "not reproducible even without interruption" in controls["findings"][0]
    assert controls["final"]["weights_max_abs_diff"] > 0
    interrupted = ev["comparisons"][1]
    assert interrupted["noise"]["mean_abs_loss_diff"] > 0
    assert ev["verdict"] == "within_noise" and rc == 0, interrupted["findings"]


def test_bad_settings_fail_before_any_run_with_a_message_naming_them(
    user_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, ev = run_field_evidence(user_dir, "evidence.kill_mode=sometimes")  # the command, end to end
    assert rc == 2 and "kill_mode" in out and ev is None
    # The rest in this process (each refusal comes before any run, so nothing is lost by it).
    from hydra import compose, initialize_config_dir

    from lightning_field.cli.evidence_app import run
    from lightning_field.conf import CONFIG_DIR as CONF_DIR

    for overrides, message in [
        (["+evidence.stepz=3"], "stepz"),
        (["model._target_=no_such_module.Model"], "model._target_=no_such_module.Model cannot be imported"),
        (["evidence.kill_mode=save", "evidence.kill_steps=[7]"], "kill step 7 is not a checkpoint step"),
    ]:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="field_evidence", overrides=overrides)
        assert run(cfg) == 2
        assert message in capsys.readouterr().err
    assert not (user_dir / "bundle").exists()


def test_evidence_check_accepts_a_matching_checkpoint_and_rejects_stale_or_missing_evidence(
    demo_run: tuple[Path, int, str, dict | None], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir, rc, out, ev = demo_run
    assert rc == 0 and ev is not None, out[-3000:]
    same = run_dir / "bundle" / "runs" / "control-1" / "checkpoints" / "epoch=0-step=10"
    # A copy: the last part of this test damages it, and the shared run must stay whole.
    bundle = tmp_path / "bundle"
    shutil.copytree(run_dir / "bundle", bundle)
    user_dir = tmp_path
    assert field_main(["evidence", "check", str(bundle), "--checkpoint", str(same)]) == 0
    assert "SUPPORTED" in capsys.readouterr().out

    # A checkpoint of a different configuration (a wider model, trained here): the evidence is stale for it.
    trainer = make_trainer(user_dir / "other", max_steps=2)
    trainer.fit(DemoRegressor(hidden=48), datamodule=DemoDataModule())
    stale = user_dir / "other" / "ckpts" / "epoch=0-step=2"
    assert field_main(["evidence", "check", str(bundle), "--checkpoint", str(stale)]) == 1
    printed = capsys.readouterr().out
    assert "NOT SUPPORTED" in printed and "stale, config.hash" in printed and "model.architecture_hash" in printed

    # Evidence whose raw artifacts went missing supports nothing.
    (bundle / ev["tested_configuration"]["manifests"][0]["manifest"]).unlink()
    assert field_main(["evidence", "check", str(bundle)]) == 1
    assert "evidence incomplete" in capsys.readouterr().out
    assert field_main(["evidence", "check", str(user_dir / "nowhere")]) == 1
    assert "evidence missing" in capsys.readouterr().out


def test_two_rank_ddp_run_resumes_exactly_on_every_rank(user_dir: Path) -> None:
    rc, out, ev = run_field_evidence(user_dir, "evidence.steps=16", "evidence.kill_steps=[12]", "trainer=ddp_cpu")
    assert rc == 0, out[-3000:]
    assert ev["verdict"] == "exact" and ev["population"]["world_size"] == 2
    for run in ev["artifacts"]["runs"].values():
        assert sorted(Path(p).name for p in run["traces"] if p.endswith(".jsonl")) == [
            "rank-00000.jsonl",
            "rank-00001.jsonl",
        ]
    assert not any("Single process" in item for item in ev["limitations"])
    assert ev["recovery"][0]["resumed_step"] == 10
