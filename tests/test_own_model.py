"""A user's own LightningModule and DataModule in every app, run from the console scripts as the
docs/hydra.md shows (``examples/own_model``): their constructors share no key with the shipped models,
and bad command lines are refused with exit 2 before anything starts."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import child_env, python_program

from lightning_field import latest_recoverable

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "own_model" / "my_project.py"
BIN = Path(sys.executable).parent
OWN = ["model._target_=my_project.MyModule", "data._target_=my_project.MyData"]
BROKEN = '''
from my_project import MyModule


class OpenModule(MyModule):
    def __init__(self, width: int = 16, **options: float) -> None:
        super().__init__(width=width)
        self.options = options


class BrokenModule(MyModule):
    def training_step(self, batch, batch_idx):
        raise RuntimeError("my model is broken at step 0")
'''


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A directory holding only the user's code, as they would run the apps from it."""
    shutil.copy(EXAMPLE, tmp_path / EXAMPLE.name)
    (tmp_path / "broken.py").write_text(BROKEN)
    return tmp_path


def console(project: Path, script: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """The installed console script, run by the warm python (its file, arguments, working directory and
    environment as a user's shell gives them). The README's own blocks and a fresh venv run them from
    cold interpreters (tests/test_docs.py, tests/test_library_mode.py)."""
    command = [python_program(), str(BIN / script), *args]
    return subprocess.run(command, cwd=project, env=child_env(), capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    ("script", "args", "named"),
    [
        ("field-train", [*OWN, "model.widht=3"], "model.widht: MyModule takes no argument 'widht'"),
        ("field-evidence", [*OWN, "evidence.kill_steps=[3]"], "kill step 3 comes before the first checkpoint"),
        ("field", ["preflight", *OWN, "data.batch_size=big"], "data.batch_size: Value 'big'"),
        ("field", ["scale", "--ranks", "1,2", "experiment=nope"], "Could not find 'experiment/nope'"),
    ],
)
@pytest.mark.slow
def test_an_unusable_command_line_exits_2_with_the_cause_in_one_line_before_anything_starts(
    project: Path, script: str, args: list[str], named: str
) -> None:
    started = time.monotonic()
    run = console(project, script, *args, timeout=60)
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
    assert named in run.stderr and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert not (project / "outputs").exists() and not (project / "runs").exists(), "something was started"
    assert time.monotonic() - started < 30


@pytest.mark.parametrize(
    ("config_name", "args", "named"),
    [
        ("field_train", [*OWN, "model.width=abc"], "model.width: Value 'abc' of type 'str' could not be converted"),
        ("field_train", ["experiment=nope"], "Available options in 'experiment': char_gpt, char_gpt_tiny, demo"),
        ("field_train", ["model.hiddn=3"], "model.hiddn: no such key; model has _target_, vocab_size"),
        ("field_train", ["model._target_=my_project.Nope"], "model._target_=my_project.Nope cannot be imported"),
        ("field_train", [*OWN, "fault.kill_at_step=soon"], "fault.kill_at_step must be a step number"),
        ("field_evidence", ["model._target_=my_project.MyModule", "+model.depth=2"], "takes no argument 'depth'"),
        ("field_evidence", [*OWN, "evidence.kill_steps=[3]"], "comes before the first checkpoint (step 5"),
    ],
)
def test_each_apps_pre_launch_check_names_the_problem(
    project: Path, monkeypatch: pytest.MonkeyPatch, config_name: str, args: list[str], named: str
) -> None:
    """The same checks the console scripts run before Hydra starts (one console run each is above)."""
    from lightning_field.cli import evidence_app, train_app
    from lightning_field.cli.hydra_app import composition_problem
    from lightning_field.integrations.hydra_configs import prepare_target_overrides

    monkeypatch.syspath_prepend(str(project))
    validate = {"field_train": train_app.validate, "field_evidence": evidence_app.validate}[config_name]
    problem = composition_problem(config_name, prepare_target_overrides(args), validate)
    assert problem is not None and named in problem and "\n" not in problem, problem


def test_a_class_whose_own_constructor_takes_kwargs_accepts_keys_outside_its_signature(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning_field.cli.hydra_app import composition_problem
    from lightning_field.conf import compose_config
    from lightning_field.integrations.hydra_configs import apply_target_swaps, prepare_target_overrides

    monkeypatch.syspath_prepend(str(project))
    args = prepare_target_overrides(["model._target_=broken.OpenModule", "model.momentum=0.5", "model.width=4"])
    assert composition_problem("field_train", args) is None
    model = apply_target_swaps(compose_config("field_train", args), args).model
    assert dict(model) == {"_target_": "broken.OpenModule", "width": 4, "momentum": 0.5}


@pytest.mark.slow
def test_a_failing_user_module_puts_its_error_on_the_console_and_stops_after_the_first_control(
    project: Path,
) -> None:
    run = console(project, "field-evidence", "model._target_=broken.BrokenModule", "data._target_=my_project.MyData",
                  "evidence.steps=20")  # fmt: skip
    assert run.returncode == 1, run.stdout[-4000:]
    assert "RuntimeError: my model is broken at step 0" in run.stdout
    assert "control-2" not in run.stdout.split("remaining runs are not started")[0]
    bundle = next(project.glob("outputs/field-evidence/*/field/evidence/*/evidence.json"))
    conditions = {c["name"]: c for c in json.loads(bundle.read_text())["critical_conditions"]}
    # Nothing passes over zero items.
    for name in ("interruptions_were_real", "checkpoints_intact", "interrupted_runs_completed"):
        assert not conditions[name]["passed"], conditions[name]
    # field scale, too, ends with the rank's own error, not its own traceback.
    scale = console(project, "field", "scale", "--ranks", "1,2", "--steps", "4", "model._target_=broken.BrokenModule",
                    "data._target_=my_project.MyData")  # fmt: skip
    assert scale.returncode == 1 and "the 1-rank run exited 1" in scale.stderr, scale.stderr[-2000:]
    assert scale.stderr.rstrip().endswith("RuntimeError: my model is broken at step 0")
    assert not scale.stderr.startswith("Traceback")


@pytest.mark.slow
def test_field_preflight_and_field_scale_run_the_users_module(project: Path) -> None:
    preflight = console(project, "field", "preflight", *OWN)
    assert preflight.returncode == 0 and "PREFLIGHT PASSED" in preflight.stdout, preflight.stdout[-3000:]
    scale = console(project, "field", "scale", "--ranks", "1,2", "--steps", "6", *OWN, "model.width=8")
    assert scale.returncode == 0, scale.stdout[-3000:] + scale.stderr[-3000:]
    assert "Workload: my_project.MyModule on my_project.MyData" in scale.stdout
    assert "PASS" in scale.stdout  # the 2-rank gradients equal the 1-rank reference


def _git(project: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=user@example.com", "-c", "user.name=user", *args], cwd=project,
                   check=True, capture_output=True)  # fmt: skip


# Keep every checkpoint, and drill every second one, so a restore-tested checkpoint remains.
DOCUMENTED_TRAIN = [*OWN, "run_name=mine", "trainer.max_steps=20", "progress_bar=none",
                    "callbacks.checkpoint.every_n_train_steps=5", "callbacks.checkpoint.save_top_k=-1",
                    "callbacks.restore_drill.every_n_checkpoints=2"]  # fmt: skip


@dataclass(frozen=True)
class DocumentedFlow:
    """The README's flow, run once from the console scripts in the user's git repository: the later
    steps (record, a changed model) each take it from here."""

    project: Path
    run_dir: Path
    bundle: Path
    checkpoint: Path
    evidence_stdout: str


@pytest.fixture(scope="module")
def documented_flow(tmp_path_factory: pytest.TempPathFactory) -> DocumentedFlow:
    project = tmp_path_factory.mktemp("documented")
    shutil.copy(EXAMPLE, project / EXAMPLE.name)
    (project / ".gitignore").write_text("outputs/\n")
    _git(project, "init", "-q")
    _git(project, "add", ".")
    _git(project, "commit", "-qm", "my project")
    trained = console(project, "field-train", *DOCUMENTED_TRAIN)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    evidence = console(project, "field-evidence", *OWN, "evidence.steps=20")  # the user's module
    assert evidence.returncode == 0, evidence.stdout[-3000:]
    run_dir = project / "outputs" / "field-train" / "mine"
    checkpoint = latest_recoverable(run_dir / "checkpoints")
    assert checkpoint is not None
    bundle = next(project.glob("outputs/field-evidence/*/field/evidence/*"))
    return DocumentedFlow(project, run_dir, bundle, Path(checkpoint), evidence.stdout)


@pytest.mark.slow
def test_the_documented_flow_from_the_console_scripts_in_a_git_repository_trains_the_users_module_exactly(
    documented_flow: DocumentedFlow,
) -> None:
    flow = documented_flow
    config = yaml.safe_load((flow.run_dir / ".hydra" / "config.yaml").read_text())
    # Exactly the class's signature, its own defaults: no shipped key (vocab_size, n_layer, ...) and
    # the user's batch_size 32, not the shipped group's value.
    assert config["model"] == {"_target_": "my_project.MyModule", "width": 16, "lr": 0.01, "features": 8}
    assert config["data"] == {"_target_": "my_project.MyData", "n": 320, "batch_size": 32, "features": 8}
    assert "verdict: exact" in flow.evidence_stdout, flow.evidence_stdout[-3000:]
    manifest = json.loads((flow.checkpoint / "manifest.json").read_text())
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=flow.project, capture_output=True, text=True)
    # The user's repository, not the venv's bin.
    assert manifest["provenance"]["code"]["git_commit"] == commit.stdout.strip()
    supported = console(flow.project, "field", "evidence", "check", str(flow.bundle), "--checkpoint",
                        str(flow.checkpoint))  # fmt: skip
    assert supported.returncode == 0 and supported.stdout.startswith("SUPPORTED"), supported.stdout


@pytest.mark.slow
def test_the_documented_flow_ends_at_go_and_an_enforced_missing_sign_off_holds_build_and_check(
    documented_flow: DocumentedFlow,
) -> None:
    flow = documented_flow
    evidence_runs = str(flow.project / "outputs" / "field-evidence")
    built = console(flow.project, "field", "record", "build", str(flow.run_dir), evidence_runs, "--no-wandb")
    assert "decision: GO" in built.stdout, built.stdout[-3000:]
    checked = console(flow.project, "field", "record", "check", str(flow.run_dir / "field" / "record"))
    assert checked.returncode == 0 and "GO" in checked.stdout, checked.stdout[-3000:]

    # Build and check agree when an enforced sign-off is missing: both hold.
    enforced = console(flow.project, "field", "record", "build", str(flow.run_dir), evidence_runs, "--no-wandb",
                       "record.signoff.enforce=true")  # fmt: skip
    assert "decision: HOLD (held by signoff)" in enforced.stdout, enforced.stdout[-2000:]
    assert console(flow.project, "field", "record", "check", str(flow.run_dir / "field" / "record")).returncode == 1


@pytest.mark.slow
def test_after_the_documented_flow_a_changed_model_key_is_refused_and_the_evidence_does_not_cover_it(
    documented_flow: DocumentedFlow,
) -> None:
    flow = documented_flow
    # A model key changed: the same run refuses to resume, briefly, with the ways out ...
    refused = console(flow.project, "field-train", *DOCUMENTED_TRAIN, "model.width=32")
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    assert "model.width: 16 (checkpoint) -> 32 (this command)" in refused.stderr
    assert "run_name=<new name>" in refused.stderr
    assert "callbacks.checkpoint.resume.allow_mismatch=[model.width]" in refused.stderr
    assert "Traceback" not in refused.stderr
    # ... and the evidence does not cover a checkpoint of the changed model, naming the key.
    wide = console(flow.project, "field-train", *OWN, "model.width=32", "run_name=wide", "trainer.max_steps=10",
                   "progress_bar=none")  # fmt: skip
    assert wide.returncode == 0, wide.stderr[-2000:]
    new = latest_recoverable(flow.project / "outputs" / "field-train" / "wide" / "checkpoints")
    stale = console(flow.project, "field", "evidence", "check", str(flow.bundle), "--checkpoint", str(new))
    assert stale.returncode == 1 and "stale, config model.width: 16 (evidence) -> 32 (checkpoint)" in stale.stdout

