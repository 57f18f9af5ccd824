"""Every bundle callback, and the W&B logger, builds from a LightningCLI command line and from the
YAML config LightningCLI writes, beside Lightning's own ModelCheckpoint in the same command line.

LightningCLI is how many Lightning users run every job: it introspects each constructor's signature
(jsonargparse), and dumps the parsed config as YAML, so every default must be a plain value and every
hint must say what the code accepts. The kill-and-rerun of a LightningCLI script (``--ckpt_path
last``) is the conformance row ``lightning-cli``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("jsonargparse", reason="LightningCLI needs the jsonargparse[signatures] test extra")

sys.path.insert(0, str(Path(__file__).parent / "jobs"))

from conformance_job import UserClassifier, UserData
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI

import lightning_field

# Each callback with arguments that differ from their defaults, and the attributes that show the
# parse reached them (ModelCheckpoint keeps its interval private).
CALLBACKS: dict[str, tuple[dict[str, object], dict[str, object]]] = {
    "lightning_field.ManifestCheckpoint": (
        {"every_n_train_steps": 3, "save_top_k": 2, "monitor": "val_loss", "snapshots.every_n_train_steps": 4,
         "resume.allow_mismatch": "[config]", "interrupts.save_on_train_end": "true"},
        {"_every_n_train_steps": 3, "save_top_k": 2, "monitor": "val_loss", "save_on_stop": True,
         "save_on_train_end": True, "allow_resume_mismatch": ("config",)},
    ),
    "lightning_field.TimeToQuality": ({"monitor": "val_loss", "target": 0.5}, {"monitor": "val_loss", "target": 0.5}),
    "lightning_field.CheckpointCadence": ({"mtbf_hours": 6.0}, {"mtbf_prior_s": 6.0 * 3600}),
    "lightning_field.StragglerMonitor": ({"report_interval_s": 30.0}, {"report_interval_s": 30.0}),
    "lightning_field.RestoreDrill": ({"every_n_checkpoints": 2}, {"every_n_checkpoints": 2}),
    "lightning_field.WandbReview": ({}, {}),
    "lightning.pytorch.callbacks.ModelCheckpoint": ({"every_n_train_steps": 5}, {"_every_n_train_steps": 5}),
}


def _command_line(tmp_path: Path) -> list[str]:
    args = [
        f"--trainer.default_root_dir={tmp_path}", "--trainer.accelerator=cpu",
        "--trainer.logger=lightning_field.FieldWandbLogger", f"--trainer.logger.run_dir={tmp_path}",
        "--trainer.logger.offline=true",
    ]  # fmt: skip
    for target, (values, _) in CALLBACKS.items():
        args.append(f"--trainer.callbacks+={target}")
        if target.endswith("ManifestCheckpoint"):
            args.append(f"--trainer.callbacks.dirpath={tmp_path / 'checkpoints'}")
        args += [f"--trainer.callbacks.{name}={value}" for name, value in values.items()]
    return args


def _built(cli: LightningCLI) -> dict[str, object]:
    return {f"{type(cb).__module__.split('.')[0]}.{type(cb).__name__}": cb for cb in cli.trainer.callbacks}


def _assert_configured(cli: LightningCLI) -> None:
    built = _built(cli)
    for target, (_, expected) in CALLBACKS.items():
        short = f"{target.split('.')[0]}.{target.rsplit('.', 1)[1]}"
        assert short in built, f"{target} was not built: {sorted(built)}"
        for name, value in expected.items():
            got = getattr(built[short], name, None)
            assert got == value, f"{target}.{name}: {got!r} != {value!r}"
    assert isinstance(cli.trainer.logger, lightning_field.FieldWandbLogger)
    checkpoint = built["lightning_field.ManifestCheckpoint"]
    assert isinstance(checkpoint, ModelCheckpoint) and checkpoint._preemption._watcher.signals == (15, 10)
    assert checkpoint.snapshots.every_n_train_steps == 4  # an option group's field, by its dotted name


def test_every_bundle_callback_builds_from_a_lightning_cli_command_line_and_from_its_dumped_yaml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    cli = LightningCLI(UserClassifier, UserData, run=False, args=_command_line(tmp_path), save_config_callback=None)
    _assert_configured(cli)
    # What LightningCLI writes beside every run (SaveConfigCallback) and a user edits and reruns.
    config = tmp_path / "config.yaml"
    config.write_text(cli.parser.dump(cli.config, skip_none=False))
    assert "interrupts:\n" in config.read_text() and "signals:\n        - 15\n        - 10" in config.read_text()
    again = LightningCLI(UserClassifier, UserData, run=False, args=[f"--config={config}"], save_config_callback=None)
    _assert_configured(again)


@pytest.mark.parametrize("given, parsed", [("true", True), ("false", False), ("link", "link"), ("null", None)])
def test_each_argument_parses_from_its_own_annotation_as_model_checkpoints_does(given: str, parsed: object) -> None:
    """Tools that read a parameter's annotation (jsonargparse's ``add_argument(type=...)``, as Lightning's own
    tests do) get a type, not a string: the module does not postpone its annotations."""
    import inspect

    from jsonargparse import ArgumentParser

    from lightning_field import ManifestCheckpoint

    annotation = inspect.signature(ManifestCheckpoint.__init__).parameters["save_last"].annotation
    assert not isinstance(annotation, str)
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--save_last", type=annotation)
    assert parser.parse_args(["--save_last", given]).save_last == parsed
