"""What a piece of evidence is *about*: the code, config, data and model a checkpoint was made with.

Evidence supports a claim only for checkpoints with the same identity. Each field comes from the
manifest's provenance, so a bundle is checked against a checkpoint without loading any tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

IDENTITY_FIELDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("code.git_commit", ("code", "git_commit")),
    ("code.git_diff_hash", ("code", "git_diff_hash")),
    ("code.lightning_field", ("code", "lightning_field")),
    ("code.torch", ("code", "torch")),
    ("code.lightning", ("code", "lightning")),
    ("config.hash", ("config", "hash")),
    ("data.fingerprint", ("data", "fingerprint")),
    ("model.architecture_hash", ("model", "architecture_hash")),
)


def identity_of(provenance: Mapping[str, Any]) -> dict[str, Any]:
    """The identity fields of one manifest's provenance (None where the manifest has none)."""
    identity: dict[str, Any] = {}
    for name, path in IDENTITY_FIELDS:
        value: Any = provenance
        for part in path:
            value = value.get(part) if isinstance(value, Mapping) else None
        identity[name] = value
    return identity


def identity_differences(expected: Mapping[str, Any], actual: Mapping[str, Any]) -> list[str]:
    """Human-readable differences, one per field, in a fixed order."""
    return [
        f"{name}: evidence {expected.get(name)!r}, checkpoint {actual.get(name)!r}"
        for name, _ in IDENTITY_FIELDS
        if expected.get(name) != actual.get(name)
    ]
