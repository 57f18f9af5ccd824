"""What a piece of evidence is about, compared with the run being released.

The identity fields and their comparison are the evidence package's (``evidence.identity``), so a
record and ``field evidence check`` call the same thing stale. One adaptation: the configuration
hash. ``field-train`` hashes the keys that define its trajectory, ``field-evidence`` hashes whatever
its own app composed, so the two hashes of the *same* model and data never agree. Both sides are
therefore projected onto the configured sections (``record.identity.config_keys``, by default
model, data and seed) before hashing, and a difference is named key by key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lightning_field.evidence.identity import IDENTITY_FIELDS, identity_differences, identity_of
from lightning_field.state.provenance_compare import diff_provenance, stable_hash
from lightning_field.state.secrets import scrub_secrets
from lightning_field.workloads import with_current_targets

CONFIG_HASH = "config.hash"
GROUP_OF_FIELD = {name: name.split(".", 1)[0] for name, _ in IDENTITY_FIELDS}


def project_config(resolved: Mapping[str, Any] | None, keys: Sequence[str]) -> dict[str, Any] | None:
    """The sections of a resolved configuration that define the released workload (None: unknown).

    Scrubbed with the manifests' secret filter: an evidence bundle or a Hydra config may hold a secret
    in full, which must not reach the record, and a manifest's already scrubbed config then compares
    equal to the same config scrubbed here (the filter is idempotent and its digests deterministic).
    """
    if not isinstance(resolved, Mapping):
        return None
    # A workload whose class moved (workloads.MOVED_TARGETS) is the same workload before and after.
    return scrub_secrets(with_current_targets({key: resolved.get(key) for key in keys}))


def comparable_identity(identity: Mapping[str, Any], projection: Mapping[str, Any] | None) -> dict[str, Any]:
    """``identity`` with its configuration hash taken over the projection, so two apps compare."""
    out = {name: identity.get(name) for name, _ in IDENTITY_FIELDS}
    out[CONFIG_HASH] = stable_hash(projection) if projection is not None else None
    return out


def identity_from_provenance(provenance: Mapping[str, Any], keys: Sequence[str]) -> tuple[dict[str, Any], Any]:
    """(comparable identity, config projection) of a checkpoint manifest's provenance."""
    projection = project_config((provenance.get("config") or {}).get("resolved"), keys)
    return comparable_identity(identity_of(provenance), projection), projection


def code_version(identity: Mapping[str, Any]) -> str:
    """One readable code version: the git commit (and diff hash when dirty), else the package version."""
    commit = identity.get("code.git_commit")
    if not commit:
        package = identity.get("code.lightning_field")
        return f"unknown (outside git; lightning_field {package})" if package else "unknown"
    diff = identity.get("code.git_diff_hash")
    return f"{commit[:12]}" + (f"+diff:{diff[:12]}" if diff else "")


def staleness_reasons(
    evidence: Mapping[str, Any],
    evidence_projection: Mapping[str, Any] | None,
    release: Mapping[str, Any],
    release_projection: Mapping[str, Any] | None,
    groups: Sequence[str],
    own_run: bool = False,
) -> list[str]:
    """Why evidence with this identity does not describe the released run (empty when it does).

    Only the identity ``groups`` a condition compares count: a scaling study of the built-in model
    compares none, a preflight (which records no code identity) compares the configuration only.
    ``own_run``: the evidence was recorded by the released run itself (its checkpoints, profile, event
    log), so unknown code is not a reason to doubt that it describes that run.
    """
    if not groups:
        return []
    reasons = []
    for diff in identity_differences(evidence, release):
        name = diff.split(":", 1)[0]
        if GROUP_OF_FIELD.get(name) not in groups:
            continue
        if name == CONFIG_HASH and evidence_projection is not None and release_projection is not None:
            changed = diff_provenance(evidence_projection, release_projection)
            named = "; ".join(f"{key}: evidence {a!r}, released {b!r}" for key, (a, b) in changed.items())
            reasons.append(f"config differs ({named})")
        elif name == CONFIG_HASH:
            reasons.append("config unknown: the evidence or the released run records no configuration")
        else:
            reasons.append(diff.replace(", checkpoint ", ", released "))
    unknown = not evidence.get("code.git_commit") or not release.get("code.git_commit")
    if "code" in groups and unknown and not own_run:
        reasons.append(
            "code identity unknown: the evidence or the released run was made from code outside git, so nothing"
            " shows the two ran the same code"
        )
    return reasons
