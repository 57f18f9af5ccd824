"""Canonical content, its SHA-256, and sign-off entries that break when the record changes.

A signature is accountability, not cryptographic identity: it records who (by the name they typed)
took responsibility for which content, under which role, when, with what note. Anyone with write
access could type any name; what a signature does guarantee is that it covers exactly the content
it names, because it carries that content's SHA-256 and any later edit changes it.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

from lightning_field.core.hashing import IDENTITY_ALGORITHM, hash_bytes

SIGNATURES = "signatures"
CONTENT_SHA256 = "content_sha256"
UNSIGNED_KEYS = (SIGNATURES, CONTENT_SHA256)


def canonical_bytes(record: Mapping[str, Any]) -> bytes:
    """The record without its signatures and stamp, as sorted, compact, NaN-free JSON."""
    content = {k: v for k, v in record.items() if k not in UNSIGNED_KEYS}
    return json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def content_sha256(record: Mapping[str, Any]) -> str:
    return hash_bytes(canonical_bytes(record), IDENTITY_ALGORITHM)


def sign(record: dict[str, Any], role: str, name: str, note: str, now: float) -> dict[str, Any]:
    """Append one signature over the record's current content; returns it."""
    entry = {
        "role": role,
        "name": name,
        "note": note,
        "time": dt.datetime.fromtimestamp(now, dt.timezone.utc).isoformat(timespec="seconds"),
        "time_unix": now,
        "content_sha256": content_sha256(record),
    }
    record.setdefault(SIGNATURES, []).append(entry)
    return entry


def verify_signatures(record: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """(valid signatures, one problem per invalid one)."""
    current = content_sha256(record)
    valid, problems = [], []
    for entry in record.get(SIGNATURES) or []:
        if entry.get("content_sha256") == current:
            valid.append(entry)
        else:
            problems.append(
                f"signature by {entry.get('name')!r} ({entry.get('role')}, {entry.get('time')}) is INVALID: the record"
                f" changed after it was signed (signed {str(entry.get('content_sha256'))[:16]}…, now {current[:16]}…)"
            )
    return valid, problems


def missing_signoffs(bundles: Sequence[Mapping[str, Any]], valid: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each required (bundle, role) pair without a valid signature."""
    signed = {entry.get("role") for entry in valid}
    return [
        f"{bundle['name']}: awaiting sign-off by {role}"
        for bundle in bundles
        for role in bundle["roles"]
        if role not in signed
    ]
