"""Resuming into a different run is refused with a readable diff, unless the difference is allowed."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from conftest import make_trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_field import ManifestCheckpoint, ResumeMismatchError, read_events, read_manifest
from lightning_field.state.provenance_compare import diff_provenance
from lightning_field.state.secrets import is_redacted
from lightning_field.workloads.demo import DemoDataModule, DemoRegressor


def _trainer(root: Path, max_steps: int, **kwargs: object) -> tuple[pl.Trainer, ManifestCheckpoint]:
    trainer = make_trainer(root, max_steps, **kwargs)
    return trainer, trainer.checkpoint_callback


def test_changed_hyperparameter_is_refused_with_a_diff_naming_it(tmp_path: Path) -> None:
    trainer, _ = _trainer(tmp_path, 4)
    trainer.fit(DemoRegressor(lr=0.01), datamodule=DemoDataModule(size=64))
    resumed, _ = _trainer(tmp_path, 6)
    with pytest.raises(ResumeMismatchError) as info:
        resumed.fit(DemoRegressor(lr=0.05), datamodule=DemoDataModule(size=64), ckpt_path="last")
    message = str(info.value)
    assert "config.resolved.model.lr: 0.01 (checkpoint) != 0.05 (this run)" in message
    assert "ResumeConfig(allow_mismatch=['config.resolved.model.lr'])" in message


def test_an_explicitly_allowed_difference_resumes(tmp_path: Path) -> None:
    trainer, _ = _trainer(tmp_path, 4)
    trainer.fit(DemoRegressor(lr=0.01), datamodule=DemoDataModule(size=64))
    resumed, _ = _trainer(tmp_path, 6, allow_resume_mismatch=["config"])
    with pytest.warns(UserWarning, match="allowed difference config.resolved.model.lr"):
        resumed.fit(DemoRegressor(lr=0.05), datamodule=DemoDataModule(size=64), ckpt_path="last")
    assert resumed.global_step == 6


def test_changed_training_data_is_refused_before_the_first_step(tmp_path: Path) -> None:
    trainer, _ = _trainer(tmp_path, 4, allow_resume_mismatch=["config"])
    trainer.fit(DemoRegressor(), datamodule=DemoDataModule(size=64, seed=0))
    resumed, _ = _trainer(tmp_path, 6, allow_resume_mismatch=["config"])
    with pytest.raises(ResumeMismatchError, match=r"data\.fingerprint"):
        resumed.fit(DemoRegressor(), datamodule=DemoDataModule(size=64, seed=1), ckpt_path="last")
    assert resumed.global_step == 4


def test_world_size_difference_is_reported_by_name() -> None:
    diff = diff_provenance({"world_size": 2, "code": {"torch": "2.4"}}, {"world_size": 1, "code": {"torch": "2.4"}})
    assert diff == {"world_size": (2, 1)}


def test_secrets_in_config_and_environment_never_reach_the_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "0123456789abcdef0123456789abcdef01234567")
    config = {"logger": {"api_key": "sk-verysecretvalue123"}, "nested": {"token": "abc"}, "url": "ghp_abcdefghijklmnop"}
    trainer, _ = _trainer(tmp_path, 2, config=config)
    trainer.fit(DemoRegressor(), datamodule=DemoDataModule(size=64))
    text = (tmp_path / "ckpts" / "epoch=0-step=2" / "manifest.json").read_text()
    for secret in (
        "sk-verysecretvalue123",
        "ghp_abcdefghijklmnop",
        "0123456789abcdef0123456789abcdef01234567",
        '"abc"',
    ):
        assert secret not in text
    resolved = read_manifest(tmp_path / "ckpts" / "epoch=0-step=2").provenance["config"]["resolved"]
    assert is_redacted(resolved["logger"]["api_key"])


def test_saves_and_loads_are_recorded_in_the_event_log(tmp_path: Path) -> None:
    trainer, _ = _trainer(tmp_path, 4)
    trainer.fit(DemoRegressor(), datamodule=DemoDataModule(size=64))
    resumed, _ = _trainer(tmp_path, 6)
    resumed.fit(DemoRegressor(), datamodule=DemoDataModule(size=64), ckpt_path="last")
    events = read_events(tmp_path)
    kinds = [(e["attempt"], e["event"]) for e in events]
    assert kinds.count((1, "ckpt_committed")) == 2 and (1, "attempt_start") in kinds
    assert (2, "attempt_start") in kinds and (2, "ckpt_load") in kinds
    committed = [e for e in events if e["event"] == "ckpt_committed"]
    assert all(e["payload"]["blocking_s"] > 0 for e in committed)
    assert [e["step"] for e in committed] == [2, 4, 6]


def test_code_provenance_records_commit_and_a_dirty_diff_hash(tmp_path: Path) -> None:
    import subprocess

    from lightning_field.state.provenance import code_provenance

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=tmp_path, check=True)

    (tmp_path / "train.py").write_text("print(1)\n")
    git("init", "-q")
    git("add", "train.py")
    git("commit", "-qm", "init")
    clean = code_provenance(tmp_path)
    assert len(clean["git_commit"]) == 40 and clean["git_dirty"] is False and clean["git_diff_hash"] is None
    (tmp_path / "train.py").write_text("print(2)\n")
    dirty = code_provenance(tmp_path)
    assert dirty["git_dirty"] is True and dirty["git_commit"] == clean["git_commit"]
    (tmp_path / "train.py").write_text("print(3)\n")
    assert code_provenance(tmp_path)["git_diff_hash"] != dirty["git_diff_hash"]


class _Grown(BoringModel):
    """BoringModel with a layer added in code (no hyperparameter says so)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(32, 3)
        self.extra = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.extra(self.layer(x))


def test_a_model_changed_in_code_is_refused_with_the_manifests_shape_diff_not_torchs_error(tmp_path: Path) -> None:
    pl.seed_everything(0)
    trainer, _ = _trainer(tmp_path, 4)
    trainer.fit(BoringModel())
    pl.seed_everything(0)
    # (The two classes live in different source trees, so the code identity differs too: allowed
    # here, so that the architecture check alone is under test.)
    resumed, _ = _trainer(tmp_path, 6, allow_resume_mismatch=["code"])
    with pytest.raises(ResumeMismatchError) as info:
        resumed.fit(_Grown(), ckpt_path="last")
    message = str(info.value)
    assert "the model's architecture changed" in message
    assert "added extra.weight [2, 3]" in message and "reshaped layer.weight: [2, 32] -> [3, 32]" in message
    assert "Missing key" not in message and "size mismatch" not in message
    assert info.value.differences["model.architecture"]
    # Allowed on purpose, the check stands aside (torch's own load then decides).
    pl.seed_everything(0)
    allowed, _ = _trainer(tmp_path, 6, allow_resume_mismatch=["code", "model.architecture"])
    with pytest.raises(RuntimeError, match="size mismatch"):
        allowed.fit(_Grown(), ckpt_path="last")


def test_a_dirpath_under_a_file_is_refused_at_setup_before_any_step(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    trainer, _ = _trainer(tmp_path, 4, dirpath=blocker / "ckpts")
    with pytest.raises(ValueError, match=r"is unusable: .*not-a-dir is a file, not a directory"):
        trainer.fit(BoringModel())
    assert trainer.global_step == 0
