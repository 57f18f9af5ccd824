"""Every shipped Hydra config composes and instantiates, so a typo in conf/ fails here, not mid-run."""

from __future__ import annotations

import inspect
from pathlib import Path

import lightning.pytorch as pl
import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import OmegaConf

from lightning_field import (
    CheckpointCadence,
    EvidenceSettings,
    ManifestCheckpoint,
    RestoreDrill,
    StragglerMonitor,
    TimeToQuality,
)

CONF = Path(__file__).resolve().parent.parent / "conf"
CALLBACKS = {
    "checkpoint": ManifestCheckpoint,
    "restore_drill": RestoreDrill,
    "time_to_quality": TimeToQuality,
    "checkpoint_cadence": CheckpointCadence,
    "straggler_monitor": StragglerMonitor,
}
REQUIRED = {"time_to_quality": ["time_to_quality.target=1.6"]}


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def test_every_callback_config_has_a_known_callback() -> None:
    assert set(options("callbacks")) == set(CALLBACKS)


@pytest.mark.parametrize("name", options("callbacks"))
def test_callback_config_composes_and_instantiates(name: str) -> None:
    with initialize_config_dir(config_dir=str(CONF / "callbacks"), version_base="1.3"):
        cfg = compose(config_name=name, overrides=REQUIRED.get(name, []))
    assert isinstance(instantiate(cfg[name]), CALLBACKS[name])


@pytest.mark.parametrize("name", options("callbacks"))
def test_every_callback_config_mirrors_every_constructor_argument(name: str) -> None:
    cfg = OmegaConf.load(CONF / "callbacks" / f"{name}.yaml")[name]
    expected = _constructor_args(CALLBACKS[name]) - {"generators", "config"}
    if name == "checkpoint":
        expected |= _constructor_args(ModelCheckpoint)
    assert expected - set(cfg) == set(), f"conf/callbacks/{name}.yaml is missing arguments"


def test_a_required_target_left_unset_is_a_clear_error() -> None:
    from omegaconf.errors import MissingMandatoryValue

    with initialize_config_dir(config_dir=str(CONF / "callbacks"), version_base="1.3"):
        cfg = compose(config_name="time_to_quality")
    with pytest.raises(MissingMandatoryValue, match="target"):
        instantiate(cfg.time_to_quality)


def test_checkpoint_config_overrides_reach_the_callback() -> None:
    with initialize_config_dir(config_dir=str(CONF / "callbacks"), version_base="1.3"):
        cfg = compose(config_name="checkpoint", overrides=["checkpoint.every_n_train_steps=50"])
    callback = instantiate(cfg.checkpoint)
    assert callback._every_n_train_steps == 50 and callback.save_last is True


def _constructor_args(cls: type) -> set[str]:
    return set(inspect.signature(cls.__init__).parameters) - {"self", "args", "kwargs"}


def test_restore_drill_config_is_off_by_default() -> None:
    cfg = OmegaConf.load(CONF / "callbacks" / "restore_drill.yaml").restore_drill
    assert cfg.every_n_checkpoints == 0 and not instantiate(cfg).enabled


def test_evidence_settings_yaml_mirrors_the_dataclass() -> None:
    cfg = OmegaConf.load(CONF / "evidence" / "default.yaml")
    assert set(cfg) - {"bundle_dir"} == set(EvidenceSettings.__dataclass_fields__)
    assert EvidenceSettings(**{k: v for k, v in OmegaConf.to_container(cfg).items() if k != "bundle_dir"})


@pytest.mark.parametrize("trainer", options("trainer"))
def test_field_evidence_config_composes_with_every_trainer_and_instantiates(trainer: str) -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="field_evidence", overrides=[f"trainer={trainer}", "model.hidden=8"])
    model = instantiate(cfg.model)
    assert isinstance(model, pl.LightningModule) and model.hparams.hidden == 8
    assert isinstance(instantiate(cfg.data), pl.LightningDataModule)
    assert isinstance(instantiate(cfg.callbacks.checkpoint), ManifestCheckpoint)
    if trainer != "gpu":  # constructing a GPU trainer needs a GPU; its keys are still composed above
        assert isinstance(instantiate(cfg.trainer, logger=False), pl.Trainer)
    assert cfg.callbacks.checkpoint.every_n_train_steps == 5
