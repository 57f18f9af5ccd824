"""Checkpoints read back from storage others can write are loaded as data, never run as code.

A forger who can write the checkpoint directory rewrites a payload and its manifest together, so
every hash still matches: only the load itself can refuse them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from conftest import assert_bitwise_equal, make_trainer, rewrite_shared_state
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from omegaconf import DictConfig, OmegaConf

from lightning_field import (
    CheckpointCorruptError,
    UnsafeCheckpointError,
    latest_recoverable,
    load_weights,
    read_manifest,
    verify_checkpoint,
)
from lightning_field.checkpoint import read_last_pointer
from lightning_field.checkpoint.safe_load import check_dcp_metadata
from lightning_field.cli.main import main as field_main
from lightning_field.core.manifest import MANIFEST_NAME, SHARED_STATE_FILE, ManifestError


class RunsAShellCommand:
    """What a forger puts in a pickle: unpickling it calls ``os.system``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


@dataclass
class UserSpec:
    name: str
    size: int


class SpecCallback(Callback):
    """A user's callback whose state is an object of the user's own type."""

    def __init__(self) -> None:
        self.loaded: UserSpec | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"spec": UserSpec("a", 3)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.loaded = state_dict["spec"]


class ConfiguredModel(BoringModel):
    """A user's module configured by Hydra: ``save_hyperparameters`` keeps the DictConfig."""

    def __init__(self, config: DictConfig | None = None, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()


def _config() -> DictConfig:
    return OmegaConf.create({"optimizer": {"lr": 0.1, "betas": [0.9, 0.99]}, "layers": 2})


def _fit(root: Path, steps: int, ckpt_path: str | None = None, callbacks: list[Callback] = (), **options: Any) -> Any:
    pl.seed_everything(0)
    trainer = make_trainer(root, steps, **options)
    trainer.callbacks.extend(callbacks)
    model = ConfiguredModel(_config())
    trainer.fit(model, ckpt_path=ckpt_path)
    return trainer, model


def test_a_module_with_omegaconf_hparams_resumes_exactly_under_weights_only_where_plain_lightning_refuses(
    tmp_path: Path,
) -> None:
    _, uninterrupted = _fit(tmp_path / "whole", 4)
    _fit(tmp_path / "cut", 2)
    _, resumed = _fit(tmp_path / "cut", 4, ckpt_path=str(tmp_path / "cut" / "ckpts" / "epoch=0-step=2"))
    assert_bitwise_equal(resumed.state_dict(), uninterrupted.state_dict())

    pl.seed_everything(0)
    plain = pl.Trainer(default_root_dir=tmp_path / "plain", max_steps=2, logger=False, enable_progress_bar=False,
                       callbacks=[ModelCheckpoint(dirpath=tmp_path / "plain", every_n_train_steps=2)])  # fmt: skip
    plain.fit(ConfiguredModel(_config()))
    again = pl.Trainer(default_root_dir=tmp_path / "plain", max_steps=4, logger=False, enable_progress_bar=False)
    with pytest.raises(Exception, match="Weights only load failed"):
        again.fit(ConfiguredModel(_config()), ckpt_path=str(tmp_path / "plain" / "epoch=0-step=2.ckpt"))


def test_a_forged_checkpoint_whose_pickle_calls_os_system_is_refused_naming_it_and_runs_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "the-forgers-command-ran"
    _fit(tmp_path, 2)
    checkpoint = tmp_path / "ckpts" / "epoch=0-step=2"
    rewrite_shared_state(checkpoint, lambda state: state["callbacks"].update(forged=RunsAShellCommand(marker)))
    assert verify_checkpoint(checkpoint).intact  # the hashes cannot tell: the manifest was forged too

    with pytest.raises(UnsafeCheckpointError, match=r"epoch=0-step=2/state\.pt .*GLOBAL posix\.system") as refused:
        _fit(tmp_path, 4, ckpt_path=str(checkpoint))
    assert "trust_pickles=True" in str(refused.value) and "add_safe_globals" in str(refused.value)
    with pytest.raises(UnsafeCheckpointError, match=r"posix\.system"):
        load_weights(checkpoint)
    assert field_main(["ckpt", "verify", str(checkpoint)]) == 0
    assert field_main(["ckpt", "inspect", str(checkpoint)]) == 0
    capsys.readouterr()
    assert not marker.exists(), "a load, a verification or an inspection ran the forger's command"
    assert checkpoint.is_dir(), "the refused checkpoint is kept, for whoever investigates it"


def test_a_users_own_type_in_callback_state_is_refused_by_name_until_registered_or_trusted(tmp_path: Path) -> None:
    _fit(tmp_path, 2, callbacks=[SpecCallback()])
    checkpoint = str(tmp_path / "ckpts" / "epoch=0-step=2")
    with pytest.raises(UnsafeCheckpointError, match=r"GLOBAL test_untrusted_checkpoints\.UserSpec"):
        _fit(tmp_path, 4, ckpt_path=checkpoint, callbacks=[SpecCallback()])

    registered = SpecCallback()
    with torch.serialization.safe_globals([UserSpec]):
        trainer, _ = _fit(tmp_path, 4, ckpt_path=checkpoint, callbacks=[registered])
    assert registered.loaded == UserSpec("a", 3) and trainer.global_step == 4

    trusted = SpecCallback()
    trainer, _ = _fit(tmp_path, 4, ckpt_path=checkpoint, callbacks=[trusted], trust_pickles=True)
    assert trusted.loaded == UserSpec("a", 3) and trainer.global_step == 4


@pytest.mark.parametrize(
    "name", ["../../etc/passwd", "/etc/passwd", "ok/../../../etc/passwd", "./state.pt", "a//b", "a\\..\\b", "a\x00b"]
)
def test_a_manifest_naming_a_path_outside_its_checkpoint_is_refused_naming_it(tmp_path: Path, name: str) -> None:
    _fit(tmp_path, 4)
    older, forged = tmp_path / "ckpts" / "epoch=0-step=2", tmp_path / "ckpts" / "epoch=0-step=4"
    document = json.loads((forged / MANIFEST_NAME).read_text())
    document["files"][name] = document["files"].pop(SHARED_STATE_FILE)
    (forged / MANIFEST_NAME).write_text(json.dumps(document))

    with pytest.raises(ManifestError, match=rf"{re.escape(str(forged / MANIFEST_NAME))}: names .*which would leave"):
        read_manifest(forged)
    report = verify_checkpoint(forged)
    assert not report.intact and "would leave the checkpoint directory" in report.problems[0]
    assert latest_recoverable(tmp_path / "ckpts") == older


def test_a_symlink_out_of_the_checkpoint_or_a_device_in_it_is_refused_and_never_read(tmp_path: Path) -> None:
    _fit(tmp_path, 2)
    checkpoint = tmp_path / "ckpts" / "epoch=0-step=2"
    # The same bytes outside: the hash would pass, so only the path check can refuse it.
    outside = tmp_path / "elsewhere.pt"
    rank_file = checkpoint / "rank-00000.pt"
    shutil.copyfile(rank_file, outside)
    rank_file.unlink()
    rank_file.symlink_to(outside)
    (checkpoint / SHARED_STATE_FILE).unlink()
    (checkpoint / SHARED_STATE_FILE).symlink_to("/dev/zero")

    problems = verify_checkpoint(checkpoint).problems
    assert any(f"a symlink to {outside}, outside the directory" in p for p in problems), problems
    assert any("state.pt: a symlink to /dev/zero" in p or "not a regular file" in p for p in problems), problems
    with pytest.raises(CheckpointCorruptError, match="outside the directory"):
        _fit(tmp_path, 4, ckpt_path=str(checkpoint))
    assert latest_recoverable(tmp_path / "ckpts") is None


def test_a_last_pointer_naming_a_path_outside_its_directory_is_ignored(tmp_path: Path) -> None:
    _fit(tmp_path, 2)
    (tmp_path / "ckpts" / "LAST").write_text("../../etc\n")
    assert read_last_pointer(tmp_path / "ckpts") is None
    (tmp_path / "ckpts" / "LAST").write_text("epoch=0-step=2\n")
    assert read_last_pointer(tmp_path / "ckpts") == tmp_path / "ckpts" / "epoch=0-step=2"


def test_dcp_metadata_is_built_from_dcp_records_only_and_may_point_only_at_listed_files(tmp_path: Path) -> None:
    import pickle

    import torch.distributed.checkpoint as dcp

    dcp.save({"model": {"w": torch.randn(3, 4)}, "step": 3}, checkpoint_id=str(tmp_path / "dcp"))
    metadata = tmp_path / "dcp" / ".metadata"
    shards = [p.name for p in (tmp_path / "dcp").iterdir() if p.suffix == ".distcp"]
    check_dcp_metadata(metadata, shards, trust_pickles=False)  # DCP's own metadata passes

    with pytest.raises(UnsafeCheckpointError, match=r"points reads at '__0_0\.distcp'.*not a file of this"):
        check_dcp_metadata(metadata, [], trust_pickles=False)
    marker = tmp_path / "the-forgers-command-ran"
    metadata.write_bytes(pickle.dumps(RunsAShellCommand(marker)))
    with pytest.raises(UnsafeCheckpointError, match=r"GLOBAL posix\.system") as refused:
        check_dcp_metadata(metadata, shards, trust_pickles=False)
    assert "add_safe_globals" not in str(refused.value)  # torch's allow-list does not reach DCP's pickle
    assert not marker.exists()


def test_a_manifest_declaring_a_10_gb_file_is_refused_by_its_size_without_reading_it(tmp_path: Path) -> None:
    _fit(tmp_path, 2)
    checkpoint = tmp_path / "ckpts" / "epoch=0-step=2"
    document = json.loads((checkpoint / MANIFEST_NAME).read_text())
    document["files"][SHARED_STATE_FILE]["size"] = 10 * 1024**3
    (checkpoint / MANIFEST_NAME).write_text(json.dumps(document))
    read: list[int] = []
    problems = verify_checkpoint(checkpoint, progress=lambda done, total: read.append(done)).problems
    assert any("manifest says 10737418240 (truncated or extended)" in p for p in problems), problems
    only_the_rank_file = (checkpoint / "rank-00000.pt").stat().st_size
    assert read and read[-1] == only_the_rank_file, "a file whose size is wrong was hashed anyway"
    with pytest.raises(CheckpointCorruptError, match="10737418240"):
        _fit(tmp_path, 4, ckpt_path=str(checkpoint))


LOAD_IN_A_FRESH_PROCESS = """
import sys
from lightning_field.checkpoint.safe_load import torch_load_untrusted
for path in sys.argv[1:]:
    before = "lightning" in sys.modules
    try:
        held = torch_load_untrusted(path)["held"]
        name = held.__name__ if isinstance(held, type) else type(held).__name__
        print(path, "loaded", name, "lightning imported before", before)
    except Exception as err:
        print(path, "refused", type(err).__name__, err)
"""


@pytest.mark.slow  # fresh interpreters: the suite's own has Lightning imported already
def test_lightnings_attribute_dict_loads_where_lightning_is_not_imported_yet_and_is_refused_by_name_where_absent(
    tmp_path: Path,
) -> None:
    from lightning.fabric.utilities.data import AttributeDict

    from lightning_field.checkpoint.tensor_file import write_tensor_file

    pickled, raw = tmp_path / "pickled.pt", tmp_path / "raw.pt"
    # The type named (weights_only builds no dict subclass with items); the container itself, which the
    # raw format carries.
    torch.save({"state_dict": {"w": torch.ones(2)}, "held": AttributeDict}, pickled)
    assert write_tensor_file({"w": torch.ones(2), "held": AttributeDict(lr=0.5)}, raw, durable=False) is not None
    for path in (pickled, raw):  # each in a process of its own: Lightning not imported before its load
        fresh = subprocess.run(
            [sys.executable, "-c", LOAD_IN_A_FRESH_PROCESS, str(path)], capture_output=True, text=True, timeout=120
        )
        loaded = f"{path} loaded AttributeDict lightning imported before False"
        assert loaded in fresh.stdout, fresh.stdout + fresh.stderr[-2000:]
    absent = subprocess.run(
        [sys.executable, "-c", BLOCK_LIGHTNING + LOAD_IN_A_FRESH_PROCESS, str(pickled), str(raw)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    for path in (pickled, raw):
        refused = [line for line in absent.stdout.splitlines() if line.startswith(f"{path} refused")]
        assert refused and "AttributeDict" in refused[0], absent.stdout + absent.stderr[-2000:]
        assert refused[0].count(str(path)) == 2  # named in the refusal itself


BLOCK_LIGHTNING = """
import importlib.abc, sys
class NoLightning(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "lightning":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoLightning())
"""
