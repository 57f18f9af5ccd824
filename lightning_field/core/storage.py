"""Where checkpoint bytes live: a local directory, or any fsspec URL (``s3://bucket/run/ckpts``).

Local paths keep the POSIX commit protocol (fsync, atomic rename). A URL names an object store,
which has neither: there, a checkpoint's ``manifest.json`` object, written last in one PUT, is the
commit. Everything that must tell the two apart asks :func:`is_url` instead of guessing from a
``Path``, which would also silently collapse ``s3://`` into ``s3:/``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fsspec.core import url_to_fs

Location = Path | str
"""A local checkpoint path (``Path``) or an object-store URL (``str`` with a protocol)."""

StorageOptions = Mapping[str, Any]


def is_url(location: str | os.PathLike[str]) -> bool:
    """True for a URL of a non-local fsspec filesystem; ``file://`` URLs and plain paths are local."""
    text = os.fspath(location)
    if "://" not in text:
        return False
    return not text.startswith(("file://", "local://"))


def as_location(location: str | os.PathLike[str]) -> Location:
    """A ``Path`` for a local path (``file://`` stripped), the URL string unchanged otherwise."""
    text = os.fspath(location)
    if is_url(text):
        return text.rstrip("/")
    for prefix in ("file://", "local://"):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    return Path(text)


def join(location: str | os.PathLike[str], *names: str) -> Location:
    """``location / name`` for either kind, without letting ``Path`` mangle a URL."""
    loc = as_location(location)
    if isinstance(loc, Path):
        return loc.joinpath(*names)
    return "/".join([loc, *names])


def parent(location: str | os.PathLike[str]) -> Location:
    loc = as_location(location)
    if isinstance(loc, Path):
        return loc.parent
    return loc.rsplit("/", 1)[0]


def basename(location: str | os.PathLike[str]) -> str:
    loc = as_location(location)
    return loc.name if isinstance(loc, Path) else loc.rsplit("/", 1)[-1]


def fs_options(storage_options: StorageOptions | None = None) -> dict[str, Any]:
    """``storage_options`` with listings caching off unless asked for: other processes (other ranks,
    the next attempt) create and delete checkpoints, and a cached listing would hide a fresh manifest."""
    return {"use_listings_cache": False, **dict(storage_options or {})}


def open_fs(url: str, storage_options: StorageOptions | None = None) -> tuple[Any, str]:
    """The fsspec filesystem for ``url`` with ``storage_options`` (e.g. ``endpoint_url``) and the
    protocol-less path inside it. fsspec caches instances by their options, so this is cheap."""
    try:
        return url_to_fs(url, **fs_options(storage_options))
    except (ImportError, ValueError) as err:
        protocol = url.split("://", 1)[0]
        hint = " (install lightning-field[s3] for s3:// URLs)" if protocol in ("s3", "s3a") else ""
        raise ValueError(f"cannot open checkpoint location {url!r}: {err}{hint}") from err


def to_url(fs: Any, path: str) -> str:
    """The full URL of a protocol-less ``path`` returned by ``fs`` listings."""
    return fs.unstrip_protocol(path).rstrip("/")


def unusable_local_dir(dirpath: str | os.PathLike[str] | None) -> str | None:
    """Why checkpoints cannot be written under a local ``dirpath``, or None (URLs are the store's)."""
    if not dirpath or is_url(str(dirpath)):
        return None
    path = Path(dirpath)
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        return f"{existing} is a file, not a directory"
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable by this process"
    return None


def same_location(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two paths (resolved) or URLs name the same checkpoint."""

    def identity(location: str | os.PathLike[str]) -> str:
        loc = as_location(location)
        return str(loc.resolve()) if isinstance(loc, Path) else loc

    return identity(a) == identity(b)
