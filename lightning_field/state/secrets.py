"""The one secret filter: what the printed config, the manifests, the W&B config, the evidence bundle
and the record show in place of a secret.

A key is secret when one of its words names a secret (``api_key``, ``password``, ``hf_token``), not
when a secret word merely occurs in it: ``tokenizer``, ``max_tokens`` and ``token_budget`` define the
trajectory and must appear in full, so a change to them is visible and refuses a resume. Words are
the snake, kebab, dotted and camel-case parts of the key. A value is secret when it looks like a
credential whatever its key (a W&B API key, ``sk-...``, an AWS access key id, a GitHub or Hugging
Face token, a password inside a URL).

A redacted value is replaced by a short, deterministic digest, ``<redacted:pbkdf2:0123456789abcdef>``,
not by one constant: two runs with different secrets then differ in their recorded config, so the
resume check (which compares the recorded configs) refuses a changed secret as it refuses any other
changed key, and the value itself is never written anywhere.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

REDACTED_PREFIX = "<redacted"
_MARKER = re.compile(r"^<redacted(:[a-z0-9-]+:[0-9a-f]+)?>$")

# A word anywhere in the key makes it secret: these words name nothing else.
_SECRET_WORDS = frozenset(
    {"password", "passwd", "passphrase", "secret", "secrets", "credential", "credentials", "apikey"}
)
# Two adjacent words that name a secret (``api_key``, ``aws_secret_access_key``, ``ssh-private-key``).
_SECRET_PAIRS = frozenset({("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key")})
# ``token`` is secret as the whole key or its last word (``hf_token``, ``accessToken``), except after
# these words: a tokenizer's special tokens (``pad_token: "<pad>"``) are vocabulary, and ``max_token``
# or ``next_token`` count or name tokens of the data, not credentials.
_NOT_A_CREDENTIAL_TOKEN = frozenset(
    {"bos", "eos", "pad", "unk", "mask", "sep", "cls", "start", "end", "special", "image", "audio", "video"}
    | {"max", "min", "num", "n", "total", "first", "last", "next", "per"}
)

_SECRET_VALUES = (
    re.compile(r"^[0-9a-f]{40}$"),  # a W&B API key (alone: a longer hex digest is not one)
    re.compile(r"^local-[0-9a-f]{40}$"),  # a W&B server's local key
    re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}"),  # OpenAI / Anthropic style keys
    re.compile(r"\b(AKIA|ASIA)[A-Z0-9]{16}\b"),  # AWS access key ids (long-term, temporary)
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{16,}"),  # GitHub tokens
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{22,}"),
    re.compile(r"\bhf_[A-Za-z0-9]{30,}"),  # Hugging Face tokens
    re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),  # Slack tokens
    re.compile(r"://[^/\s:@]+:[^/\s@]+@"),  # a password inside a URL (postgres://user:pw@host)
)

_CAMEL_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def key_words(key: str) -> list[str]:
    """The lower-case words of a key: ``hfToken`` -> ``[hf, token]``, ``AWS_SECRET-key`` -> ``[aws, secret, key]``."""
    words: list[str] = []
    for part in re.split(r"[^A-Za-z0-9]+", key):
        words += [w.lower() for w in _CAMEL_WORDS.findall(part)]
    return words


def is_secret_key(key: str) -> bool:
    words = key_words(key)
    if not words:
        return False
    if any(w in _SECRET_WORDS for w in words):
        return True
    if any(pair in _SECRET_PAIRS for pair in itertools.pairwise(words)):
        return True
    if words[-1] == "token":
        return len(words) == 1 or words[-2] not in _NOT_A_CREDENTIAL_TOKEN
    return False


def is_secret_value(value: str) -> bool:
    return not _MARKER.match(value) and any(pattern.search(value) for pattern in _SECRET_VALUES)


@lru_cache(maxsize=1024)
def _digest(text: str) -> str:
    # PBKDF2 with a fixed, public salt rather than plain SHA-256 or a keyed hash:
    # - deterministic everywhere (no per-machine key), so a resume on another node, `field evidence
    #   check` and the record compare the same digest for the same secret;
    # - the salt keeps it out of generic SHA-256 lookup tables, and 100k iterations make guessing a
    #   low-entropy password from a shared manifest ~10^5 times dearer than one hash per guess;
    # - 16 hex digits (64 bits) are plenty to tell two secrets apart and say little about either.
    raw = hashlib.pbkdf2_hmac("sha256", text.encode(), b"lightning_field/redacted/v1", 100_000)
    return raw.hex()[:16]


def redact(value: Any) -> Any:
    """The marker that stands for ``value``: its digest, so a change is still seen. ``None`` and
    booleans (``use_auth_token: true``) hold no secret and stay as they are; a marker stays a marker."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and _MARKER.match(value):
        return value
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=repr)
    return f"{REDACTED_PREFIX}:pbkdf2:{_digest(text)}>"


def scrub_secrets(value: Any) -> Any:
    """A plain-data copy of ``value`` with secret keys' values and secret-looking values redacted.

    Idempotent: an already scrubbed config comes back unchanged, so layers that each scrub (the W&B
    logger over hparams the app already scrubbed) agree with the manifest.
    """
    if isinstance(value, Mapping):
        return {str(k): (redact(v) if is_secret_key(str(k)) else scrub_secrets(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub_secrets(v) for v in value]
    if isinstance(value, str):
        return redact(value) if is_secret_value(value) else value
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return repr(value)


def is_redacted(value: Any) -> bool:
    return isinstance(value, str) and bool(_MARKER.match(value))


# Below this length a secret is redacted where its key says it is one, but not searched for inside
# other text: replacing every "1234" in a Hydra file would garble it and protect nothing.
_MIN_SEARCHED_SECRET = 8


def scrub_override(override: str) -> str:
    """A Hydra command-line override (``key=value``, ``+key=value``, ``~key``) with a secret value
    redacted: the key names a secret, or the value looks like a credential."""
    key, sep, value = override.partition("=")
    if not sep:
        return override
    bare = value.strip().strip("'\"")
    secret = is_secret_key(key.lstrip("+~").split(".")[-1]) or is_secret_value(bare)
    return f"{key}={redact(bare)}" if secret and bare and not is_redacted(bare) else override


def secret_values(config: Any, overrides: list[str]) -> set[str]:
    """The secrets in ``config`` (values under secret keys, credential-looking values) and in the
    ``overrides``, as text, long enough to be searched for in other text (:func:`replace_secrets`)."""
    found: set[str] = set()

    def visit(value: Any, under_secret_key: bool) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                visit(v, under_secret_key or is_secret_key(str(k)))
        elif isinstance(value, (list, tuple)):
            for v in value:
                visit(v, under_secret_key)
        elif isinstance(value, (str, int, float)) and not isinstance(value, bool):
            text = str(value)
            if (under_secret_key or is_secret_value(text)) and not is_redacted(text):
                found.add(text)

    visit(config, False)
    for override in overrides:
        if scrub_override(override) != override:
            found.add(override.partition("=")[2].strip().strip("'\""))
    return {s for s in found if len(s) >= _MIN_SEARCHED_SECRET}


def replace_secrets(value: Any, secrets: set[str]) -> Any:
    """A copy of ``value`` where each of ``secrets`` inside any string is replaced by its marker."""
    if isinstance(value, Mapping):
        return {k: replace_secrets(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [replace_secrets(v, secrets) for v in value]
    if isinstance(value, str):
        for secret in sorted(secrets, key=len, reverse=True):
            value = value.replace(secret, redact(secret))
    return value
