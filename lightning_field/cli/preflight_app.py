"""``field preflight`` (also ``field-preflight``): the baseline-first checks as a Hydra app on the
same config groups as ``field-train``.

Exit status: 0 when every check passed, 1 when one failed, 2 when the settings are unusable
(nothing is run then).
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning.pytorch as pl
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lightning_field.baseline.preflight import (
    PreflightConfigError,
    PreflightSettings,
    render_report,
    run_preflight,
    write_report,
)
from lightning_field.cli.hydra_app import hydra_main
from lightning_field.core.layout import PREFLIGHT_RELPATH
from lightning_field.integrations.hydra_configs import resolved_dict

EXIT_PASSED, EXIT_FAILED, EXIT_BAD_CONFIG = 0, 1, 2
# The baseline measures one device, whatever the trainer config says about several.
SINGLE_DEVICE = {"devices": 1, "num_nodes": 1, "strategy": "auto"}


def run(cfg: DictConfig) -> int:
    run_dir = Path(cfg.paths.output_dir).resolve()
    try:
        typed = OmegaConf.merge(OmegaConf.structured(PreflightSettings), cfg.preflight)
        settings = PreflightSettings(**resolved_dict(typed))
        settings.validate()
    except (OmegaConfBaseException, PreflightConfigError) as err:
        print(f"field preflight: {err}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    pl.seed_everything(int(cfg.seed), workers=True, verbose=False)
    model = instantiate(cfg.model, _convert_="all")
    data = instantiate(cfg.data, _convert_="all")
    trainer_kwargs = resolved_dict(cfg.trainer)
    trainer_kwargs = {k: v for k, v in trainer_kwargs.items() if k != "_target_" and v is not None}
    trainer_kwargs.update(SINGLE_DEVICE, default_root_dir=str(run_dir))
    try:
        report = run_preflight(model, data, trainer_kwargs, settings)
    except PreflightConfigError as err:
        print(f"field preflight: {err}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    print(render_report(report))
    paths = write_report(report, run_dir / PREFLIGHT_RELPATH)
    print(f"[field preflight] {paths['json']}\n[field preflight] {paths['md']}\n[field preflight] {paths['png']}")
    return EXIT_PASSED if report["passed"] else EXIT_FAILED


def main() -> None:
    hydra_main("field_preflight", run, app_name="field preflight")


if __name__ == "__main__":
    main()
