"""Signed manifests: a keyed BLAKE3 MAC over a manifest's canonical JSON, which lists every file's hash.

Hashes prove a checkpoint matches its own manifest; anyone who can write the directory can rewrite
both together. With a key configured, the commit signs the manifest and every verification (the
resolver's, the load's, ``field ckpt verify``) refuses one that is unsigned, signed with a key that
is not accepted, or whose signature does not match. Without a key nothing changes.

The key comes from the environment, never from a config file (which is recorded in the run):

- ``FIELD_CHECKPOINT_KEY="<key id>:<secret>"``, or
- ``FIELD_CHECKPOINT_KEY_FILE=/path/to/keys``, one ``<key id>:<secret>`` per line.

Several keys (comma-separated, or one per line) rotate: the first signs, every one listed is
accepted. docs/security.md shows how to set them on SLURM, Kubernetes and locally.
"""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3

__all__ = [
    "KEY_ENV",
    "KEY_FILE_ENV",
    "SIGNATURE_STATES",
    "ManifestKeys",
    "SigningKeyError",
    "canonical_bytes",
    "keys_from_environment",
    "signature_legend",
    "signature_state",
    "signature_status",
]

SIGNATURE_STATES = ("valid", "INVALID", "unsigned", "no key")
"""The words of ``field ckpt list --verify``'s signature column (:func:`signature_state`)."""

KEY_ENV = "FIELD_CHECKPOINT_KEY"
KEY_FILE_ENV = "FIELD_CHECKPOINT_KEY_FILE"
ALGORITHM = "blake3-keyed"
_CONTEXT = "lightning_field 2026 checkpoint manifest MAC v1"  # derives the 32-byte MAC key from a secret
MIN_SECRET_CHARS = 16


class SigningKeyError(ValueError):
    """The configured key is malformed: it names the variable or file, never the secret."""


@dataclass(frozen=True)
class ManifestKeys:
    """The key that signs (``signing_id``) and every accepted key, by id (secrets derived to MAC keys)."""

    signing_id: str
    keys: Mapping[str, bytes]

    def sign(self, content: bytes) -> dict[str, str]:
        mac = blake3.blake3(content, key=self.keys[self.signing_id]).hexdigest()
        return {"algorithm": ALGORITHM, "key_id": self.signing_id, "mac": mac}

    def check(self, content: bytes, signature: Any) -> str | None:
        """Why ``signature`` does not vouch for ``content`` under these keys, or None where it does."""
        if signature is None:
            return "the manifest is unsigned, and a checkpoint key is configured"
        if not isinstance(signature, dict) or signature.get("algorithm") != ALGORITHM:
            return f"the manifest's signature is not a {ALGORITHM} signature"
        key_id, mac = signature.get("key_id"), signature.get("mac")
        key = self.keys.get(key_id) if isinstance(key_id, str) else None
        if key is None:
            accepted = ", ".join(self.keys)
            return f"the manifest is signed with key {key_id!r}, which is not accepted (accepted: {accepted})"
        expected = blake3.blake3(content, key=key).hexdigest()
        if not isinstance(mac, str) or not hmac.compare_digest(mac, expected):
            return f"the manifest's signature (key {key_id!r}) does not match its content: it was changed after signing"
        return None


def canonical_bytes(document: Mapping[str, Any]) -> bytes:
    """What a signature covers: the manifest as JSON, sorted and compact, without its signature."""
    content = {k: v for k, v in document.items() if k != "signature"}
    return json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str).encode()


def keys_from_environment(environ: Mapping[str, str] | None = None) -> ManifestKeys | None:
    """The keys :envvar:`FIELD_CHECKPOINT_KEY` or :envvar:`FIELD_CHECKPOINT_KEY_FILE` configure, or None.

    Raises:
        SigningKeyError: both are set, the file cannot be read, or an entry is not ``id:secret``
            with a secret of at least 16 characters.
    """
    env = os.environ if environ is None else environ
    inline, path = env.get(KEY_ENV), env.get(KEY_FILE_ENV)
    if inline and path:
        raise SigningKeyError(f"set {KEY_ENV} or {KEY_FILE_ENV}, not both")
    if path:
        try:
            entries = [line.strip() for line in Path(path).read_text().splitlines()]
        except OSError as err:
            raise SigningKeyError(f"{KEY_FILE_ENV}={path}: cannot be read ({err.strerror})") from None
        source = f"{KEY_FILE_ENV}={path}"
    elif inline:
        entries, source = [e.strip() for e in inline.split(",")], KEY_ENV
    else:
        return None
    keys: dict[str, bytes] = {}
    for number, entry in enumerate((e for e in entries if e and not e.startswith("#")), start=1):
        key_id, sep, secret = entry.partition(":")
        if not sep or not key_id.strip() or len(secret.strip()) < MIN_SECRET_CHARS:
            raise SigningKeyError(
                f"{source}: entry {number} is not '<key id>:<secret>' with a secret of at least"
                f" {MIN_SECRET_CHARS} characters"
            )
        key_id = key_id.strip()
        if key_id in keys:
            raise SigningKeyError(f"{source}: key id {key_id!r} is listed twice")
        keys[key_id] = blake3.blake3(secret.strip().encode(), derive_key_context=_CONTEXT).digest()
    if not keys:
        raise SigningKeyError(f"{source}: no key in it")
    return ManifestKeys(signing_id=next(iter(keys)), keys=keys)


def signature_state(content: bytes, signature: Any, keys: ManifestKeys | None) -> str:
    """One of :data:`SIGNATURE_STATES` for a manifest's ``signature`` over ``content``: ``valid`` (an
    accepted key's MAC matches), ``INVALID`` (changed after signing, a key that is not accepted, not a
    signature at all), ``unsigned``, or ``no key`` (signed, and no key is configured to check it)."""
    if signature is None:
        return "unsigned"
    if keys is None:
        return "no key"
    return "valid" if keys.check(content, signature) is None else "INVALID"


def signature_legend(shown: bool) -> str:
    """The line under ``field ckpt list --verify``: what the signature column's words mean, or, where no
    manifest is signed and no key is set (no column ``shown``), that nothing is."""
    if not shown:
        return f"signature: none is signed and no key is set ({KEY_ENV}; docs/security.md)"
    return (
        "signature: 'INVALID' = forged, changed after signing or signed with a key not accepted (refused);"
        f" 'unsigned' = refused once a key is set; 'no key' = signed, but no key is set to check it ({KEY_ENV})"
    )


def signature_status(content: bytes, signature: Any, keys: ManifestKeys | None) -> str:
    """How far a manifest's signature vouches for it under ``keys``, in words (``field ckpt verify|inspect``)."""
    key_id = signature.get("key_id") if isinstance(signature, dict) else None
    if keys is None:
        return f"signed with key {key_id!r}, not checked: no key configured" if signature else "unsigned"
    problem = keys.check(content, signature)
    return f"REFUSED: {problem}" if problem else f"signature valid (key {key_id!r})"
