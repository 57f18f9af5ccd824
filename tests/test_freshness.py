"""ManifestCheckpoint(require_fresh=True): a signed record of the newest commit turns a rollback (the
newest checkpoints deleted and LAST pointed back, a folder copied over) into a refusal naming both steps,
where plain Lightning, and the bundle without it, resume the older state."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from conftest import assert_bitwise_equal
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_field import ManifestCheckpoint, StaleCheckpointError
from lightning_field.checkpoint.freshness import FRESHNESS_NAME
from lightning_field.core.signing import KEY_ENV

SECRET = "a-long-enough-secret-for-tests-0123"


def fit(root: Path, max_steps: int, require_fresh: bool = True, **options: object) -> tuple[BoringModel, pl.Trainer]:
    torch.manual_seed(0)
    model = BoringModel()
    checkpoint = ManifestCheckpoint(dirpath=root / "ckpts", every_n_train_steps=2, save_top_k=-1,
                                    require_fresh=require_fresh, **options)  # fmt: skip
    trainer = pl.Trainer(default_root_dir=root, max_steps=max_steps, accelerator="cpu", logger=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                         callbacks=[checkpoint])  # fmt: skip
    trainer.fit(model, ckpt_path="last")
    return model, trainer


def remove(path: Path) -> None:
    """A checkpoint's folder, or the ``.ckpt`` file that names its ``state.pt``."""
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()


def roll_back(ckpts: Path, to_step: int) -> None:
    """What a writer of the folder without the key can do: delete the newer checkpoints, point LAST back."""
    for newer in ckpts.glob("epoch=*-step=*"):
        if int(newer.name.removesuffix(".ckpt").rsplit("=", 1)[1]) > to_step:
            remove(newer)
    (ckpts / "LAST").write_text(f"epoch=0-step={to_step}\n")


@pytest.fixture
def keyed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, f"k1:{SECRET}")


def test_a_rolled_back_folder_is_refused_naming_both_steps_where_plain_lightning_resumes_the_older_state(
    tmp_path: Path, keyed: None
) -> None:
    fit(tmp_path / "run", 6, snapshot_every_n_train_steps=None)
    record = json.loads((tmp_path / "run" / "ckpts" / FRESHNESS_NAME).read_text())
    assert record["newest_step"] == 6 and record["checkpoint"] == "epoch=0-step=6" and record["signature"]["mac"]
    roll_back(tmp_path / "run" / "ckpts", 2)
    with pytest.raises(StaleCheckpointError, match=r"Refusing to resume step 2 .* vouches that step 6 was committed"):
        fit(tmp_path / "run", 10, snapshot_every_n_train_steps=None)
    # The same rollback without require_fresh resumes step 2 (with the LAST warning), as plain Lightning
    # resumes its older last.ckpt without a word.
    _, trainer = fit(tmp_path / "run", 10, require_fresh=False, snapshot_every_n_train_steps=None)
    assert Path(trainer.ckpt_path).name == "epoch=0-step=2"
    torch.manual_seed(0)
    plain = ModelCheckpoint(dirpath=tmp_path / "plain", every_n_train_steps=2, save_top_k=-1, save_last=True)
    options = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False, "limit_val_batches": 0}
    pl.Trainer(default_root_dir=tmp_path / "plain", max_steps=6, callbacks=[plain], **options).fit(BoringModel())
    shutil.copy(tmp_path / "plain" / "epoch=0-step=2.ckpt", tmp_path / "plain" / "last.ckpt")
    again = pl.Trainer(default_root_dir=tmp_path / "plain", max_steps=10, callbacks=[
        ModelCheckpoint(dirpath=tmp_path / "plain", save_last=True)], **options)  # fmt: skip
    again.fit(BoringModel(), ckpt_path="last")
    assert torch.load(again.ckpt_path, weights_only=False)["global_step"] == 2  # silently older


def test_a_fresh_folder_resumes_exactly_and_a_newer_step_snapshot_passes_the_record(
    tmp_path: Path, keyed: None
) -> None:
    fit(tmp_path / "run", 7, snapshot_every_n_train_steps=1, snapshot_dir=tmp_path / "shm")  # step 7: a snapshot
    resumed, trainer = fit(tmp_path / "run", 10, snapshot_every_n_train_steps=1, snapshot_dir=tmp_path / "shm")
    assert Path(trainer.ckpt_path).name == "epoch=0-step=7"  # newer than the record's step 6
    once, _ = fit(tmp_path / "once", 10, snapshot_every_n_train_steps=None)
    assert_bitwise_equal(once.state_dict(), resumed.state_dict(), "weights")
    assert json.loads((tmp_path / "run" / "ckpts" / FRESHNESS_NAME).read_text())["newest_step"] == 10


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        ("delete-record", "the signed record of the newest step committed, is missing"),
        ("lower-record", "FRESHNESS: the record's signature (key 'k1') does not match its content"),
        ("garbage-record", "is not a lightning_field.freshness/1 record"),
        ("delete-everything", "Refusing to resume nothing (training would start at step 0)"),
        ("link-out", "FRESHNESS cannot be read: "),
        ("nested-json", "is not a lightning_field.freshness/1 record"),
    ],
)
def test_a_record_deleted_forged_or_garbled_or_every_checkpoint_deleted_is_refused_naming_the_record(
    tmp_path: Path, keyed: None, tamper: str, message: str
) -> None:
    fit(tmp_path / "run", 4, snapshot_every_n_train_steps=None)
    ckpts = tmp_path / "run" / "ckpts"
    record = ckpts / FRESHNESS_NAME
    if tamper == "delete-record":
        record.unlink()
    elif tamper == "lower-record":
        record.write_text(record.read_text().replace('"newest_step": 4', '"newest_step": 2'))
    elif tamper == "garbage-record":
        record.write_bytes(b"\x00" * 5000)
    elif tamper == "link-out":  # the record's own bytes, read through a link that leaves the folder
        outside = tmp_path / "elsewhere.json"
        outside.write_bytes(record.read_bytes())
        record.unlink()
        record.symlink_to(outside)
    elif tamper == "nested-json":
        record.write_bytes(b"[" * 4000 + b"]" * 4000)
    else:
        for checkpoint in ckpts.glob("epoch=*"):
            remove(checkpoint)
    with pytest.raises(StaleCheckpointError, match=re.escape(message)):
        fit(tmp_path / "run", 6, snapshot_every_n_train_steps=None)


def test_require_fresh_without_a_checkpoint_key_is_refused_at_construction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(ValueError, match=r"require_fresh=True\) needs a checkpoint key \(FIELD_CHECKPOINT_KEY\)"):
        ManifestCheckpoint(dirpath=tmp_path, require_fresh=True)
