"""What the ``field-*`` Hydra apps share: the shipped config directory and how a run's status
becomes the process's exit status."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import hydra
from omegaconf import DictConfig

from lightning_field.conf import CONFIG_DIR
from lightning_field.integrations.hydra_configs import register_configs


def hydra_main(config_name: str, run: Callable[[DictConfig], int]) -> None:
    """Compose ``config_name`` from the shipped configs (type-checked) and exit with ``run``'s status."""
    register_configs()
    # As with `python -m`, modules in the current directory are importable by _target_.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())

    @hydra.main(config_path=str(CONFIG_DIR), config_name=config_name, version_base="1.3")
    def app(cfg: DictConfig) -> None:
        code = run(cfg)
        if code:
            sys.exit(code)

    app()
