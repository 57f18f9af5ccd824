"""The identity of a run directory, for the sources that carry none of their own.

A profile, an event log or a preflight report does not say which code and configuration produced
it; the run directory it sits in does, through its newest checkpoint manifest or, failing that, the
Hydra config the app composed. Staleness (``record.identity``) compares these identities.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lightning_field.checkpoint.resolver import committed_checkpoints
from lightning_field.core.storage import basename
from lightning_field.record.identity import comparable_identity, identity_from_provenance
from lightning_field.state.secrets import scrub_secrets


def _hydra_config(run_dir: Path, keys: Sequence[str]) -> dict[str, Any] | None:
    """The projected sections of a Hydra app's composed config (``.hydra/config.yaml``), resolved
    where they can be outside the app (``${hydra:...}`` cannot; such a value stays as written)."""
    path = run_dir / ".hydra" / "config.yaml"
    if not path.is_file():
        return None
    try:
        cfg = OmegaConf.load(path)
    except Exception:  # an unreadable config is an unknown one, which staleness then reports
        return None
    if not isinstance(cfg, DictConfig):  # a list at the top is not a Hydra app's config
        return None
    projected: dict[str, Any] = {}
    for key in keys:
        try:
            node = cfg.get(key)
            projected[key] = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
        except Exception:  # unresolvable here: compared as written, which names it if it differs
            projected[key] = OmegaConf.to_container(cfg[key], resolve=False) if OmegaConf.is_config(cfg[key]) else None
    # A Hydra config holds secrets in full; the record gets them as the manifests do (project_config).
    return scrub_secrets(projected)


def unknown_identity(projection: dict[str, Any] | None) -> dict[str, Any]:
    """An identity with every field unknown but the configuration hash, taken over ``projection`` if any."""
    return comparable_identity({}, projection)


def run_identity(run_dir: Path, keys: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any] | None, str]:
    """(identity, projection, basis) of a run directory: its newest manifest, else its Hydra config."""
    for entry in committed_checkpoints(run_dir / "checkpoints"):
        if entry.manifest is not None:
            identity, projection = identity_from_provenance(entry.manifest.provenance, keys)
            return identity, projection, f"its newest checkpoint manifest ({basename(entry.path)})"
    projection = _hydra_config(run_dir, keys)
    if projection is not None:
        return unknown_identity(projection), projection, "its Hydra config (.hydra/config.yaml; no code identity)"
    return unknown_identity(None), None, "nothing (no manifest, no Hydra config)"
