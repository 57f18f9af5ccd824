"""Library mode: a user's own Hydra app, outside this repository, composes lightning_field's configs
through the search-path plugin, with the package installed normally and installed editable
(Hydra #2359: plugins under an editable install were silently not discovered)."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # every test here starts processes (tests/suite_budget.py)

REPO = Path(__file__).resolve().parent.parent

USER_APP = """
import hydra
import lightning_field
from hydra.utils import instantiate
from omegaconf import DictConfig


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    callbacks = [type(instantiate(node)).__name__ for node in cfg.callbacks.values()]
    print("PACKAGE", lightning_field.__file__)
    print("CALLBACKS", sorted(callbacks))
    print("TRAINER", cfg.trainer.accelerator, cfg.trainer.max_steps)


main()
"""
USER_CONFIG = """
defaults:
  - lightning_field/callbacks: field
  - lightning_field/trainer: cpu
  - _self_

callbacks:
  time_to_quality:
    target: 2.0
trainer:
  max_steps: 77
"""


def _clean_env() -> dict[str, str]:
    # PYTHONPATH (e.g. a checkout under test) would put another copy of the package in front.
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _venv(tmp_path: Path) -> Path:
    """A venv that sees this interpreter's packages (torch, hydra, ...) but not their .pth files, so
    the development install of lightning_field in them stays invisible."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    packages = next((venv / "lib").glob("python*/site-packages"))
    (packages / "_outer_packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return venv / "bin" / "python"


def _source_copy(tmp_path: Path) -> Path:
    """Install from a copy: building writes build/ and *.egg-info next to the sources."""
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    source = tmp_path / "source"
    for name in files:
        if (REPO / name).is_file() and not (REPO / name).is_symlink():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    return source


@pytest.mark.slow
@pytest.mark.parametrize("editable", [False, True], ids=["installed", "editable"])
def test_a_user_hydra_app_composes_the_shipped_configs(editable: bool, tmp_path: Path) -> None:
    python, source = _venv(tmp_path), _source_copy(tmp_path)
    install = [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index"]
    subprocess.run(
        [*install, *(["-e"] if editable else []), str(source)], check=True, cwd=tmp_path, timeout=300, env=_clean_env()
    )
    app = tmp_path / "user_app"
    (app / "conf").mkdir(parents=True)
    (app / "app.py").write_text(USER_APP)
    (app / "conf" / "train.yaml").write_text(USER_CONFIG)

    ok = subprocess.run([str(python), "app.py"], cwd=app, capture_output=True, text=True, timeout=300, env=_clean_env())
    assert ok.returncode == 0, ok.stderr[-3000:]
    expected_home = source if editable else python.parent.parent
    assert f"PACKAGE {expected_home}" in ok.stdout, ok.stdout
    assert (
        "CALLBACKS ['CheckpointCadence', 'ManifestCheckpoint', 'RestoreDrill', 'StragglerMonitor', 'TimeToQuality']"
        in ok.stdout
    )
    assert "TRAINER cpu 77" in ok.stdout

    # The plugin also registered the schemas: a wrong type is refused at composition, by name.
    bad = subprocess.run(
        [str(python), "app.py", "callbacks.checkpoint.every_n_train_steps=often"],
        cwd=app, capture_output=True, text=True, timeout=300, env=_clean_env(),
    )  # fmt: skip
    assert bad.returncode != 0 and "every_n_train_steps" in bad.stderr and "Integer" in bad.stderr
