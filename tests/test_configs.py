"""Every shipped Hydra config composes and instantiates, so a typo in conf/ fails here, not mid-run."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from lightning_field import ManifestCheckpoint

CONF = Path(__file__).resolve().parent.parent / "conf"


@pytest.mark.parametrize("name", sorted(p.stem for p in (CONF / "callbacks").glob("*.yaml")))
def test_callback_config_composes_and_instantiates(name: str) -> None:
    with initialize_config_dir(config_dir=str(CONF / "callbacks"), version_base="1.3"):
        cfg = compose(config_name=name, overrides=["checkpoint.every_n_train_steps=50"])
    callback = instantiate(cfg.checkpoint)
    assert isinstance(callback, ManifestCheckpoint)
    assert callback._every_n_train_steps == 50 and callback.save_last is True


def test_checkpoint_config_mirrors_every_constructor_argument() -> None:
    import inspect

    from lightning.pytorch.callbacks import ModelCheckpoint
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(CONF / "callbacks" / "checkpoint.yaml").checkpoint
    ours = set(inspect.signature(ManifestCheckpoint.__init__).parameters) - {
        "self",
        "args",
        "kwargs",
        "generators",
        "config",
    }
    theirs = set(inspect.signature(ModelCheckpoint.__init__).parameters) - {"self"}
    assert (ours | theirs) - set(cfg) == set(), "conf/callbacks/checkpoint.yaml is missing arguments"
