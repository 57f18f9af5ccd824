"""Step snapshots (``snapshot_every_n_train_steps``): complete checkpoints in a node-local directory
between the persistent ones, resumed from when newer, skipped when damaged, bounded in number, and
kept in a directory only their user can write. The SIGKILL rows are in the conformance suite."""

from __future__ import annotations

import logging
import os
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from conftest import assert_bitwise_equal, make_trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_field.checkpoint import snapshots as snapshot_tier
from lightning_field.checkpoint.async_controller import AsyncSaves
from lightning_field.checkpoint.snapshot_lineage import LINEAGE_NAME, lineage_mismatch
from lightning_field.checkpoint.snapshots import snapshot_dir_for
from lightning_field.checkpoint.stores import LocalStore
from lightning_field.cli.main import main as field_main
from lightning_field.core.events import read_events
from lightning_field.core.manifest import SHARED_STATE_FILE, read_manifest


def fit(root: Path, max_steps: int, resume: bool = False, **options: Any) -> tuple[BoringModel, Any]:
    torch.manual_seed(0)  # BoringModel draws its data: the same seed, the same data
    model = BoringModel()
    trainer = make_trainer(root, max_steps, every_n_train_steps=5, snapshot_every_n_train_steps=1,
                           snapshot_dir=root / "shm", **options)  # fmt: skip
    trainer.fit(model, ckpt_path="last" if resume else None)
    return model, trainer


def snapshots(root: Path) -> list[str]:
    where = snapshot_dir_for(root / "ckpts", root / "shm")
    return sorted(p.name for p in where.iterdir() if not p.name.startswith(".") and p.is_dir())


@pytest.mark.parametrize("in_line", [None, False], ids=["default-in-line-on-cpu", "beside-training-as-on-gpu"])
def test_a_rerun_resumes_from_the_newest_snapshot_past_the_persistent_checkpoint_and_ends_bitwise_alike(
    tmp_path: Path, in_line: bool | None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        fit(tmp_path / "run", 8, snapshot_in_line=in_line)
    how = "committed in line before the next step" if in_line is None else "committed beside training"
    assert any(how in r.getMessage() for r in caplog.records)
    assert snapshots(tmp_path / "run") == ["epoch=0-step=7", "epoch=0-step=8"]  # step 5 is persistent
    assert sorted(p.name for p in (tmp_path / "run" / "ckpts").iterdir() if p.is_dir()) == ["epoch=0-step=5"]
    resumed, trainer = fit(tmp_path / "run", 10, resume=True, snapshot_in_line=in_line)
    assert Path(trainer.ckpt_path).name == "epoch=0-step=8"
    # The event log says which tier the resume came from (the goodput ledger counts redone steps by it).
    loads = [e for e in read_events(tmp_path / "run") if e["event"] == "ckpt_load"]
    assert [(e["step"], e["payload"]["tier"]) for e in loads] == [(8, "snapshot")]
    assert trainer.checkpoint_callback.snapshots.last_costs.step == 9  # step 10 is persistent
    once, _ = fit(tmp_path / "once", 10)
    assert_bitwise_equal(once.state_dict(), resumed.state_dict(), "weights")
    # Step 10 ended the fit on a persistent checkpoint: no snapshot is newer, so their memory is released.
    assert not snapshot_dir_for(tmp_path / "run" / "ckpts", tmp_path / "run" / "shm").exists()


def test_a_resume_from_a_snapshot_hashes_each_file_once_as_its_resolution_hands_its_verification_to_the_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fit(tmp_path, 8)
    hashed: Counter[tuple[str, str]] = Counter()
    real = LocalStore.digest

    def digest(self: LocalStore, checkpoint: Path, name: str, *args: Any) -> str:
        hashed[Path(checkpoint).name, name] += 1
        return real(self, checkpoint, name, *args)

    monkeypatch.setattr(LocalStore, "digest", digest)
    _, trainer = fit(tmp_path, 9, resume=True)
    assert Path(trainer.ckpt_path).name == "epoch=0-step=8"
    snapshot_files = {name for folder, name in hashed if folder == "epoch=0-step=8"}
    assert {SHARED_STATE_FILE, "rank-00000.pt"} <= snapshot_files
    assert all(count == 1 for count in hashed.values()), hashed  # the persistent step 5 verified once too


def test_a_damaged_newest_snapshot_is_skipped_for_the_one_before_it(tmp_path: Path) -> None:
    fit(tmp_path / "run", 8)
    newest = snapshot_dir_for(tmp_path / "run" / "ckpts", tmp_path / "run" / "shm") / "epoch=0-step=8"
    data = bytearray((newest / SHARED_STATE_FILE).read_bytes())
    data[-20] ^= 0xFF
    (newest / SHARED_STATE_FILE).write_bytes(bytes(data))
    resumed, trainer = fit(tmp_path / "run", 10, resume=True)
    assert Path(trainer.ckpt_path).name == "epoch=0-step=7"
    once, _ = fit(tmp_path / "once", 10)
    assert_bitwise_equal(once.state_dict(), resumed.state_dict(), "weights")


def fit_beside(root: Path, shm: Path, max_steps: int) -> tuple[BoringModel, Any]:
    """``fit`` with the snapshot folder outside the run directory, as ``/dev/shm`` is."""
    torch.manual_seed(0)
    model = BoringModel()
    trainer = make_trainer(root, max_steps, every_n_train_steps=5, snapshot_every_n_train_steps=1, snapshot_dir=shm)
    trainer.fit(model, ckpt_path="last")
    return model, trainer


def test_a_run_started_over_in_a_deleted_directory_never_resumes_the_deleted_runs_snapshots_as_plain_lightning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shm = tmp_path / "shm"
    fit_beside(tmp_path / "run", shm, 8)  # step 8 is only in the snapshot folder
    shutil.rmtree(tmp_path / "run")  # the user starts over
    # Plain Lightning, the control: with its checkpoints deleted, ckpt_path="last" starts at step 0.
    torch.manual_seed(0)
    plain = pl.Trainer(default_root_dir=tmp_path / "plain", max_steps=3, accelerator="cpu", logger=False,
                       enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                       callbacks=[ModelCheckpoint(dirpath=tmp_path / "plain" / "ckpts")])  # fmt: skip
    with pytest.warns(UserWarning, match="no last checkpoint available"):
        plain.fit(BoringModel(), ckpt_path="last")
    assert plain.ckpt_path is None and plain.global_step == 3
    with caplog.at_level(logging.WARNING):
        restarted, trainer = fit_beside(tmp_path / "run", shm, 3)
    assert trainer.ckpt_path is None and trainer.global_step == 3  # trained from step 0, as the control
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("not resuming from step snapshots of another run" in w and "holds none" in w for w in warnings)
    assert any("deleted 4 entries of another run" in w and "epoch=0-step=8" in w for w in warnings)
    fresh, _ = fit_beside(tmp_path / "fresh", tmp_path / "shm-fresh", 3)
    assert_bitwise_equal(fresh.state_dict(), restarted.state_dict(), "weights")
    # Its own snapshots, which now carry its token, are resumed as before.
    _, trainer = fit_beside(tmp_path / "run", shm, 4)
    assert Path(trainer.ckpt_path) == snapshot_dir_for(tmp_path / "run" / "ckpts", shm) / "epoch=0-step=3"


def test_a_snapshot_folder_whose_run_token_is_malformed_is_not_resumed_and_the_persistent_checkpoint_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shm = tmp_path / "shm"
    fit_beside(tmp_path / "run", shm, 8)
    folder = snapshot_dir_for(tmp_path / "run" / "ckpts", shm)
    (folder / LINEAGE_NAME).write_bytes(b"../../etc/passwd\n" + b"0" * 200)
    assert field_main(["ckpt", "list", str(tmp_path / "run" / "ckpts"), "--snapshot-dir", str(shm)]) == 0
    out = capsys.readouterr().out
    assert f"not listed: the snapshots in {folder} carry no run's token" in out and "snapshot " not in out
    assert "resumes from epoch=0-step=5 (persistent, step 5)" in out
    resumed, trainer = fit_beside(tmp_path / "run", shm, 10)
    assert trainer.ckpt_path == str(tmp_path / "run" / "ckpts" / "epoch=0-step=5")
    once, _ = fit_beside(tmp_path / "once", tmp_path / "shm-once", 10)
    assert_bitwise_equal(once.state_dict(), resumed.state_dict(), "weights")


class NoDirectoryFiles(LocalStore):
    """A user's store that keeps checkpoints' files only: nothing at the directory's own level."""

    def put(self, checkpoint: Path, name: str, data: bytes) -> None:
        if name == LINEAGE_NAME:
            raise KeyError(str(checkpoint))
        super().put(checkpoint, name, data)


def test_a_store_that_cannot_hold_the_run_token_trains_on_with_snapshots_off_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        _, trainer = fit(tmp_path, 7, store=NoDirectoryFiles())
    assert trainer.global_step == 7 and trainer.checkpoint_callback.snapshots.every_n_train_steps is None
    assert any("step snapshots are off for this run: cannot record the run token" in r.getMessage()
               and "KeyError" in r.getMessage() for r in caplog.records)  # fmt: skip
    assert not snapshot_dir_for(tmp_path / "ckpts", tmp_path / "shm").exists() or snapshots(tmp_path) == []
    assert [p.name for p in (tmp_path / "ckpts").iterdir() if p.is_dir()] == ["epoch=0-step=5"]


def test_a_snapshot_is_a_complete_recoverable_checkpoint_with_the_runs_manifest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        fit(tmp_path, 3)
    where = snapshot_dir_for(tmp_path / "ckpts", tmp_path / "shm")
    manifest = read_manifest(where / "epoch=0-step=3")
    assert manifest.recoverable and manifest.step == 3 and {"model", "optimizer", "rng", "data_position"} <= set(
        manifest.components
    )
    assert stat_mode(where) == stat_mode(where.parent) == 0o700
    assert any(f"a snapshot every 1 step(s) into {where}" in r.getMessage() for r in caplog.records)


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_a_snapshot_directory_another_user_could_write_is_refused_before_training(tmp_path: Path) -> None:
    shared = tmp_path / "shm" / f"lightning_field-snapshots-{os.getuid()}"
    shared.mkdir(parents=True)
    shared.chmod(0o777)  # as a folder someone else made for us in a world-writable /dev/shm
    with pytest.raises(PermissionError, match="is not a private directory of this user"):
        fit(tmp_path, 3)
    assert not (tmp_path / "ckpts").exists() or not any((tmp_path / "ckpts").iterdir())


def test_snapshot_every_n_train_steps_below_one_is_refused_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"snapshots.every_n_train_steps must be 'auto'.*an integer >= 1"):
        make_trainer(tmp_path, 3, snapshot_every_n_train_steps=0)


def test_wait_for_snapshot_copy_also_waits_for_a_pending_snapshots_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, trainer = fit(tmp_path, 2)
    waited: list[object] = []
    monkeypatch.setattr(AsyncSaves, "wait_for_snapshot_copy", lambda saves: waited.append(saves))
    trainer.checkpoint_callback.wait_for_snapshot_copy()
    assert len(set(map(id, waited))) == 2  # the persistent saves' writer and the snapshots'


def test_field_ckpt_list_shows_both_tiers_with_their_steps_and_marks_the_snapshot_a_restart_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fit(tmp_path, 8)  # persistent: step 5; snapshots: 7 and 8
    args = ["ckpt", "list", str(tmp_path / "ckpts"), "--snapshot-dir", str(tmp_path / "shm")]
    assert field_main([*args, "--verify"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert rows[0][:3] == ["name", "tier", "step"]
    assert [r[:4] for r in rows[1:4]] == [["epoch=0-step=8", "snapshot", "8", "recoverable"],
                                          ["epoch=0-step=7", "snapshot", "7", "recoverable"],
                                          ["epoch=0-step=5", "persistent", "5", "recoverable"]]  # fmt: skip
    assert rows[1][-2:] == ["<-", "resume"] and "<-" not in rows[2] + rows[3]
    assert rows[-1][-4:] == ["epoch=0-step=8", "(snapshot,", "step", "8)"]
    # A node's copy of a multi-node snapshot may hold only some files: it is shown as partial, never resumed.
    newest = snapshot_dir_for(tmp_path / "ckpts", tmp_path / "shm") / "epoch=0-step=8"
    (newest / SHARED_STATE_FILE).unlink()
    assert field_main(args) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert rows[1][:5] == ["epoch=0-step=8", "snapshot", "8", "partial", f"{len(read_manifest(newest).files) - 1}/"
                           f"{len(read_manifest(newest).files)}"] and "<-" not in rows[1]  # fmt: skip
    assert rows[2][:2] == ["epoch=0-step=7", "snapshot"] and rows[2][-2:] == ["<-", "resume"]


def test_a_snapshot_that_fails_to_commit_in_line_is_reported_and_training_and_persistent_saves_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(snapshot_tier, "commit_save", lambda job, group: "rank 0: the disk is full")
    with pytest.warns(UserWarning, match="Step snapshot failed: .*step=3.* the disk is full"):
        _, trainer = fit(tmp_path, 6)
    assert trainer.global_step == 6 and trainer.checkpoint_callback.snapshots.every_n_train_steps == 1
    failed = [e["step"] for e in read_events(tmp_path) if e["event"] == "ckpt_save_failed"]
    assert failed == [1, 2, 3, 4, 6]  # every snapshot; step 5 is the persistent save, which committed
    assert (tmp_path / "ckpts" / "epoch=0-step=5" / "manifest.json").is_file() and not snapshots(tmp_path)


def test_a_run_token_that_links_out_of_the_checkpoint_directory_is_no_token_and_no_snapshot_is_trusted(
    tmp_path: Path,
) -> None:
    fit(tmp_path, 8)
    folder = snapshot_dir_for(tmp_path / "ckpts", tmp_path / "shm")
    token = tmp_path / "ckpts" / LINEAGE_NAME
    outside = tmp_path / "elsewhere"
    outside.write_bytes(token.read_bytes())  # the right token, but read through a link out of the folder
    token.unlink()
    token.symlink_to(outside)
    assert lineage_mismatch(folder, LocalStore(), tmp_path / "ckpts") is not None  # type: ignore[arg-type]
    _, trainer = fit(tmp_path, 10, resume=True)
    assert trainer.ckpt_path == str(tmp_path / "ckpts" / "epoch=0-step=5")  # the persistent one, not snapshot 8
