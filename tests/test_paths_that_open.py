"""The paths ManifestCheckpoint advertises open wherever ModelCheckpoint's do.

``best_model_path``, ``last_model_path`` and ``best_k_models`` name ``<name>.ckpt`` files, as
ModelCheckpoint's do: ``Model.load_from_checkpoint(path)``, a user's own ``torch.load(path)`` and
``trainer.fit/validate/test/predict(ckpt_path=path)`` take them. Each is the committed checkpoint's
``state.pt`` under a second name beside its folder (a hard link): the folder stays the commit, and
where our code loads the path (the Trainer, ``field ckpt``, ``load_weights``) it verifies the
folder's hashes first. Each test runs plain Lightning beside it, so the comparison can fail.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_field import ManifestCheckpoint
from lightning_field.checkpoint import load_weights
from lightning_field.checkpoint.resolver import committed_checkpoints
from lightning_field.checkpoint.stores import checkpoint_location, read_manifest
from lightning_field.checkpoint.stores.local import advertise, advertised_checkpoint
from lightning_field.checkpoint.verify import CheckpointCorruptError
from lightning_field.cli.main import main as field_main

sys.path.insert(0, str(Path(__file__).parent / "jobs"))


class LoggedBoring(BoringModel):
    """Lightning's BoringModel, logging what a monitor needs."""

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> dict[str, torch.Tensor]:
        out = super().validation_step(batch, batch_idx)
        self.log("val_loss", out["x"])
        return out


def _trainer(callback: ModelCheckpoint, root: Path, max_steps: int = 12) -> Trainer:
    seed_everything(7)
    return Trainer(
        max_steps=max_steps, val_check_interval=4, limit_val_batches=2, callbacks=[callback],
        default_root_dir=root, logger=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip


def _fit(callback: ModelCheckpoint, root: Path) -> Trainer:
    trainer = _trainer(callback, root)
    trainer.fit(LoggedBoring())
    return trainer


def _relative(callback: ModelCheckpoint) -> dict[str, object]:
    def name(path: str) -> str:
        return os.path.relpath(path, callback.dirpath) if path else path

    return {
        "best": name(callback.best_model_path),
        "last": name(callback.last_model_path),
        "top_k": sorted(name(p) for p in callback.best_k_models),
    }


def _same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def _settings() -> dict[str, object]:
    return {"monitor": "val_loss", "save_top_k": 2, "save_last": True, "every_n_train_steps": 4}


def test_the_advertised_paths_are_modelcheckpoints_and_load_as_its_files_do(tmp_path: Path) -> None:
    plain = ModelCheckpoint(dirpath=tmp_path / "plain", **_settings())  # type: ignore[arg-type]
    ours = ManifestCheckpoint(dirpath=tmp_path / "ours", **_settings())  # type: ignore[arg-type]
    _fit(plain, tmp_path / "plain-root")
    trainer = _fit(ours, tmp_path / "ours-root")

    # save_last=True names the step's own checkpoint, not a second copy (docs/checkpoints.md, "Beside ModelCheckpoint").
    assert _relative(ours)["best"] == _relative(plain)["best"]
    assert _relative(ours)["top_k"] == _relative(plain)["top_k"]
    assert ours.best_model_path.endswith(".ckpt") and Path(ours.best_model_path).is_file()
    for attribute in ("best_model_path", "last_model_path"):
        mine, theirs = getattr(ours, attribute), getattr(plain, attribute)
        # A user's own torch.load, at torch's defaults (weights_only=True), and Lightning's documented way.
        _same_tensors(torch.load(mine)["state_dict"], torch.load(theirs)["state_dict"])
        _same_tensors(
            LoggedBoring.load_from_checkpoint(mine).state_dict(),
            LoggedBoring.load_from_checkpoint(theirs).state_dict(),
        )
        # What our readers take: the folder behind it, whose manifest names the same step.
        assert read_manifest(mine).step == torch.load(mine)["global_step"]
    # And the Trainer's own loads: the same metrics from either callback's best checkpoint.
    seed_everything(7)
    tested_ours = trainer.validate(LoggedBoring(), ckpt_path=ours.best_model_path, verbose=False)
    seed_everything(7)
    tested_plain = trainer.validate(LoggedBoring(), ckpt_path=plain.best_model_path, verbose=False)
    assert tested_ours == tested_plain


def test_a_resume_from_best_model_path_verifies_the_folder_and_refuses_a_damaged_file_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ours = ManifestCheckpoint(dirpath=tmp_path / "ckpts", **_settings())  # type: ignore[arg-type]
    _fit(ours, tmp_path)
    advertised = Path(ours.best_model_path)
    folder = checkpoint_location(advertised)
    assert folder == advertised.with_suffix("") and (folder / "manifest.json").is_file()

    # A hard link: writing through the advertised name changes the committed bytes, and every load
    # of ours sees it before anything is unpickled.
    data = bytearray(advertised.read_bytes())
    data[len(data) // 2] ^= 0xFF
    with open(advertised, "r+b") as file:
        file.write(data)
    resumed = _trainer(ManifestCheckpoint(dirpath=tmp_path / "ckpts"), tmp_path, max_steps=16)
    with pytest.raises(CheckpointCorruptError, match=r"state\.pt"):
        resumed.fit(LoggedBoring(), ckpt_path=str(advertised))
    with pytest.raises(CheckpointCorruptError, match=r"state\.pt"):
        load_weights(advertised)
    assert field_main(["ckpt", "verify", str(advertised)]) != 0
    assert "state.pt" in capsys.readouterr().out


def test_retention_removes_a_checkpoint_with_its_advertised_file_and_nothing_else_of_that_name(
    tmp_path: Path,
) -> None:
    ours = ManifestCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=4)  # save_top_k=1: the newest only
    _fit(ours, tmp_path)
    names = sorted(p.name for p in (tmp_path / "ckpts").iterdir() if not p.name.startswith((".", "LAST", "SNAP")))
    assert names == ["epoch=0-step=12", "epoch=0-step=12.ckpt"]

    # Someone else's file of an advertised name is not ours: neither read as the checkpoint nor removed with it.
    folder = tmp_path / "ckpts" / "epoch=0-step=12"
    foreign = tmp_path / "ckpts" / "epoch=0-step=12.pt"
    foreign.write_bytes(b"not a checkpoint")
    assert advertised_checkpoint(foreign) is None and checkpoint_location(foreign) == foreign
    assert advertised_checkpoint(folder.with_name(folder.name + ".ckpt")) == folder
    ours.checkpointer.store_at(folder).remove(folder)
    assert foreign.exists() and not folder.exists() and not folder.with_name(folder.name + ".ckpt").exists()


def test_advertising_replaces_the_name_atomically_and_skips_a_checkpoint_without_state_pt(tmp_path: Path) -> None:
    folder = tmp_path / "epoch=0-step=4"
    folder.mkdir()
    (folder / "state.pt").write_bytes(b"first")
    (folder / "manifest.json").write_text("{}")
    advertised = advertise(folder)
    assert advertised == tmp_path / "epoch=0-step=4.ckpt" and advertised.read_bytes() == b"first"
    # A save of the same name publishes a new folder: the name follows it, never half of each.
    (folder / "state.pt").unlink()
    (folder / "state.pt").write_bytes(b"second")
    assert advertise(folder) == advertised and advertised.read_bytes() == b"second"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    assert advertise(sharded) is None and not (tmp_path / "sharded.ckpt").exists()


def test_a_lightning_cli_script_loads_its_best_model_from_the_path_the_callback_names(tmp_path: Path) -> None:
    pytest.importorskip("jsonargparse", reason="LightningCLI needs the jsonargparse[signatures] test extra")
    from conformance_job import UserClassifier, UserData
    from lightning.pytorch.cli import LightningCLI

    loaded = {}
    for name, target in (("plain", "lightning.pytorch.callbacks.ModelCheckpoint"),
                         ("ours", "lightning_field.ManifestCheckpoint")):  # fmt: skip
        seed_everything(3)
        cli = LightningCLI(
            UserClassifier, UserData, save_config_callback=None,
            args=[
                "fit", f"--trainer.default_root_dir={tmp_path / name}", "--trainer.logger=false",
                "--trainer.max_epochs=2", "--trainer.enable_progress_bar=false",
                f"--trainer.callbacks+={target}", f"--trainer.callbacks.dirpath={tmp_path / name / 'ckpts'}",
                "--trainer.callbacks.monitor=val_loss", "--seed_everything=3",
            ],
        )  # fmt: skip
        callback = next(cb for cb in cli.trainer.callbacks if isinstance(cb, ModelCheckpoint))
        assert callback.best_model_path.endswith(".ckpt"), callback.best_model_path
        best = callback.best_model_path
        loaded[name] = (Path(best).name, UserClassifier.load_from_checkpoint(best))
    assert loaded["ours"][0] == loaded["plain"][0]
    _same_tensors(loaded["ours"][1].state_dict(), loaded["plain"][1].state_dict())


@pytest.mark.parametrize(("save_last", "async_save"), [(True, False), ("link", False), (True, True)])
def test_save_last_names_the_newest_checkpoint_last_as_modelcheckpoint_does_and_a_resume_from_it_is_exact(
    tmp_path: Path, save_last: bool | str, async_save: bool
) -> None:
    settings = {"monitor": "step", "mode": "max", "save_top_k": 2, "every_n_train_steps": 4, "save_last": save_last}
    plain = ModelCheckpoint(dirpath=tmp_path / "plain", **settings)  # type: ignore[arg-type]
    ours = ManifestCheckpoint(dirpath=tmp_path / "ours", async_save=async_save, **settings)  # type: ignore[arg-type]
    _fit(plain, tmp_path / "plain-root")
    uninterrupted = _fit(ours, tmp_path / "ours-root").lightning_module.state_dict()

    assert _relative(ours) == _relative(plain)
    assert os.path.islink(ours.last_model_path) == os.path.islink(plain.last_model_path) == (save_last == "link")
    # As ModelCheckpoint's: its real path is the last checkpoint saved (for True, the last file itself).
    assert os.path.realpath(ours.last_model_path) == ours._last_checkpoint_saved
    assert torch.load(ours.last_model_path)["global_step"] == torch.load(plain.last_model_path)["global_step"] == 12
    # Behind the name: the newest committed folder, verified on load like any of ours.
    assert checkpoint_location(ours.last_model_path) == tmp_path / "ours" / "epoch=0-step=12"

    # A run stopped at step 8 and continued from its last_model_path ends where the uninterrupted one did.
    shortened = ManifestCheckpoint(dirpath=tmp_path / "again", async_save=async_save, **settings)  # type: ignore[arg-type]
    first = _trainer(shortened, tmp_path / "again-root", max_steps=8)
    first.fit(LoggedBoring())
    resumed = _trainer(ManifestCheckpoint(dirpath=tmp_path / "again", **settings), tmp_path / "again-root")  # type: ignore[arg-type]
    resumed.fit(LoggedBoring(), ckpt_path=shortened.last_model_path)
    _same_tensors(resumed.lightning_module.state_dict(), uninterrupted)


@pytest.mark.parametrize("save_last", [True, "link"])
def test_a_last_name_that_changes_each_epoch_leaves_only_the_newest_as_modelcheckpoint_does(
    tmp_path: Path, save_last: bool | str
) -> None:
    class LastOfEachEpoch(ManifestCheckpoint):
        CHECKPOINT_NAME_LAST = "last-{epoch}"

    class PlainLastOfEachEpoch(ModelCheckpoint):
        CHECKPOINT_NAME_LAST = "last-{epoch}"

    def listed(callback: ModelCheckpoint) -> list[str]:
        return sorted(p.name for p in Path(callback.dirpath).iterdir() if p.is_file() and p.suffix == ".ckpt")

    runs = []
    for kind in (PlainLastOfEachEpoch, LastOfEachEpoch):
        seed_everything(7)
        callback = kind(dirpath=tmp_path / kind.__name__, monitor="val_loss", save_top_k=-1, save_last=save_last)
        trainer = Trainer(max_epochs=3, limit_train_batches=4, limit_val_batches=2, callbacks=[callback],
                          default_root_dir=tmp_path, logger=False, enable_progress_bar=False)  # fmt: skip
        trainer.fit(LoggedBoring())
        runs.append((listed(callback), Path(callback.last_model_path).name))
    assert runs[1] == runs[0] and runs[0][1] == "last-epoch=2.ckpt"


def test_an_object_store_checkpoints_paths_open_as_model_checkpoints_do(
    tmp_path: Path, s3_bucket: tuple[str, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ``s3://``: ModelCheckpoint advertises ``<name>.ckpt`` objects; ours advertises the committed
    prefix's ``state.pt`` (the same Lightning checkpoint, with no second copy of its bytes), which
    Lightning's own loads open through fsspec and ours verify as the prefix."""
    import fsspec

    bucket, options = s3_bucket
    monkeypatch.setenv("AWS_ENDPOINT_URL", options["endpoint_url"])  # Lightning's loads pass no storage options
    weights: dict[str, dict[str, torch.Tensor]] = {}
    last_steps: dict[str, int] = {}
    for kind in ("plain", "field"):
        dirpath = f"{bucket}/{kind}"
        callback = (
            ModelCheckpoint(dirpath=dirpath, monitor="val_loss", save_last=True)
            if kind == "plain"
            else ManifestCheckpoint(dirpath=dirpath, monitor="val_loss", save_last=True, storage_options=options)
        )
        trainer = _fit(callback, tmp_path / kind)
        best, last = callback.best_model_path, callback.last_model_path
        assert best.startswith(dirpath) and last.startswith(dirpath)
        weights[kind] = LoggedBoring.load_from_checkpoint(best).state_dict()
        with fsspec.open(last, "rb") as file:
            last_steps[kind] = torch.load(file, weights_only=True)["global_step"]
        assert trainer.validate(LoggedBoring(), ckpt_path=best, verbose=False)
        if kind == "field":
            assert read_manifest(checkpoint_location(best), storage_options=options).step > 0
            # Retention by the prefix behind each name: the top 1 and the last are all that is left.
            kept = {str(entry.path) for entry in committed_checkpoints(dirpath, storage_options=options)}
            assert kept == {str(checkpoint_location(best)), str(checkpoint_location(last))}
            # A damaged byte in the advertised object is refused by name where our code loads it.
            fs = fsspec.filesystem("s3", **options)
            data = bytearray(fs.cat(best))
            data[len(data) // 2] ^= 0xFF
            fs.pipe(best, bytes(data))
            with pytest.raises(CheckpointCorruptError, match=r"state\.pt"):
                trainer.validate(LoggedBoring(), ckpt_path=best, verbose=False)
    assert last_steps["field"] == last_steps["plain"]
    assert weights["field"].keys() == weights["plain"].keys()
    for key, value in weights["plain"].items():
        assert torch.equal(weights["field"][key], value), key
