"""Content hashes: the one module that knows which algorithm hashes what.

Every file a claim rests on (checkpoint files, the evidence bundle's manifest copies, a record's
sources and plots, a W&B artifact's file list) is hashed here, so changing the algorithm is one
edit and a reader never has to guess which algorithm an old document used.

* **BLAKE3** (``HASH_ALGORITHM``) for everything written now. It is cryptographic, so tampering and
  corruption stay detectable, and it runs at ~7 GB/s on one core of the 2-core dev box (more with
  its own threads), against SHA-256's ~1.8 GB/s: at SHA-256's speed the hash, not the disk, bounded
  every save and every verified resume.
* **SHA-256** is still read: format-1 checkpoint manifests, ``lightning_field.evidence/1`` bundles
  and ``lightning_field.record/1`` records name it. Identity hashes of configs and code
  (``state/provenance.py``) and a record's signed content hash stay SHA-256 on purpose: they are
  compared across versions (a checkpoint's config hash against today's), over a few KB, where
  speed does not matter and a change would refuse every older checkpoint's resume.

A *labelled digest* (``"blake3:<hex>"``) carries its algorithm with it; documents other than the
checkpoint manifest (which names its algorithm once, for every file) store digests that way.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any

import blake3

HASH_ALGORITHM = "blake3"
"""The algorithm of every content hash written now (checkpoint manifest format 2 and later)."""

HASH_ALGORITHMS = ("sha256", "blake3")
"""Every algorithm a document may name."""

IDENTITY_ALGORITHM = "sha256"
"""Config/code identity and signed-content hashes: stable across versions, see the module docstring."""

_CHUNK = 8 << 20

_MIN_CORES_FOR_THREADED_WRITE_HASH = 4
"""A save hashes with BLAKE3's own threads only where at least this many cores are ours: the write
itself keeps one core busy (the kernel's copy into the page cache) and the training process others;
on 2 cores a threaded hash would take the writer's core and slow the save down."""


def new_hasher(algorithm: str = HASH_ALGORITHM, threads: bool = False) -> Any:
    """A streaming hasher (``update``/``hexdigest``) for ``algorithm``.

    ``threads`` lets BLAKE3 hash each large update on all cores. Verification asks for it (nothing
    else runs then); a save asks for it only through ``write_hash_threads()``.

    Raises:
        ValueError: ``algorithm`` is not one of ``HASH_ALGORITHMS``.
    """
    if algorithm == "blake3":
        return blake3.blake3(max_threads=blake3.blake3.AUTO if threads else 1)
    if algorithm == "sha256":
        return hashlib.sha256()
    raise ValueError(f"unsupported hash algorithm {algorithm!r}; known: {', '.join(HASH_ALGORITHMS)}")


def available_cores() -> int:
    """Cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def write_hash_threads() -> bool:
    """Whether a save may hash with BLAKE3's threads beside its write (``_MIN_CORES_FOR_THREADED_WRITE_HASH``)."""
    return available_cores() >= _MIN_CORES_FOR_THREADED_WRITE_HASH


def hash_stream(
    f: Any, progress: Any = None, algorithm: str = HASH_ALGORITHM, threads: bool = False
) -> tuple[int, str]:
    """Hash a binary file object (local or fsspec) to its end; returns (size, hex digest).
    ``progress(n_bytes)`` is called per chunk."""
    hasher = new_hasher(algorithm, threads)
    size = 0
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    while True:
        n = f.readinto(buf)
        if not n:
            break
        hasher.update(view[:n])
        size += n
        if progress is not None:
            progress(n)
    return size, hasher.hexdigest()


def hash_file(
    path: str | os.PathLike[str], progress: Any = None, algorithm: str = HASH_ALGORITHM, threads: bool = False
) -> tuple[int, str]:
    """Stream a file through ``algorithm``; returns (size, hex digest)."""
    with open(path, "rb", buffering=0) as f:
        return hash_stream(f, progress, algorithm, threads)


def hash_bytes(data: bytes, algorithm: str = HASH_ALGORITHM) -> str:
    """Hex digest of an in-memory buffer."""
    hasher = new_hasher(algorithm)
    hasher.update(data)
    return hasher.hexdigest()


def labelled(algorithm: str, hex_digest: str) -> str:
    return f"{algorithm}:{hex_digest}"


def file_digest(path: str | os.PathLike[str]) -> str:
    """The labelled digest (``"blake3:<hex>"``) of a file's bytes."""
    return labelled(HASH_ALGORITHM, hash_file(path)[1])


def bytes_digest(data: bytes) -> str:
    """The labelled digest of an in-memory buffer."""
    return labelled(HASH_ALGORITHM, hash_bytes(data))


def split_digest(recorded: str, legacy_algorithm: str = "sha256") -> tuple[str, str]:
    """(algorithm, hex) of a labelled digest; an unlabelled one (written by a version-1 document)
    is ``legacy_algorithm``.

    Raises:
        ValueError: the label names an algorithm this version does not know.
    """
    algorithm, sep, hex_digest = recorded.partition(":")
    if not sep:
        return legacy_algorithm, recorded
    if algorithm not in HASH_ALGORITHMS:
        raise ValueError(f"unsupported hash algorithm {algorithm!r} in digest {recorded[:24]!r}")
    return algorithm, hex_digest


def recorded_digest(entry: Mapping[str, Any], key: str, legacy_key: str) -> str:
    """The digest a document entry cites: labelled under ``key`` (format 2), else the bare SHA-256
    that format 1 wrote under ``legacy_key``."""
    return entry.get(key) or entry[legacy_key]


def file_matches(path: str | os.PathLike[str], recorded: str) -> bool:
    """Whether the file's bytes still hash to ``recorded`` (labelled, or a legacy bare SHA-256)."""
    algorithm, hex_digest = split_digest(recorded)
    return hash_file(path, algorithm=algorithm)[1] == hex_digest
