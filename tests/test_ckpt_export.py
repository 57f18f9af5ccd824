"""``field ckpt export CKPT OUT`` and ``load_weights``: a checkpoint's model weights out to inference.

Lightning's own ``BoringModel``, trained a few steps with ``ManifestCheckpoint`` beside the same run
under Lightning's ``ModelCheckpoint``: the exported file loads with plain ``safetensors`` / ``torch``
code into a fresh module, bitwise equal to what Lightning itself saved. A damaged or forged checkpoint
is refused by name, with nothing written."""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
import torch.distributed.checkpoint as dcp
from conftest import assert_bitwise_equal, rewrite_shared_state
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from safetensors.torch import load_file

from lightning_field import CheckpointCorruptError, ManifestCheckpoint, UnsafeCheckpointError, load_weights
from lightning_field.checkpoint import export
from lightning_field.cli import ckpt_export
from lightning_field.cli.main import main as field_main
from lightning_field.core.hashing import hash_file
from lightning_field.core.manifest import FileEntry, read_manifest

SEED = 7


class CompiledBoringModel(BoringModel):
    """A user's module that compiles its layer: its keys read ``layer._orig_mod.weight``."""

    def __init__(self) -> None:
        super().__init__()
        # The eager backend: torch.compile's real wrapper (and keys), without a C++ toolchain on CPU.
        self.layer = torch.compile(self.layer, backend="eager")  # type: ignore[assignment]


class RunsAShellCommand:
    """What a forger puts in a pickle: unpickling it calls ``os.system``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _fit(root: Path, model: pl.LightningModule, steps: int, callback: pl.Callback) -> dict[str, torch.Tensor]:
    """Fit ``model`` from seed :data:`SEED` on the CPU; its trained weights, copied."""
    trainer = pl.Trainer(
        default_root_dir=root,
        max_steps=steps,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[callback],
    )
    trainer.fit(model)
    return {key: value.detach().clone() for key, value in model.state_dict().items()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same 4 steps of BoringModel under ManifestCheckpoint and under plain Lightning's ModelCheckpoint."""
    root = tmp_path_factory.mktemp("boring")
    pl.seed_everything(SEED)
    manifest = ManifestCheckpoint(dirpath=root / "ckpts", snapshot_every_n_train_steps=None, every_n_train_steps=2)
    trained = _fit(root / "field", BoringModel(), 4, manifest)
    pl.seed_everything(SEED)
    plain = ModelCheckpoint(dirpath=root / "plain", every_n_train_steps=2, save_top_k=-1)
    plain_trained = _fit(root / "lightning", BoringModel(), 4, plain)
    return {
        "checkpoint": root / "ckpts" / "epoch=0-step=4",
        "trained": trained,
        "plain_trained": plain_trained,
        "plain_ckpt": root / "plain" / "epoch=0-step=4.ckpt",
    }


def _read(out: Path, fmt: str) -> dict[str, torch.Tensor]:
    """The exported file, read the way a user's plain code would."""
    return load_file(out) if fmt == "safetensors" else torch.load(out, weights_only=True)


@pytest.mark.parametrize("fmt", ["safetensors", "torch"])
def test_the_exported_weights_are_what_lightning_saved_and_load_bitwise_into_a_fresh_module(
    runs: dict[str, Any], tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / f"model.{fmt}"
    assert field_main(["ckpt", "export", str(runs["checkpoint"]), str(out), "--format", fmt]) == 0
    said = capsys.readouterr().out
    assert f"wrote {out} ({fmt}): 2 tensors, 264 bytes of weights" in said and "step 4" in said, said

    exported = _read(out, fmt)
    lightning_saved = torch.load(runs["plain_ckpt"], weights_only=True)["state_dict"]
    assert_bitwise_equal(runs["trained"], runs["plain_trained"], "the two runs")  # ManifestCheckpoint is invisible
    assert_bitwise_equal(dict(lightning_saved), exported, "export vs ModelCheckpoint's .ckpt")
    fresh = BoringModel()
    fresh.load_state_dict(exported)  # strict: every key, no extra
    assert_bitwise_equal(runs["trained"], fresh.state_dict(), "fresh module")
    assert_bitwise_equal(dict(lightning_saved), load_weights(runs["checkpoint"]), "load_weights")
    assert [p.name for p in tmp_path.iterdir()] == [out.name], "no temporary file left beside it"


def test_a_compiled_modules_orig_mod_segments_are_stripped_so_the_plain_module_loads_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pl.seed_everything(SEED)
    callback = ManifestCheckpoint(dirpath=tmp_path / "ckpts", snapshot_every_n_train_steps=None, every_n_train_steps=2)
    trained = _fit(tmp_path, CompiledBoringModel(), 2, callback)
    assert sorted(trained) == ["layer._orig_mod.bias", "layer._orig_mod.weight"]
    checkpoint = tmp_path / "ckpts" / "epoch=0-step=2"

    as_saved, stripped = tmp_path / "as-saved.safetensors", tmp_path / "plain.safetensors"
    assert field_main(["ckpt", "export", str(checkpoint), str(as_saved)]) == 0
    assert field_main(["ckpt", "export", str(checkpoint), str(stripped), "--strip-compile-prefix"]) == 0
    assert "keys renamed: 2 (removed torch.compile's '_orig_mod.' segments)" in capsys.readouterr().out

    compiled = CompiledBoringModel()
    compiled.load_state_dict(load_file(as_saved))  # without the flag: the keys the compiled class has
    plain = BoringModel()
    plain.load_state_dict(load_file(stripped))
    assert_bitwise_equal({k.replace("_orig_mod.", ""): v for k, v in trained.items()}, plain.state_dict())
    assert_bitwise_equal(load_file(stripped), load_weights(checkpoint, strip_compile_prefix=True))


def test_strip_prefix_leaves_the_inner_networks_keys_and_a_prefix_no_key_has_is_refused(
    runs: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "layer.pt"
    args = ["ckpt", "export", str(runs["checkpoint"]), str(out), "--format", "torch"]
    assert field_main([*args, "--strip-prefix", "layer."]) == 0
    assert "keys renamed: 2 (removed prefix 'layer.')" in capsys.readouterr().out
    linear = torch.nn.Linear(32, 2)
    linear.load_state_dict(torch.load(out, weights_only=True))
    assert_bitwise_equal({k.removeprefix("layer."): v for k, v in runs["trained"].items()}, linear.state_dict())

    out.unlink()
    assert field_main([*args, "--strip-prefix", "model."]) == 1
    err = capsys.readouterr().err
    assert "REFUSED" in err and "no key starts with 'model.' (the keys start with layer.)" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_damaged_checkpoint_is_refused_by_name_and_the_file_there_before_is_left_as_it_was(
    runs: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = tmp_path / "ckpts" / runs["checkpoint"].name
    shutil.copytree(runs["checkpoint"], checkpoint)
    _flip_a_byte(checkpoint / "state.pt")
    exports = tmp_path / "exports"
    exports.mkdir()
    earlier = exports / "model.safetensors"
    earlier.write_bytes(b"an earlier export")

    assert field_main(["ckpt", "export", str(checkpoint), str(earlier)]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1, captured.err
    assert captured.err.startswith(f"field ckpt export: REFUSED {checkpoint}: ")
    assert f"{checkpoint}/state.pt: content hash" in captured.err and "nothing written" in captured.err
    assert earlier.read_bytes() == b"an earlier export" and [p.name for p in exports.iterdir()] == [earlier.name]
    with pytest.raises(CheckpointCorruptError, match=r"state\.pt: content hash"):
        load_weights(checkpoint)


def test_a_malformed_manifest_or_a_folder_of_checkpoints_is_refused_in_one_line(
    runs: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = tmp_path / runs["checkpoint"].name
    shutil.copytree(runs["checkpoint"], checkpoint)
    (checkpoint / "manifest.json").write_text("{")
    out = tmp_path / "model.safetensors"
    for path in (checkpoint, runs["checkpoint"].parent):
        assert field_main(["ckpt", "export", str(path), str(out)]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"field ckpt export: REFUSED {path}: {path}/manifest.json: ") and err.count("\n") == 1
    assert not out.exists()


def test_an_out_that_cannot_be_written_is_said_in_one_line_and_nothing_is_left_beside_it(
    runs: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for out, said in (
        (tmp_path / "missing" / "model.safetensors", "its directory does not exist"),
        (tmp_path, "a directory"),
    ):
        assert field_main(["ckpt", "export", str(runs["checkpoint"]), str(out)]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"field ckpt export: cannot export {runs['checkpoint']} to {out}: ") and said in err
        assert err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_a_forged_pickle_in_state_pt_is_refused_naming_it_and_runs_nothing(
    runs: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "the-forgers-command-ran"
    checkpoint = tmp_path / runs["checkpoint"].name
    shutil.copytree(runs["checkpoint"], checkpoint)
    rewrite_shared_state(checkpoint, lambda state: state["callbacks"].update(forged=RunsAShellCommand(marker)))
    out = tmp_path / "model.safetensors"
    assert field_main(["ckpt", "export", str(checkpoint), str(out)]) == 1
    err = capsys.readouterr().err
    assert f"REFUSED {checkpoint}: {checkpoint}/state.pt cannot be loaded without a full unpickle" in err
    assert "GLOBAL posix.system" in err and "opt in: --trust-pickles; nothing written" in err
    with pytest.raises(UnsafeCheckpointError, match=r"posix\.system"):
        load_weights(checkpoint)
    assert not marker.exists() and not out.exists()


def _as_dcp_checkpoint(source: Path, checkpoint: Path, model_state: dict[str, Any]) -> None:
    """``source`` copied to ``checkpoint`` with its ``state.pt`` replaced by a DCP checkpoint of ``model_state``
    and the manifest rewritten to match, as anyone who can write the directory could."""
    shutil.copytree(source, checkpoint)
    (checkpoint / "state.pt").unlink()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to save in a single process")
        dcp.save({"state_dict": model_state}, storage_writer=dcp.FileSystemWriter(checkpoint), no_dist=True)
    manifest = read_manifest(checkpoint)
    del manifest.files["state.pt"]
    for name in ("__0_0.distcp", ".metadata"):
        manifest.files[name] = FileEntry(*hash_file(checkpoint / name), rank=0, contents=["model"])
    manifest.sign(None)
    manifest.write(checkpoint)


def test_a_dcp_checkpoints_non_tensor_entries_load_as_untrusted_input(
    runs: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # DCP's own planner unpickles non-tensor entries with weights_only=False: a forged one would run.
    marker = tmp_path / "the-forgers-command-ran"
    forged = tmp_path / "forged" / runs["checkpoint"].name
    _as_dcp_checkpoint(runs["checkpoint"], forged, {**runs["trained"], "layer._extra_state": RunsAShellCommand(marker)})
    out = tmp_path / "model.pt"
    assert field_main(["ckpt", "export", str(forged), str(out), "--format", "torch"]) == 1
    err = capsys.readouterr().err
    assert f"{forged} (DCP entry state_dict.layer._extra_state) cannot be loaded without a full unpickle" in err
    assert "GLOBAL posix.system" in err and not marker.exists() and not out.exists()

    # A plain value there is read back, kept by --format torch and named by safetensors' refusal.
    benign = tmp_path / "benign" / runs["checkpoint"].name
    _as_dcp_checkpoint(runs["checkpoint"], benign, {**runs["trained"], "layer._extra_state": {"scale": 2}})
    assert field_main(["ckpt", "export", str(benign), str(out), "--format", "torch"]) == 0
    assert "from the sharded (DCP) checkpoint" in capsys.readouterr().out
    assert_bitwise_equal({**runs["trained"], "layer._extra_state": {"scale": 2}}, torch.load(out, weights_only=True))
    assert field_main(["ckpt", "export", str(benign), str(tmp_path / "model.safetensors")]) == 1
    assert "other values at 'layer._extra_state'; write it with --format torch" in capsys.readouterr().err
    assert not (tmp_path / "model.safetensors").exists()


def test_tied_weights_are_written_apart_in_safetensors_and_load_strictly(tmp_path: Path) -> None:
    shared = torch.arange(6.0).reshape(2, 3)
    written = export.write_weights(
        {"embed.weight": shared, "head.weight": shared}, tmp_path / "tied.st", "safetensors", 0
    )
    assert written.untied == ["head.weight"] and written.tensors == 2
    assert_bitwise_equal({"embed.weight": shared, "head.weight": shared}, load_file(tmp_path / "tied.st"))


def test_the_command_line_offers_the_formats_the_writer_writes() -> None:
    assert ckpt_export.FORMATS == export.FORMATS


@pytest.mark.slow  # two gloo ranks in child processes
def test_a_sharded_fsdp2_checkpoint_is_assembled_whole_and_equals_the_runs_gathered_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from conftest import run_train_job  # only this test starts the training job

    from lightning_field.workloads.demo import DemoShardedRegressor

    final = tmp_path / "final.pt"
    run_train_job(tmp_path / "run", final, "--sharded", "--devices", "2", "--max-steps", "4", "--every", "2",
                  "--no-snapshots")  # fmt: skip
    # The job's own full state at its end (step 4), gathered by torch's get_state_dict(full_state_dict=True).
    gathered = torch.load(final, weights_only=True)["state_dict"]
    (checkpoint,) = (tmp_path / "run" / "checkpoints").glob("epoch=*-step=4")
    assert {".metadata", "__0_0.distcp", "__1_0.distcp"} <= set(read_manifest(checkpoint).files)

    for fmt in export.FORMATS:
        out = tmp_path / f"model.{fmt}"
        assert field_main(["ckpt", "export", str(checkpoint), str(out), "--format", fmt]) == 0
        assert f"4 tensors, {sum(t.nbytes for t in gathered.values()):,} bytes of weights" in capsys.readouterr().out
        exported = _read(out, fmt)
        assert_bitwise_equal(dict(gathered), exported, fmt)
        fresh = DemoShardedRegressor()  # not sharded: configure_model never ran
        fresh.load_state_dict(exported)
        assert_bitwise_equal(dict(gathered), fresh.state_dict(), f"{fmt}, fresh module")
    assert_bitwise_equal(dict(gathered), load_weights(checkpoint), "load_weights")

    _flip_a_byte(checkpoint / "__1_0.distcp")
    assert field_main(["ckpt", "export", str(checkpoint), str(tmp_path / "damaged.pt")]) == 1
    assert f"{checkpoint}/__1_0.distcp: content hash" in capsys.readouterr().err
    assert not (tmp_path / "damaged.pt").exists()
