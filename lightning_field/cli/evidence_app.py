"""``field-evidence``: the Hydra app that runs the controlled resume protocol and applies the gate.

Exit status: 0 when every critical condition passes, 1 when the gate fails, 2 when the configuration
is unusable (nothing is run then).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lightning_field.cli.hydra_app import hydra_main
from lightning_field.core.layout import EVIDENCE_RELPATH
from lightning_field.evidence.bundle import build_evidence, write_bundle
from lightning_field.evidence.bundle_format import EVIDENCE_JSON, EVIDENCE_MD
from lightning_field.evidence.protocol import EvidenceConfigError, EvidenceSettings, plan_kills, run_protocol
from lightning_field.integrations.hydra_configs import resolved_dict

EXIT_PASSED, EXIT_GATE_FAILED, EXIT_BAD_CONFIG = 0, 1, 2


def settings_from(cfg: DictConfig) -> tuple[EvidenceSettings, Path | None]:
    """Type-checked protocol settings: an unknown key or a wrong type names itself."""
    raw = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(raw, dict)
    bundle_dir = raw.pop("bundle_dir", None)
    try:
        typed = OmegaConf.merge(OmegaConf.structured(EvidenceSettings), raw)
    except OmegaConfBaseException as err:
        raise EvidenceConfigError(f"evidence settings: {err}") from None
    settings = EvidenceSettings(**resolved_dict(typed))
    settings.validate()
    return settings, Path(bundle_dir) if bundle_dir else None


def _check_targets(config: dict[str, Any]) -> None:
    for section in ("model", "data", "trainer"):
        target = (config.get(section) or {}).get("_target_")
        if not target:
            raise EvidenceConfigError(f"{section}._target_ is not set")
        try:
            get_class(target)
        except Exception as err:
            raise EvidenceConfigError(
                f"{section}._target_={target} cannot be imported ({err}); it must be importable from the current"
                f" directory ({os.getcwd()}) or PYTHONPATH"
            ) from None


def checked(cfg: DictConfig) -> tuple[EvidenceSettings, Path | None, dict[str, Any]]:
    """The protocol's settings, bundle directory and run config; EvidenceConfigError when unusable."""
    settings, bundle_dir = settings_from(cfg.evidence)
    config = resolved_dict(cfg)
    config.pop("evidence", None)
    _check_targets(config)
    save_every = (config.get("callbacks", {}).get("checkpoint") or {}).get("every_n_train_steps")
    plan_kills(settings, save_every)
    return settings, bundle_dir, config


def validate(cfg: DictConfig) -> str | None:
    """Checked before Hydra makes a run directory: a bad setting starts nothing."""
    try:
        checked(cfg)
    except EvidenceConfigError as err:
        return str(err)
    return None


def run(cfg: DictConfig) -> int:
    try:
        settings, bundle_dir, config = checked(cfg)
    except EvidenceConfigError as err:
        print(f"field-evidence: {err}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    if bundle_dir is None:
        stamp = time.strftime("%Y%m%d-%H%M%S") + "-" + os.urandom(2).hex()
        bundle_dir = Path(HydraConfig.get().runtime.output_dir) / EVIDENCE_RELPATH / stamp
    bundle_dir = bundle_dir.resolve()
    if bundle_dir.exists() and any(bundle_dir.iterdir()):
        print(f"field-evidence: the bundle directory {bundle_dir} is not empty: pass a fresh one", file=sys.stderr)
        return EXIT_BAD_CONFIG
    print(f"[field-evidence] bundle: {bundle_dir}")
    results = run_protocol(config, settings, bundle_dir, cwd=Path.cwd())
    evidence, plot_inputs = build_evidence(results, settings, config, bundle_dir)
    write_bundle(evidence, plot_inputs, bundle_dir)
    print(f"[field-evidence] verdict: {evidence['verdict']} - {evidence['summary']}")
    for condition in evidence["critical_conditions"]:
        mark = "pass" if condition["passed"] else "FAIL"
        print(f"[field-evidence]   {mark}  {condition['name']}: {condition['detail']}")
    for cost in evidence["recovery"]:
        print(
            f"[field-evidence]   {cost['run']}: kill at step {cost['kill_step']} ({cost['kill_mode']}), resumed from"
            f" step {cost['resumed_step']}, {cost['steps_recomputed']} steps redone,"
            f" kill->first new step {cost.get('kill_to_first_new_step_s', float('nan')):.2f} s"
        )
    print(f"[field-evidence] {bundle_dir / EVIDENCE_MD}\n[field-evidence] {bundle_dir / EVIDENCE_JSON}")
    gate = evidence["gate"]
    print(f"[field-evidence] gate: {'PASSED' if gate['passed'] else 'FAILED: ' + ', '.join(gate['failed'])}")
    return EXIT_PASSED if gate["passed"] else EXIT_GATE_FAILED


def main() -> None:
    hydra_main("field_evidence", run, validate=validate)


if __name__ == "__main__":
    main()
