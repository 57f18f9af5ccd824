"""Every shipped Hydra config composes and instantiates, and bad overrides fail before any training."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
from pathlib import Path

import lightning.pytorch as pl
import pytest
from conftest import python_program
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from hydra.utils import instantiate
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import Logger
from lightning.pytorch.strategies import Strategy
from omegaconf import OmegaConf

from lightning_field import (
    CheckpointCadence,
    EvidenceSettings,
    ManifestCheckpoint,
    RestoreDrill,
    StragglerMonitor,
    TimeToQuality,
    WandbReview,
)
from lightning_field.checkpoint.options import GROUPS as OPTION_GROUPS
from lightning_field.cli.train_app import instantiable_entries
from lightning_field.integrations.hydra_configs import CONFIG_PACKAGE, SCHEMAS, register_configs

CONF = Path(__file__).resolve().parent.parent / "lightning_field" / "conf" / "lightning_field"
CALLBACKS = {
    "checkpoint": ManifestCheckpoint,
    "restore_drill": RestoreDrill,
    "time_to_quality": TimeToQuality,
    "checkpoint_cadence": CheckpointCadence,
    "straggler_monitor": StragglerMonitor,
    "wandb_review": WandbReview,
}
NEEDS_A_WANDB_LOGGER = {"wandb_review"}  # so not part of the field bundle; field-train adds it with logger=wandb
BUNDLES = {"field", "none"}  # callbacks options that select others rather than configure one
NEEDS_A_GPU = {"gpu", "ddp"}
GROUPS = ("model", "data", "trainer", "strategy", "callbacks", "logger", "experiment")


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def compose_train(*overrides: str, tmp_path: Path):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="field_train", overrides=[f"paths.output_dir={tmp_path}", *overrides])


def test_the_conf_directory_at_the_top_is_the_shipped_package_configs() -> None:
    top = Path(__file__).resolve().parent.parent / "conf"
    assert top.resolve() == CONF.parent.resolve()


def test_every_callback_config_has_a_known_callback() -> None:
    assert set(options("callbacks")) - BUNDLES == set(CALLBACKS)


@pytest.mark.parametrize("name", sorted(CALLBACKS))
def test_every_callback_config_mirrors_every_constructor_argument(name: str) -> None:
    cfg = OmegaConf.load(CONF / "callbacks" / f"{name}.yaml")[name]
    only_code_passes = SCHEMAS[f"callbacks/{name}"].exclude  # generators, config, store: not YAML values
    expected = _constructor_args(CALLBACKS[name]) - only_code_passes
    if name == "checkpoint":
        expected |= _constructor_args(ModelCheckpoint)
    assert expected - set(cfg) == set(), f"callbacks/{name}.yaml is missing arguments"


@pytest.mark.parametrize("group", sorted(OPTION_GROUPS))
def test_each_checkpoint_option_group_is_mirrored_field_for_field_and_instantiates_its_dataclass(group: str) -> None:
    cfg = OmegaConf.load(CONF / "callbacks" / "checkpoint.yaml")["checkpoint"][group]
    kind = OPTION_GROUPS[group]
    only_code_passes = {"store"}  # a CheckpointStore object: not a YAML value
    assert {f.name for f in dataclasses.fields(kind)} - only_code_passes == set(cfg) - {"_target_"}
    assert isinstance(instantiate(cfg), kind) and instantiate(cfg) == kind()  # the YAML's values are the defaults


def _constructor_args(cls: type) -> set[str]:
    return set(inspect.signature(cls.__init__).parameters) - {"self", "args", "kwargs", "deprecated"}


@pytest.mark.parametrize(("group", "option"), [(g, o) for g in GROUPS for o in options(g)])
def test_every_group_option_composes_into_field_train_and_instantiates(
    group: str, option: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = compose_train(f"{group}={option}", tmp_path=tmp_path)
    model, data = instantiate(cfg.model), instantiate(cfg.data)
    assert isinstance(model, pl.LightningModule) and isinstance(data, pl.LightningDataModule)
    # As field-train does: values left for a deselected callback (time_to_quality.target) are skipped.
    for name, node in instantiable_entries("callbacks", cfg.callbacks).items():
        assert isinstance(instantiate(node), Callback), name
    for name, node in instantiable_entries("logger", cfg.logger).items():
        assert isinstance(instantiate(node), Logger), name  # W&B: no run starts before the first log
    if cfg.strategy:
        assert isinstance(instantiate(cfg.strategy), Strategy)
    if cfg.trainer.accelerator != "gpu":  # constructing a GPU trainer needs a GPU; its keys are composed above
        assert isinstance(instantiate(cfg.trainer, logger=False), pl.Trainer)


def test_the_field_bundle_selects_every_callback_and_none_selects_nothing(tmp_path: Path) -> None:
    assert set(compose_train(tmp_path=tmp_path).callbacks) == set(CALLBACKS) - NEEDS_A_WANDB_LOGGER
    assert not instantiable_entries("callbacks", compose_train("callbacks=none", tmp_path=tmp_path).callbacks)
    picked = compose_train("callbacks=[checkpoint,straggler_monitor]", tmp_path=tmp_path).callbacks
    assert set(instantiable_entries("callbacks", picked)) == {"checkpoint", "straggler_monitor"}


def test_every_callback_parameter_can_be_overridden_on_the_command_line(tmp_path: Path) -> None:
    cfg = compose_train(
        "callbacks.checkpoint.every_n_train_steps=7",
        "callbacks.time_to_quality.target=1.25",
        "callbacks.checkpoint_cadence.formula=young",
        "callbacks.straggler_monitor.k=3",
        "callbacks.restore_drill.every_n_checkpoints=2",
        tmp_path=tmp_path,
    )
    checkpoint = instantiate(cfg.callbacks.checkpoint)
    assert checkpoint.every_n_train_steps == 7 and checkpoint.save_on_train_end is True
    assert instantiate(cfg.callbacks.time_to_quality).target == 1.25
    assert instantiate(cfg.callbacks.checkpoint_cadence).formula == "young"
    assert instantiate(cfg.callbacks.straggler_monitor).k == 3
    assert instantiate(cfg.callbacks.restore_drill).every_n_checkpoints == 2


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("callbacks.checkpoint.every_n_train_steps=often", "every_n_train_steps"),
        ("callbacks.time_to_quality.target=good", "target"),
        ("trainer.max_steps=1e3x", "max_steps"),
        ("callbacks.checkpoint.every_n_train_step=5", "every_n_train_step"),
        ("trainer.max_step=5", "max_step"),
        # inside an option group: its schema is the dataclass's
        ("callbacks.checkpoint.snapshots.every_n_train_step=5", "every_n_train_step"),
        ("callbacks.checkpoint.resume.max_failed_attempts=many", "max_failed_attempts"),
    ],
)
def test_a_wrong_type_or_a_misspelled_key_fails_at_composition(override: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigCompositionException) as err:
        compose_train(override, tmp_path=tmp_path)
    text = f"{err.value} {err.value.__cause__}"
    assert message in text


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("trainer.max_steps=abc", ["trainer.max_steps", "could not be converted to Integer"]),
        ("callbacks.checkpoint.every_n_train_step=5", ["callbacks.checkpoint.every_n_train_step: no such key",
                                                      "every_n_train_steps"]),  # the keys that exist are listed
        # 0.x's flat option: the grouped key to write instead
        ("callbacks.checkpoint.snapshot_dir=/tmp/s", ["callbacks.checkpoint.snapshots.directory=..."]),
    ],
)
@pytest.mark.slow
def test_field_train_refuses_a_bad_override_before_any_training(override: str, expected: list[str], tmp_path: Path):
    proc = subprocess.run(
        [python_program(), "-m", "lightning_field.cli.train_app", override, f"paths.root_dir={tmp_path}"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2  # an unusable configuration, in one line
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    for text in expected:
        assert text in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "outputs").exists()  # no run directory, nothing trained


def test_a_required_target_left_unset_is_a_clear_error() -> None:
    from omegaconf.errors import MissingMandatoryValue

    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="field_evidence", overrides=["callbacks=time_to_quality"])
    with pytest.raises(MissingMandatoryValue, match="target"):
        instantiate(cfg.callbacks.time_to_quality)


def test_restore_drill_config_is_off_by_default() -> None:
    cfg = OmegaConf.load(CONF / "callbacks" / "restore_drill.yaml").restore_drill
    assert cfg.every_n_checkpoints == 0 and not instantiate(cfg).enabled


def test_evidence_settings_yaml_mirrors_the_dataclass() -> None:
    cfg = OmegaConf.load(CONF / "evidence" / "default.yaml")
    assert set(cfg) - {"bundle_dir"} == set(EvidenceSettings.__dataclass_fields__)
    assert EvidenceSettings(**{k: v for k, v in OmegaConf.to_container(cfg).items() if k != "bundle_dir"})


@pytest.mark.parametrize("trainer", options("trainer"))
def test_field_evidence_config_composes_with_every_trainer_and_instantiates(trainer: str) -> None:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="field_evidence", overrides=[f"trainer={trainer}", "model.hidden=8"])
    model = instantiate(cfg.model)
    assert isinstance(model, pl.LightningModule) and model.hparams.hidden == 8
    assert isinstance(instantiate(cfg.data), pl.LightningDataModule)
    assert isinstance(instantiate(cfg.callbacks.checkpoint), ManifestCheckpoint)
    if trainer not in NEEDS_A_GPU:
        assert isinstance(instantiate(cfg.trainer, logger=False), pl.Trainer)
    assert cfg.callbacks.checkpoint.every_n_train_steps == 5


def test_a_user_app_composes_the_namespaced_groups_at_the_packages_users_expect(tmp_path: Path) -> None:
    """The view a user's own Hydra app gets through the search path: lightning_field/<group>."""
    register_configs()
    (tmp_path / "train.yaml").write_text(
        "defaults:\n  - lightning_field/callbacks: field\n  - lightning_field/trainer: cpu\n"
        "  - lightning_field/logger: csv\n  - _self_\npaths:\n  output_dir: /tmp/x\n"
        f"hydra:\n  searchpath: ['{CONFIG_PACKAGE}']\n"
    )
    with initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["callbacks.time_to_quality.target=2.0"])
    assert set(cfg.callbacks) == set(CALLBACKS) - NEEDS_A_WANDB_LOGGER and cfg.trainer.accelerator == "cpu"
    assert cfg.logger.csv.save_dir == "/tmp/x"
    assert isinstance(instantiate(cfg.callbacks.time_to_quality), TimeToQuality)
    with (
        pytest.raises(ConfigCompositionException),
        initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"),
    ):
        compose(config_name="train", overrides=["callbacks.checkpoint.every_n_train_steps=often"])


def test_preflight_settings_yaml_mirrors_the_dataclass() -> None:
    from lightning_field.baseline.preflight import PreflightSettings

    cfg = OmegaConf.load(CONF / "preflight" / "default.yaml")
    assert set(cfg) == set(PreflightSettings.__dataclass_fields__)
    PreflightSettings(**OmegaConf.to_container(cfg)).validate()


@pytest.mark.parametrize("experiment", options("experiment"))
def test_field_preflight_composes_with_every_experiment(experiment: str, tmp_path: Path) -> None:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            config_name="field_preflight", overrides=[f"experiment={experiment}", f"paths.output_dir={tmp_path}"]
        )
    assert isinstance(instantiate(cfg.model), pl.LightningModule)
    assert isinstance(instantiate(cfg.data), pl.LightningDataModule)


def test_scale_settings_yaml_mirrors_the_study_config() -> None:
    from lightning_field.baseline.scale import StudyConfig

    cfg = OmegaConf.load(CONF / "scale" / "default.yaml")
    # The workload is not a setting of the study: it comes from the model and data groups.
    assert set(cfg) == set(StudyConfig.__dataclass_fields__) - {"model", "data"}


@pytest.mark.parametrize("experiment", [None, *options("experiment")])
def test_field_scale_composes_with_the_builtin_workload_and_every_experiment(experiment: str | None) -> None:
    from lightning_field.conf import compose_config

    cfg = compose_config("field_scale", [f"experiment={experiment}"] if experiment else [])
    assert isinstance(instantiate(cfg.model), pl.LightningModule)
    assert isinstance(instantiate(cfg.data), pl.LightningDataModule)


@pytest.mark.parametrize("option", options("record"))
def test_every_record_option_composes_validates_and_takes_overrides(option: str) -> None:
    from lightning_field.record.config import load_record_config

    assert (CONF / "record" / f"{option}.yaml").read_text().startswith("# @package record\n")
    config = load_record_config([f"record={option}", "record.conditions.no_stragglers.severity=critical"])
    assert config.condition("no_stragglers").critical and config.ladder and config.roles
