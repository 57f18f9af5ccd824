"""``--storage-option KEY=VALUE``: fsspec storage options given on the command line."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from lightning_field.core.storage import StorageOptions

__all__ = ["parse_storage_options", "storage_options_of"]


def parse_storage_options(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs as fsspec storage options. A value is read as JSON where it parses
    (``anon=true``, ``default_block_size=8388608``) and kept as text otherwise; a dotted key nests
    (``client_kwargs.region_name=eu-west-1``), as s3fs expects its botocore arguments."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--storage-option takes KEY=VALUE, got {pair!r}")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        *parents, leaf = key.split(".")
        target = options
        for name in parents:
            nested = target.setdefault(name, {})
            if not isinstance(nested, dict):
                raise ValueError(f"--storage-option {pair!r}: {name!r} is already set to a value, not a group")
            target = nested
        target[leaf] = value
    return options


def storage_options_of(args: argparse.Namespace) -> StorageOptions | None:
    """The ``--storage-option`` pairs of a ``field ckpt`` command; a malformed one exits 2, naming it."""
    try:
        return parse_storage_options(args.storage_option) or None
    except ValueError as err:
        print(f"field ckpt: {err}", file=sys.stderr)
        raise SystemExit(2) from None
