"""Rollback is never silent: a resume older than what ``LAST`` names warns naming both, a checkpoint
whose name states another step than its manifest is refused, and ``field ckpt list --verify`` shows
each checkpoint's signature. Plain Lightning, beside each case, resumes the older state silently."""

from __future__ import annotations

import logging
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path

import lightning.pytorch as pl
import pytest
from conftest import make_trainer, rewrite_shared_state
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_field.checkpoint.resume_last import resolve_last
from lightning_field.core.signing import KEY_ENV, keys_from_environment

SECRET = "correct-horse-battery-staple-2026"
FORGER = "a-secret-the-forger-made-up-000"


class _ResumedStep(Callback):
    """The step a fit starts from: the resumed checkpoint's."""

    step: int | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.step = trainer.global_step


def _fit(root: Path, steps: int, ckpt_path: str | None = None) -> pl.Trainer:
    pl.seed_everything(0)
    trainer = make_trainer(root, steps, snapshot_dir=root / "shm")  # snapshots kept out of /dev/shm
    trainer.callbacks.append(_ResumedStep())
    trainer.fit(BoringModel(), ckpt_path=ckpt_path)
    return trainer


def _resumed_step(trainer: pl.Trainer) -> int | None:
    return next(c.step for c in trainer.callbacks if isinstance(c, _ResumedStep))


@pytest.fixture(scope="module")
def signed_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A signed run's checkpoints at steps 2, 4 and 6; LAST names step 6."""
    root = tmp_path_factory.mktemp("signed")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(KEY_ENV, f"k1:{SECRET}")
        _fit(root, 6)
    assert (root / "ckpts" / "LAST").read_text().strip() == "epoch=0-step=6"
    yield root / "ckpts"


@pytest.fixture
def ckpts(signed_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(KEY_ENV, f"k1:{SECRET}")
    copy = tmp_path / "ckpts"
    shutil.copytree(signed_run, copy)
    return copy


def _rollback_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "LAST" in r.getMessage()]


def _corrupt(checkpoint: Path) -> None:
    state = checkpoint / "state.pt"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))


def test_a_resume_after_the_two_newest_checkpoints_were_deleted_warns_naming_both_plain_lightning_is_silent(
    signed_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(KEY_ENV, f"k1:{SECRET}")
    run = tmp_path / "run"
    shutil.copytree(signed_run, run / "ckpts")
    for newest in ("epoch=0-step=6", "epoch=0-step=4"):
        shutil.rmtree(run / "ckpts" / newest)
    with caplog.at_level(logging.WARNING):
        trainer = _fit(run, 8, ckpt_path="last")
    assert _resumed_step(trainer) == 2 and trainer.ckpt_path == str(run / "ckpts" / "epoch=0-step=2")
    (warning,) = _rollback_warnings(caplog)
    assert f'ckpt_path="last": {run / "ckpts" / "LAST"} names epoch=0-step=6 (step 6), which is gone' in warning
    assert "resuming from the older epoch=0-step=2 (step 2) instead" in warning and "rolled this run back" in warning

    # Plain Lightning: the same rollback (the newer checkpoints deleted, last.ckpt put back to step 2's).
    plain = tmp_path / "plain"
    keep = ModelCheckpoint(dirpath=plain, every_n_train_steps=2, save_top_k=-1, save_last=True)
    pl.seed_everything(0)
    pl.Trainer(default_root_dir=plain, max_steps=6, accelerator="cpu", logger=False, enable_progress_bar=False,
               enable_model_summary=False, limit_val_batches=0, callbacks=[keep]).fit(BoringModel())  # fmt: skip
    for newest in ("epoch=0-step=6.ckpt", "epoch=0-step=4.ckpt"):
        (plain / newest).unlink()
    shutil.copy(plain / "epoch=0-step=2.ckpt", plain / "last.ckpt")
    resumed = _ResumedStep()
    again = pl.Trainer(default_root_dir=plain, max_steps=8, accelerator="cpu", logger=False,
                       enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                       callbacks=[ModelCheckpoint(dirpath=plain, save_last=True), resumed])  # fmt: skip
    caplog.clear()
    with warnings.catch_warnings(record=True) as seen, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        again.fit(BoringModel(), ckpt_path="last")
    assert resumed.step == 2  # rolled back by four steps...
    said = [str(w.message) for w in seen] + [r.getMessage() for r in caplog.records]
    assert not [s for s in said if "step=6" in s or "step 6" in s or "roll" in s]  # ...without a word


@pytest.mark.parametrize(
    ("damage", "why", "resumed"),
    [
        ("deleted", "which is gone (no such checkpoint in", "epoch=0-step=4"),
        ("manifest-deleted", "which has no manifest.json (it never committed, or its manifest was deleted)",
         "epoch=0-step=4"),
        ("corrupt", "which was refused: it failed verification: ", "epoch=0-step=4"),
        ("forged", "it failed verification: ", "epoch=0-step=4"),
        ("all-deleted", "which is gone", None),
    ],
)  # fmt: skip
def test_each_way_the_checkpoint_last_names_can_be_lost_warns_naming_it_why_and_the_one_resumed(
    ckpts: Path, caplog: pytest.LogCaptureFixture, damage: str, why: str, resumed: str | None
) -> None:
    newest = ckpts / "epoch=0-step=6"
    if damage == "deleted":
        shutil.rmtree(newest)
    elif damage == "manifest-deleted":
        (newest / "manifest.json").unlink()
    elif damage == "corrupt":
        _corrupt(newest)
    elif damage == "forged":
        rewrite_shared_state(newest, lambda state: None, keys_from_environment({KEY_ENV: f"k2:{FORGER}"}))
    else:
        for checkpoint in ("epoch=0-step=6", "epoch=0-step=4", "epoch=0-step=2"):
            shutil.rmtree(ckpts / checkpoint)
    with caplog.at_level(logging.WARNING):
        found = resolve_last(ckpts)
    assert found == (str(ckpts / resumed) if resumed else None)
    (warning,) = _rollback_warnings(caplog)
    assert "names epoch=0-step=6 (step 6), " in warning and why in warning
    if damage == "corrupt":
        assert "state.pt: content hash" in warning
    if damage == "forged":
        assert "signed with key 'k2', which is not accepted" in warning
    tail = f"resuming from the older {resumed} (step 4) instead" if resumed else "training starts at step 0"
    assert tail in warning


def test_a_resume_of_what_last_names_or_of_a_newer_commit_than_it_says_nothing(
    ckpts: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        assert resolve_last(ckpts) == str(ckpts / "epoch=0-step=6")
        (ckpts / "LAST").write_text("epoch=0-step=4\n")  # a crash between the commit and LAST's update
        assert resolve_last(ckpts) == str(ckpts / "epoch=0-step=6")
        shutil.rmtree(ckpts / "epoch=0-step=4")  # LAST names an older, deleted one: nothing newer was lost
        assert resolve_last(ckpts) == str(ckpts / "epoch=0-step=6")
    assert not _rollback_warnings(caplog)
