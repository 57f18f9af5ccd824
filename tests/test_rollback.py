"""Rollback is never silent: a resume older than what ``LAST`` names warns naming both, a checkpoint
whose name states another step than its manifest is refused, and ``field ckpt list --verify`` shows
each checkpoint's signature. Plain Lightning, beside each case, resumes the older state silently."""

from __future__ import annotations

import logging
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from conftest import make_trainer, rewrite_shared_state
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_field import CheckpointCorruptError, verify_checkpoint
from lightning_field.checkpoint.resolver import steps_in_name
from lightning_field.checkpoint.resume_last import resolve_last
from lightning_field.cli.main import main as field_main
from lightning_field.core.signing import KEY_ENV, keys_from_environment

SECRET = "correct-horse-battery-staple-2026"
FORGER = "a-secret-the-forger-made-up-000"


class _ResumedStep(Callback):
    """The step a fit starts from: the resumed checkpoint's."""

    step: int | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.step = trainer.global_step


def _fit(root: Path, steps: int, ckpt_path: str | None = None, **checkpoint: object) -> pl.Trainer:
    pl.seed_everything(0)
    checkpoint.setdefault("snapshot_dir", root / "shm")  # snapshots kept out of /dev/shm
    trainer = make_trainer(root, steps, **checkpoint)
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
        ("misnamed", "which was refused: it failed verification: ", "epoch=0-step=2"),
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
    elif damage == "misnamed":  # step 4's checkpoint put in step 6's place: reached first, and refused
        shutil.rmtree(newest)
        (ckpts / "epoch=0-step=4").rename(newest)
    else:
        for checkpoint in ("epoch=0-step=6", "epoch=0-step=4", "epoch=0-step=2"):
            shutil.rmtree(ckpts / checkpoint)
    with caplog.at_level(logging.WARNING):
        found = resolve_last(ckpts).path
    assert found == (str(ckpts / resumed) if resumed else None)
    (warning,) = _rollback_warnings(caplog)
    assert "names epoch=0-step=6 (step 6), " in warning and why in warning
    if damage == "corrupt":
        assert "state.pt: content hash" in warning
    if damage == "forged":
        assert "signed with key 'k2', which is not accepted" in warning
    if damage == "misnamed":
        assert "its name says step 6, but its manifest is of step 4 (renamed, or another checkpoint" in warning
    step = resumed.rsplit("=", 1)[-1] if resumed else ""
    tail = f"resuming from the older {resumed} (step {step}) instead" if resumed else "training starts at step 0"
    assert tail in warning


def test_a_resume_of_what_last_names_or_of_a_newer_commit_than_it_says_nothing(
    ckpts: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        assert resolve_last(ckpts).path == str(ckpts / "epoch=0-step=6")
        (ckpts / "LAST").write_text("epoch=0-step=4\n")  # a crash between the commit and LAST's update
        assert resolve_last(ckpts).path == str(ckpts / "epoch=0-step=6")
        shutil.rmtree(ckpts / "epoch=0-step=4")  # LAST names an older, deleted one: nothing newer was lost
        assert resolve_last(ckpts).path == str(ckpts / "epoch=0-step=6")
    assert not _rollback_warnings(caplog)


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Plain Lightning's checkpoints at steps 2, 4 and 6, and last.ckpt."""
    root = tmp_path_factory.mktemp("plain")
    keep = ModelCheckpoint(dirpath=root, every_n_train_steps=2, save_top_k=-1, save_last=True)
    pl.seed_everything(0)
    _plain_trainer(root, 6, keep).fit(BoringModel())
    return root


def _plain_trainer(root: Path, steps: int, *callbacks: Callback) -> pl.Trainer:
    return pl.Trainer(default_root_dir=root, max_steps=steps, accelerator="cpu", logger=False,
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                      callbacks=list(callbacks))  # fmt: skip


def test_a_checkpoint_named_for_another_step_than_its_manifest_is_refused_naming_both_plain_lightning_resumes_it(
    ckpts: Path, plain_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    # Step 6 deleted, and step 2's checkpoint (signed, intact) put in its place under its name.
    shutil.rmtree(ckpts / "epoch=0-step=6")
    shutil.copytree(ckpts / "epoch=0-step=2", ckpts / "epoch=0-step=6")
    refusal = f"{ckpts / 'epoch=0-step=6'}: its name says step 6, but its manifest is of step 2 (renamed, or another"
    report = verify_checkpoint(ckpts / "epoch=0-step=6")
    assert not report.intact and report.problems[0].startswith(refusal)
    with caplog.at_level(logging.WARNING):
        assert resolve_last(ckpts).path == str(ckpts / "epoch=0-step=4")
    (warning,) = _rollback_warnings(caplog)
    said = "which was refused: its name says step 6, but its manifest is of step 2 (renamed, or another checkpoint"
    assert f"names epoch=0-step=6 (step 6), {said}" in warning
    assert "resuming from the older epoch=0-step=4 (step 4) instead" in warning

    assert field_main(["ckpt", "verify", str(ckpts / "epoch=0-step=6")]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"REFUSED  {ckpts / 'epoch=0-step=6'} (step 2)") and refusal in out
    assert field_main(["ckpt", "list", str(ckpts), "--verify"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:4]}
    assert rows["epoch=0-step=6"][1:4] == ["persistent", "2", "misnamed"]
    assert rows["epoch=0-step=4"][-2:] == ["<-", "resume"]
    # The same with step 4 gone too: step 2 is resumed, never the checkpoint named step 6.
    shutil.rmtree(ckpts / "epoch=0-step=4")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert resolve_last(ckpts).path == str(ckpts / "epoch=0-step=2")
    (warning,) = _rollback_warnings(caplog)
    assert "resuming from the older epoch=0-step=2 (step 2) instead" in warning and said in warning
    # Named explicitly (ckpt_path=...), it is refused the same way, before anything is loaded.
    with pytest.raises(CheckpointCorruptError, match="its name says step 6, but its manifest is of step 2"):
        _fit(tmp_path / "explicit", 8, ckpt_path=str(ckpts / "epoch=0-step=6"))
    # And through a sharding strategy's load (FSDP, ModelParallel), before DCP reads a byte.
    from lightning_field.checkpoint.sharded_load import load_verified
    from lightning_field.checkpoint.stores import LocalStore

    def never(*args: object, **kwargs: object) -> dict:
        raise AssertionError("the misnamed checkpoint was loaded")

    with pytest.raises(CheckpointCorruptError, match="its name says step 6, but its manifest is of step 2"):
        load_verified(never, ckpts / "epoch=0-step=6", None, strategy=None, store=LocalStore(),
                      check_resume=lambda manifest, location: None)  # fmt: skip

    # Plain Lightning: the file named step 6 holding step 2 is resumed as it is, from step 2, without a word.
    plain = tmp_path / "plain"
    shutil.copytree(plain_run, plain)
    shutil.copy(plain / "epoch=0-step=2.ckpt", plain / "epoch=0-step=6.ckpt")
    resumed = _ResumedStep()
    _plain_trainer(plain, 8, resumed).fit(BoringModel(), ckpt_path=str(plain / "epoch=0-step=6.ckpt"))
    assert resumed.step == 2


@pytest.mark.parametrize(
    ("name", "steps"),
    [("epoch=0-step=20", {20}), ("failed-step=5", {5}), ("interrupted-step=7", {7}), ("stopped-step=3", {3}),
     ("preempted-step=9", {9}), ("epoch=0-step=20-v1", {20}), ("step=4", {4}), ("epoch=1-step=00020", {20}),
     ("epoch=0-step=8-val_loss=0.25", {8}), ("last", set()), ("last-v1", set()), ("model-epoch=3", set()),
     ("global_step=5", set()), ("best", set()), ("0-20", set())],
)  # fmt: skip
def test_only_a_name_that_states_a_step_is_checked(name: str, steps: set[int]) -> None:
    assert steps_in_name(name) == steps


def test_a_version_suffix_and_names_without_a_step_keep_verifying_and_resuming(
    ckpts: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (ckpts / "epoch=0-step=6").rename(ckpts / "epoch=0-step=6-v1")
    (ckpts / "epoch=0-step=4").rename(ckpts / "best")
    assert verify_checkpoint(ckpts / "epoch=0-step=6-v1").intact and verify_checkpoint(ckpts / "best").intact
    with caplog.at_level(logging.WARNING):
        assert resolve_last(ckpts).path == str(ckpts / "epoch=0-step=6-v1")
    assert not _rollback_warnings(caplog)  # LAST's epoch=0-step=6 is gone, but nothing newer than step 6 was lost

    # A filename template that states no step: every save verifies and resumes.
    _fit(tmp_path / "own", 4, filename="model-{epoch}", snapshot_every_n_train_steps=None)
    names = sorted(p.name for p in (tmp_path / "own" / "ckpts").iterdir() if p.is_dir())
    assert names and not any(steps_in_name(n) for n in names)
    again = _fit(tmp_path / "own", 6, "last", filename="model-{epoch}", snapshot_every_n_train_steps=None)
    assert _resumed_step(again) == 4


class LogsItsOwnStep(BoringModel):
    """Logs a "step" of its own, as users do to set the loggers' x-axis (here: samples seen)."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.log("step", float(self.global_step * 8))
        return super().training_step(batch, batch_idx)


def test_a_logged_step_does_not_name_our_checkpoints_so_they_resume_where_plain_lightning_names_them_by_it(
    tmp_path: Path,
) -> None:
    pl.seed_everything(0)
    ours = make_trainer(tmp_path / "ours", 4, snapshot_dir=tmp_path / "shm")
    ours.fit(LogsItsOwnStep())
    folders = (tmp_path / "ours" / "ckpts").iterdir()
    names = sorted(p.name for p in folders if p.is_dir() and p.name.startswith("epoch="))
    assert names == ["epoch=0-step=2", "epoch=0-step=4"]  # the manifest's steps, not 8 x them
    pl.seed_everything(0)
    again = make_trainer(tmp_path / "ours", 6, snapshot_dir=tmp_path / "shm")
    again.callbacks.append(_ResumedStep())
    again.fit(LogsItsOwnStep(), ckpt_path="last")
    assert _resumed_step(again) == 4

    plain = tmp_path / "plain"
    _plain_trainer(plain, 4, ModelCheckpoint(dirpath=plain, every_n_train_steps=2, save_top_k=-1)).fit(LogsItsOwnStep())
    assert sorted(p.name for p in plain.iterdir()) != ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt"]


def _signature_column(out: str) -> dict[str, str]:
    lines = out.splitlines()
    start = lines[0].index("signature")
    return {line.split()[0]: line[start : start + 9].strip() for line in lines[1:] if line.startswith("epoch=")}


def test_list_verify_shows_each_checkpoints_signature_valid_invalid_unsigned_or_no_key(
    ckpts: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rewrite_shared_state(ckpts / "epoch=0-step=6", lambda state: None, keys_from_environment({KEY_ENV: f"k2:{FORGER}"}))
    rewrite_shared_state(ckpts / "epoch=0-step=4", lambda state: None, None)  # unsigned
    assert field_main(["ckpt", "list", str(ckpts), "--verify"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["name", "tier", "step", "status", "drill", "signature", "size", "age"]
    assert _signature_column(out) == {
        "epoch=0-step=6": "INVALID",
        "epoch=0-step=4": "unsigned",
        "epoch=0-step=2": "valid",
    }
    assert "signature: 'INVALID' = forged, changed after signing or signed with a key not accepted (refused)" in out
    # Its files are intact: refused for its signature, which the status says instead of "corrupt".
    assert " bad signature " in next(line for line in out.splitlines() if line.startswith("epoch=0-step=6"))
    assert "resumes from epoch=0-step=2 (persistent, step 2)" in out.splitlines()[-1]

    monkeypatch.delenv(KEY_ENV)  # without a key nothing is checked, and the column says so
    assert field_main(["ckpt", "list", str(ckpts), "--verify"]) == 0
    out = capsys.readouterr().out
    assert _signature_column(out) == {
        "epoch=0-step=6": "no key",
        "epoch=0-step=4": "unsigned",
        "epoch=0-step=2": "no key",
    }
    assert "resumes from epoch=0-step=6 (persistent, step 6)" in out.splitlines()[-1]

    for checkpoint in ("epoch=0-step=6", "epoch=0-step=2"):  # nothing signed, no key: no column, one line
        rewrite_shared_state(ckpts / checkpoint, lambda state: None, None)
    assert field_main(["ckpt", "list", str(ckpts), "--verify"]) == 0
    out = capsys.readouterr().out
    assert "signature" not in out.splitlines()[0]
    assert "signature: none is signed and no key is set (FIELD_CHECKPOINT_KEY; docs/security.md)" in out
