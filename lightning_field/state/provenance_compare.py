"""Comparing and hashing recorded provenance, without the capture's torch and Lightning.

The readers of a recorded manifest or evidence bundle (the resume check, `field evidence check`,
`field record`) compare provenance that was captured elsewhere; only the capture
(`state.provenance`) needs the training stack.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from lightning_field.core.hashing import IDENTITY_ALGORITHM, hash_bytes
from lightning_field.state.secrets import is_redacted
from lightning_field.workloads import current_target

# Checkpoints written before the secret digests recorded every secret as this one constant: they
# cannot tell two secrets apart, so a secret recorded that way matches any secret now.
LEGACY_REDACTED = "<redacted>"


def stable_hash(value: Any) -> str:
    return hash_bytes(json.dumps(value, sort_keys=True, default=repr).encode(), IDENTITY_ALGORITHM)


def _same_moved_target(key: str, saved: Any, current: Any) -> bool:
    """A ``_target_`` recorded under a class's old path names the same class as its current path
    (``workloads.MOVED_TARGETS``): a checkpoint written before a move is still this run's."""
    return key == "_target_" and isinstance(saved, str) and current_target(saved) == current


def diff_provenance(
    saved: Mapping[str, Any], current: Mapping[str, Any], prefix: str = ""
) -> dict[str, tuple[Any, Any]]:
    """Flat ``{"dotted.key": (saved, current)}`` of every leaf that differs.

    Two recorded forms equal their current one: a secret recorded as ``LEGACY_REDACTED``, and a
    ``_target_`` recorded under a path that ``lightning_field.workloads.MOVED_TARGETS`` maps to the
    current value. Nothing else is equated."""
    out: dict[str, tuple[Any, Any]] = {}
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key), current.get(key)
        name = f"{prefix}{key}"
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out.update(diff_provenance(a, b, name + "."))
        elif a != b and not (a == LEGACY_REDACTED and is_redacted(b)) and not _same_moved_target(key, a, b):
            out[name] = (a, b)
    return out


def inexact_lineage(provenance: Mapping[str, Any]) -> list[str]:
    """Why a checkpoint's lineage is not exact against an uninterrupted run, from its manifest's
    provenance (empty when nothing says so): an inexact resume (``resume_inexact``) or a Trainer
    setting changed on resume (``allow_changed``), anywhere in the lineage before it. Evidence of an
    exact resume cannot cover such a checkpoint."""
    reasons = []
    inexact = provenance.get("inexact_resume")
    if isinstance(inexact, Mapping):
        missing = inexact.get("missing")
        lacking = "; ".join(map(str, missing)) if isinstance(missing, list) and missing else "state it needed"
        where = inexact.get("checkpoint")
        reasons.append(f"it continues {where!r}, resumed inexactly (resume.inexact) without {lacking}")
    changed = provenance.get("changed_settings")
    for entry in changed if isinstance(changed, list) else []:
        changes = entry.get("changes") if isinstance(entry, Mapping) else None
        if not isinstance(changes, Mapping):
            continue
        listed = "; ".join(
            f"{name}: {pair[0]!r} (checkpoint) -> {pair[1]!r} (now)"
            for name, pair in changes.items()
            if isinstance(pair, (list, tuple)) and len(pair) == 2
        )
        reasons.append(
            f"it continues {entry.get('checkpoint')!r} (step {entry.get('step')}) with changed Trainer settings"
            f" (resume.allow_changed): {listed}"
        )
    return reasons
