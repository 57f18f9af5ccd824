"""Trajectory-defining Trainer settings are recorded in every manifest and compared on resume: a change
is refused before the first batch, naming the setting and both values, unless
``ManifestCheckpoint(allow_changed=...)`` allows it; then the lineage says, in every later manifest,
the ledger and the evidence check, that it is no longer exact. Plain ModelCheckpoint resumes either
change without a word (beside it below). The conformance rows changed-accumulate-grad-batches,
changed-accumulate-allowed, changed-limit-train-batches and changed-val-check-interval run it on a
user's classifier against the uninterrupted run.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from hydra.utils import instantiate
from lightning.pytorch.callbacks import Callback, GradientAccumulationScheduler, ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_field import ManifestCheckpoint, ResumeConfig
from lightning_field.core.errors import ResumeMismatchError
from lightning_field.core.events import read_events
from lightning_field.core.manifest import MANIFEST_NAME, Manifest, ManifestError, read_manifest
from lightning_field.evidence.check import claim_problems
from lightning_field.evidence.identity import identity_of
from lightning_field.quality.ledger import goodput_ledger
from lightning_field.state.trainer_settings import (
    ALLOWABLE,
    SETTINGS,
    allowed_changes,
    changed_settings,
    refuse_changed_settings,
    trainer_settings,
)

sys.path.insert(0, str(Path(__file__).parent / "jobs"))
from conformance_job import StopAtStep

RECORDED = {
    "accumulate_grad_batches": 2, "limit_train_batches": 0.5, "val_check_interval": 0.5,
    "check_val_every_n_epoch": 1, "gradient_clip_val": None, "gradient_clip_algorithm": None,
    "precision": "32-true", "world_size": 1, "strategy": "SingleDeviceStrategy", "train_loaders": 1,
}  # fmt: skip
CHANGES = {
    "accumulate_grad_batches": (2, 4, "accumulate_grad_batches: 2 (checkpoint) -> 4 (now)"),
    "limit_train_batches": (0.5, 0.75, "limit_train_batches: 0.5 (checkpoint) -> 0.75 (now)"),
    "val_check_interval": (0.5, 0.25, "val_check_interval: 0.5 (checkpoint) -> 0.25 (now)"),
    "check_val_every_n_epoch": (1, 2, "check_val_every_n_epoch: 1 (checkpoint) -> 2 (now)"),
    "gradient_clip_val": (None, 0.5, "gradient_clip_val: None (checkpoint) -> 0.5 (now)"),
    "gradient_clip_algorithm": (None, "value", "gradient_clip_algorithm: None (checkpoint) -> 'value' (now)"),
    "precision": ("32-true", "bf16-mixed", "precision: '32-true' (checkpoint) -> 'bf16-mixed' (now)"),
    "strategy": ("SingleDeviceStrategy", "FSDPStrategy",
                 "strategy: 'SingleDeviceStrategy' (checkpoint) -> 'FSDPStrategy' (now)"),
    "train_loaders": (1, 2, "train_loaders: 1 (checkpoint) -> 2 (now)"),
}  # fmt: skip


# ---------------------------------------------------------------------------------------------- the comparison
def test_every_recorded_setting_but_the_world_size_has_a_change_case() -> None:
    assert set(CHANGES) == set(SETTINGS) - {"world_size"}


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_a_changed_setting_is_refused_naming_it_and_both_values_unless_allowed(name: str) -> None:
    before, after, line = CHANGES[name]
    saved, now = {**RECORDED, name: before}, {**RECORDED, name: after}
    with pytest.raises(ResumeMismatchError) as refused:
        refuse_changed_settings(saved, now, (), "ckpts/step=6")
    message = str(refused.value)
    assert message.startswith("Refusing to resume from ckpts/step=6: Trainer settings that define the training")
    assert f"\n  {line}\n" in message
    assert refused.value.differences == {f"trainer.{name}": (before, after)}
    if name in ALLOWABLE:
        assert f"ManifestCheckpoint(resume=ResumeConfig(allow_changed=['{name}']))" in message
        assert refused.value.allowed_by == "resume.allow_changed"
        assert refuse_changed_settings(saved, now, {name}, "ckpts/step=6") == {name: (before, after)}
    else:  # the number of train loaders: no data position holds for other loaders
        assert "allow_changed" not in message and refused.value.allowed_by is None
    assert refuse_changed_settings(saved, saved, (), "ckpts/step=6") == {}


def test_a_refusal_lists_every_change_and_an_allowed_one_does_not_hide_another() -> None:
    now = {**RECORDED, "accumulate_grad_batches": 4, "precision": "bf16-mixed"}
    with pytest.raises(ResumeMismatchError) as refused:
        refuse_changed_settings(RECORDED, now, {"accumulate_grad_batches"}, "x")
    assert "accumulate_grad_batches" not in refused.value.differences
    assert "precision: '32-true' (checkpoint) -> 'bf16-mixed' (now)" in str(refused.value)
    assert "ResumeConfig(allow_changed=['accumulate_grad_batches', 'precision'])" in str(refused.value)


def test_one_batch_and_the_whole_epoch_are_different_settings() -> None:
    assert changed_settings({"val_check_interval": 1.0}, {"val_check_interval": 1}) == {"val_check_interval": (1.0, 1)}
    assert changed_settings({"limit_train_batches": 4}, {"limit_train_batches": 4}) == {}


def test_a_setting_either_side_lacks_is_not_compared_and_the_world_size_is_the_identity_checks() -> None:
    assert changed_settings({}, RECORDED) == {}  # written before settings were recorded
    assert changed_settings({**RECORDED, "later_setting": 1}, RECORDED) == {}
    assert changed_settings(RECORDED, {**RECORDED, "world_size": 2}) == {}  # allow_resume_mismatch decides


def test_a_strategy_change_that_only_follows_a_world_size_change_is_part_of_it() -> None:
    two = {**RECORDED, "world_size": 2, "strategy": "DDPStrategy"}
    assert changed_settings(RECORDED, two) == {}
    fsdp = {**two, "strategy": "FSDPStrategy"}
    assert changed_settings(RECORDED, fsdp) == {"strategy": ("SingleDeviceStrategy", "FSDPStrategy")}
    assert changed_settings({**RECORDED, "strategy": "DDPStrategy"}, RECORDED) == {
        "strategy": ("DDPStrategy", "SingleDeviceStrategy")
    }


def test_allow_changed_refuses_a_name_it_does_not_know_naming_it_and_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="'acumulate_grad_batches', not a Trainer setting") as refused:
        ManifestCheckpoint(resume=ResumeConfig(allow_changed={"acumulate_grad_batches"}))
    assert f"The settings it may name: {', '.join(ALLOWABLE)}." in str(refused.value)
    with pytest.raises(ValueError, match=r"allow it with ResumeConfig\(allow_mismatch=\['world_size'\]\)"):
        allowed_changes(["world_size"])
    with pytest.raises(ValueError, match="holds only for the train loaders it was saved with"):
        allowed_changes(["train_loaders"])
    assert allowed_changes("precision") == {"precision"}  # one name, not its letters


def test_the_recorded_settings_are_what_the_trainer_was_given() -> None:
    trainer = pl.Trainer(
        accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        accumulate_grad_batches=3, limit_train_batches=5, val_check_interval=timedelta(seconds=30),
        check_val_every_n_epoch=None, gradient_clip_val=0.5, gradient_clip_algorithm="value", precision="bf16-mixed",
    )  # fmt: skip
    assert trainer_settings(trainer, train_loaders=2) == {
        "accumulate_grad_batches": 3, "limit_train_batches": 5, "val_check_interval": "0:00:30",
        "check_val_every_n_epoch": None, "gradient_clip_val": 0.5, "gradient_clip_algorithm": "value",
        "precision": "bf16-mixed", "world_size": 1, "strategy": "SingleDeviceStrategy", "train_loaders": 2,
    }  # fmt: skip
    scheduled = pl.Trainer(accelerator="cpu", logger=False, callbacks=[GradientAccumulationScheduler({0: 1, 4: 2})])
    assert trainer_settings(scheduled)["accumulate_grad_batches"] == {"0": 1, "4": 2}


# ---------------------------------------------------------------------------------------------- untrusted manifests
def _manifest_dir(tmp_path: Path, **provenance: Any) -> Path:
    where = tmp_path / "epoch=0-step=6"
    where.mkdir()
    Manifest("epoch=0-step=6", 6, 0, 1, {}, {}, True, []).write(where)
    document = json.loads((where / MANIFEST_NAME).read_text())
    document["provenance"].update(provenance)
    (where / MANIFEST_NAME).write_text(json.dumps(document))
    return where


@pytest.mark.parametrize(
    ("provenance", "named"),
    [
        ({"trainer": {**RECORDED, "accumulate_grad_batches": "two"}}, "'provenance.trainer.accumulate_grad_batches'"),
        ({"trainer": {**RECORDED, "precision": 32}}, "'provenance.trainer.precision'"),
        ({"trainer": {**RECORDED, "train_loaders": True}}, "'provenance.trainer.train_loaders'"),
        ({"trainer": {**RECORDED, "accumulate_grad_batches": {"0": "x"}}}, "not a schedule of factors"),
        ({"trainer": [2, 4]}, "'provenance.trainer' is list"),
        ({"changed_settings": [{"changes": {"precision": "bf16"}}]}, "'provenance.changed_settings'"),
        ({"changed_settings": {"precision": [1, 2]}}, "'provenance.changed_settings'"),
        ({"inexact_resume": "yes"}, "'provenance.inexact_resume'"),
    ],
)
def test_a_malformed_recorded_entry_is_refused_naming_the_manifest(
    tmp_path: Path, provenance: dict[str, Any], named: str
) -> None:
    where = _manifest_dir(tmp_path, **provenance)
    with pytest.raises(ManifestError, match=named) as refused:
        read_manifest(where)
    assert str(where / MANIFEST_NAME) in str(refused.value)


def test_a_well_formed_entry_reads_back_as_written(tmp_path: Path) -> None:
    changed = [{"checkpoint": "a", "step": 4, "changes": {"accumulate_grad_batches": [2, 4]}}]
    manifest = read_manifest(_manifest_dir(tmp_path, trainer=RECORDED, changed_settings=changed))
    assert manifest.provenance["trainer"] == RECORDED and manifest.provenance["changed_settings"] == changed


# ---------------------------------------------------------------------------------------------- on a real resume
class CountBatches(Callback):
    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_start(self, *args: Any) -> None:
        self.batches += 1


def _fit(root: Path, callback: ModelCheckpoint, max_steps: int, accumulate: int, *extra: Callback,
         resume: bool = False) -> pl.Trainer:  # fmt: skip
    trainer = pl.Trainer(
        default_root_dir=root, max_steps=max_steps, accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, accumulate_grad_batches=accumulate,
        callbacks=[callback, *extra],
    )  # fmt: skip
    pl.seed_everything(7)
    trainer.fit(BoringModel(), ckpt_path="last" if resume else None)
    return trainer


def _field(root: Path, **kwargs: Any) -> ManifestCheckpoint:
    return ManifestCheckpoint(dirpath=root / "ckpts", every_n_train_steps=4, save_top_k=-1,
                              snapshot_dir=root / "snapshots", **kwargs)  # fmt: skip


def test_a_changed_accumulation_is_refused_before_the_first_batch_where_plain_lightning_resumes_it_silently(
    tmp_path: Path,
) -> None:
    _fit(tmp_path / "field", _field(tmp_path / "field"), 20, 2, StopAtStep(6))
    counted = CountBatches()
    with pytest.raises(ResumeMismatchError, match=r"accumulate_grad_batches: 2 \(checkpoint\) -> 4 \(now\)"):
        _fit(tmp_path / "field", _field(tmp_path / "field"), 20, 4, counted, resume=True)
    assert counted.batches == 0

    def plain() -> ModelCheckpoint:
        return ModelCheckpoint(dirpath=tmp_path / "plain" / "ckpts", every_n_train_steps=4, save_last=True)

    _fit(tmp_path / "plain", plain(), 20, 2, StopAtStep(6))
    counted = CountBatches()
    _fit(tmp_path / "plain", plain(), 12, 4, counted, resume=True)
    assert counted.batches == (12 - 4) * 4, "plain Lightning resumed step 4 under the changed accumulation silently"


def test_an_allowed_change_resumes_and_the_manifests_ledger_and_evidence_say_the_lineage_is_no_longer_exact(
    tmp_path: Path,
) -> None:
    allowed = {"allow_changed": {"accumulate_grad_batches"}}
    _fit(tmp_path, _field(tmp_path), 20, 2, StopAtStep(6))
    with pytest.warns(UserWarning, match="this lineage is no longer exact"):
        _fit(tmp_path, _field(tmp_path, **allowed), 12, 4, resume=True)
    newest = read_manifest(tmp_path / "ckpts" / "epoch=0-step=12")
    change = {"checkpoint": str(tmp_path / "ckpts" / "stopped-step=6"), "step": 6,
              "changes": {"accumulate_grad_batches": [2, 4]}}  # fmt: skip
    assert newest.provenance["changed_settings"] == [change]
    assert newest.provenance["trainer"]["accumulate_grad_batches"] == 4
    # A later resume under the same settings is exact from there on, but the lineage stays inexact.
    _fit(tmp_path, _field(tmp_path), 16, 4, resume=True)
    final = read_manifest(tmp_path / "ckpts" / "epoch=0-step=16")
    assert final.provenance["changed_settings"] == [change]

    attempts = goodput_ledger(read_events(tmp_path)).attempts
    assert [a.changed_settings for a in attempts] == [{}, {"accumulate_grad_batches": [2, 4]}, {}]
    problems = claim_problems(identity_of(final.provenance), tmp_path / "ckpts" / "epoch=0-step=16")
    assert any(p.startswith("the checkpoint's lineage is not exact: it continues") and "allow_changed" in p
               for p in problems), problems  # fmt: skip
    exact = claim_problems(identity_of(final.provenance), tmp_path / "ckpts" / "epoch=0-step=4")
    assert not any("lineage" in p for p in exact), exact


def test_a_checkpoint_written_before_settings_were_recorded_still_resumes(tmp_path: Path) -> None:
    _fit(tmp_path, _field(tmp_path), 20, 2, StopAtStep(6))
    written = tmp_path / "ckpts" / "stopped-step=6" / MANIFEST_NAME
    document = json.loads(written.read_text())
    del document["provenance"]["trainer"]
    written.write_text(json.dumps(document))
    assert _fit(tmp_path, _field(tmp_path), 8, 4, resume=True).global_step == 8


def test_the_hydra_config_mirrors_allow_changed(tmp_path: Path) -> None:
    from test_configs import compose_train  # the suite's own composition of field-train

    allowed = "callbacks.checkpoint.resume.allow_changed=[accumulate_grad_batches]"
    cfg = compose_train("callbacks=field", allowed, tmp_path=tmp_path)
    checkpoint = instantiate(cfg.callbacks.checkpoint)
    assert checkpoint._guard.allow_changed == {"accumulate_grad_batches"}
    wrong = compose_train("callbacks=field", "callbacks.checkpoint.resume.allow_changed=[acumulate]", tmp_path=tmp_path)
    with pytest.raises(Exception, match="'acumulate', not a Trainer setting"):
        instantiate(wrong.callbacks.checkpoint)
