"""Hydra discovers this module in any app once lightning_field is installed: it adds the package's
configs to the search path (``defaults: [lightning_field/callbacks: field]``) and registers the
schemas that type-check them.

Hydra imports every plugin module at start-up, so this one stays cheap until Hydra asks for the
search path; the schemas need the callback classes (and so torch), and are registered only then.
A failure there must not break the user's app: it composes without type checks and says why.
"""

from __future__ import annotations

import warnings

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class LightningFieldSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        search_path.append(provider="lightning_field", path="pkg://lightning_field.conf")
        try:
            # Here, not at the top: Hydra imports every plugin module at start-up, in every app, and the
            # schemas import the callbacks (torch); a failure must cost only the type checks.
            from lightning_field.integrations.hydra_configs import register_configs

            register_configs()
        except Exception as err:  # any failure only costs the type checks
            warnings.warn(f"lightning_field configs compose without type checks: {err!r}", stacklevel=1)
