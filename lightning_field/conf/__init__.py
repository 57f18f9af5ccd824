"""Hydra configs shipped with lightning_field, under their own namespace: ``lightning_field/<group>``.

Search-path root ``pkg://lightning_field.conf``; the ``field-*`` apps use ``lightning_field/`` itself
as their primary config directory, so there the groups read ``callbacks=field``, ``trainer=ddp_cpu``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hydra import compose, initialize_config_dir

if TYPE_CHECKING:
    from omegaconf import DictConfig

CONFIG_DIR = Path(__file__).resolve().parent / "lightning_field"


def compose_config(config_name: str | None, overrides: Sequence[str] = ()) -> DictConfig:
    """Compose a shipped config outside a Hydra app (no output directory, no logging set-up), type-checked
    against the generated schemas: for commands that take Hydra overrides next to their own flags.
    ``config_name=None`` composes the groups the overrides name (``+record=default``) and nothing else."""
    # Not at the top: hydra_configs imports CONFIG_DIR from this module, which Hydra's pkg:// search
    # path also imports in any user app; the import here keeps the two from importing each other.
    from lightning_field.integrations.hydra_configs import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides))
