"""The example workloads moved into ``lightning_field.workloads``: a checkpoint written under their old
``_target_`` still resumes, an old name on the command line is refused with the new one, and the
resume check equates nothing but the moved names (``lightning_field.workloads.MOVED_TARGETS``)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import run_child
from hydra.utils import get_class

import lightning_field
from lightning_field import read_manifest
from lightning_field.checkpoint.resolver import committed_checkpoints, latest_recoverable
from lightning_field.cli import train_app
from lightning_field.cli.hydra_app import composition_problem
from lightning_field.core.manifest import MANIFEST_NAME
from lightning_field.integrations.hydra_configs import TargetConfigError, prepare_target_overrides, refuse_moved_targets
from lightning_field.record.identity import project_config
from lightning_field.state.provenance_compare import diff_provenance, stable_hash
from lightning_field.workloads import MOVED_TARGETS

APP = ["-m", "lightning_field.cli.train_app"]
QUIET = ["experiment=demo", "progress_bar=none", "trainer.enable_model_summary=false"]
OLD_NAME = {new: old for old, new in MOVED_TARGETS.items()}


def field_train(root: Path, *overrides: str) -> Any:
    return run_child([*APP, *QUIET, f"paths.root_dir={root}", *overrides], timeout=180, cwd=root)


def as_the_previous_version_wrote_it(checkpoint: Path) -> None:
    """Rewrite a manifest's stored config the way lightning_field 0.1.0 wrote it before the move: every
    ``_target_`` under its old path, and the config hash taken over that config."""

    def old_names(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: OLD_NAME.get(v, v) if k == "_target_" else old_names(v) for k, v in node.items()}
        return [old_names(v) for v in node] if isinstance(node, list) else node

    path = checkpoint / MANIFEST_NAME
    manifest = json.loads(path.read_text())
    resolved = old_names(manifest["provenance"]["config"]["resolved"])
    manifest["provenance"]["config"] = {"resolved": resolved, "hash": stable_hash(resolved)}
    path.write_text(json.dumps(manifest, indent=2))


def test_every_moved_target_names_an_importable_class_and_no_module_is_left_at_an_old_path() -> None:
    package = Path(lightning_field.__file__).parent
    for old, new in MOVED_TARGETS.items():
        assert get_class(new).__qualname__ == old.rpartition(".")[2]
        old_module = old.rpartition(".")[0].removeprefix("lightning_field.").replace(".", "/")
        assert not (package / f"{old_module}.py").exists(), f"{old_module}.py is back: one name per class"


@pytest.mark.slow
def test_a_checkpoint_written_under_the_old_targets_resumes_and_a_real_difference_is_still_refused(
    tmp_path: Path,
) -> None:
    assert field_train(tmp_path, "trainer.max_steps=10").returncode == 0
    run_dir = tmp_path / "outputs" / "field-train" / "demo"
    checkpoints = [Path(entry.path) for entry in committed_checkpoints(run_dir / "checkpoints")]
    assert checkpoints
    for checkpoint in checkpoints:
        as_the_previous_version_wrote_it(checkpoint)
    resume_point = latest_recoverable(run_dir / "checkpoints")
    stored = read_manifest(resume_point).provenance["config"]["resolved"]
    assert stored["model"]["_target_"] == "lightning_field.demo.DemoRegressor"
    assert stored["data"]["_target_"] == "lightning_field.demo.DemoDataModule"

    # The old-style checkpoint is still checked: a changed learning rate is refused, and only it is named.
    changed = field_train(tmp_path, "trainer.max_steps=20", "model.lr=0.02")
    assert changed.returncode == 2, changed.stdout[-3000:]
    assert "model.lr: 0.01 (checkpoint) -> 0.02 (this command)" in changed.stdout
    assert "_target_" not in changed.stdout.split("refusing to resume", 1)[1]

    resumed = field_train(tmp_path, "trainer.max_steps=20")
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert f"resuming from {resume_point}" in resumed.stdout
    final = read_manifest(latest_recoverable(run_dir / "checkpoints"))
    assert final.step == 20
    assert final.provenance["config"]["resolved"]["model"]["_target_"] == "lightning_field.workloads.demo.DemoRegressor"


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (
            ["model._target_=lightning_field.char_gpt.CharGPT"],
            "model._target_=lightning_field.char_gpt.CharGPT: that class moved to"
            " lightning_field.workloads.char_gpt.CharGPT",
        ),
        (
            ["experiment=demo", "data._target_=lightning_field.demo.DemoDataModule", "data.batch_size=4"],
            "write data._target_=lightning_field.workloads.demo.DemoDataModule",
        ),
    ],
)
def test_an_old_target_is_refused_before_anything_runs_with_the_path_to_write_instead(
    args: list[str], named: str
) -> None:
    problem = composition_problem("field_train", prepare_target_overrides(args), train_app.validate)
    assert problem is not None and named in problem and "\n" not in problem, problem


def test_an_old_target_in_a_users_own_yaml_is_refused_wherever_it_is_nested() -> None:
    user_yaml = {"callbacks": {"restore_drill": {"model": {"_target_": "lightning_field.demo.DemoRegressor"}}}}
    named = "callbacks.restore_drill.model._target_=lightning_field.demo.DemoRegressor: that class moved to"
    with pytest.raises(TargetConfigError, match=re.escape(f"{named} lightning_field.workloads.demo.DemoRegressor")):
        refuse_moved_targets(user_yaml)
    refuse_moved_targets({"model": {"_target_": "lightning_field.workloads.demo.DemoRegressor"}, "seed": [1, 2]})


def test_the_resume_diff_equates_only_a_moved_target_with_its_current_path() -> None:
    old, new = "lightning_field.char_gpt.CharGPT", "lightning_field.workloads.char_gpt.CharGPT"
    assert diff_provenance({"model": {"_target_": old}}, {"model": {"_target_": new}}) == {}
    other = "lightning_field.workloads.stdlib_text.StdlibTextDataModule"
    assert diff_provenance({"model": {"_target_": old}}, {"model": {"_target_": other}}) == {
        "model._target_": (old, other)
    }
    # Only the checkpoint's side may be old, and only under a _target_ key.
    assert diff_provenance({"model": {"_target_": new}}, {"model": {"_target_": old}}) == {"model._target_": (new, old)}
    assert diff_provenance({"model": {"name": old}}, {"model": {"name": new}}) == {"model.name": (old, new)}
    assert diff_provenance({"_target_": "my_pkg.Old"}, {"_target_": "my_pkg.New"}) == {
        "_target_": ("my_pkg.Old", "my_pkg.New")
    }


def test_the_release_record_hashes_a_workload_alike_under_its_old_and_current_target() -> None:
    old, new = next(iter(MOVED_TARGETS.items()))
    before = project_config({"model": {"_target_": old, "lr": 0.01}, "data": [{"_target_": old}]}, ["model", "data"])
    after = project_config({"model": {"_target_": new, "lr": 0.01}, "data": [{"_target_": new}]}, ["model", "data"])
    assert before == after and stable_hash(before) == stable_hash(after)
    changed = project_config({"model": {"_target_": new, "lr": 0.02}}, ["model"])
    assert stable_hash(changed) != stable_hash(project_config({"model": {"_target_": old, "lr": 0.01}}, ["model"]))
    other = project_config({"model": {"_target_": "my_pkg.Other"}}, ["model"])
    assert other == {"model": {"_target_": "my_pkg.Other"}}
