"""Verification: a checkpoint is trusted only after every byte matches its manifest."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from lightning_field.core.hashing import hash_file, hash_stream
from lightning_field.core.manifest import Manifest, ManifestError, read_manifest
from lightning_field.core.storage import Location, StorageOptions, as_location, open_fs


class CheckpointCorruptError(RuntimeError):
    """A checkpoint's files do not match its manifest. The message names every bad file."""


@dataclass
class VerifyReport:
    path: Location
    manifest: Manifest | None
    problems: list[str] = field(default_factory=list)

    @property
    def intact(self) -> bool:
        return self.manifest is not None and not self.problems

    @property
    def recoverable(self) -> bool:
        return self.intact and bool(self.manifest and self.manifest.recoverable)


ProgressFn = Callable[[int, int], None]
"""Called with (bytes hashed so far, total bytes)."""


def verify_checkpoint(
    path: str | os.PathLike[str],
    files: Iterable[str] | None = None,
    progress: ProgressFn | None = None,
    storage_options: StorageOptions | None = None,
) -> VerifyReport:
    """Check sizes, then hashes, of ``files`` (default: every file in the manifest).

    Sizes are compared before any hashing so a truncated file is reported without reading it.
    ``path`` may be an fsspec URL; its objects are then streamed through the hash.
    """
    location = as_location(path)
    try:
        manifest = read_manifest(location, storage_options)
    except ManifestError as err:
        return VerifyReport(location, None, [str(err)])
    reader = LocalFiles(location) if isinstance(location, Path) else ObjectFiles(location, storage_options)
    return verify_against(manifest, reader, files, progress)


class LocalFiles:
    """Sizes and hashes of files in a local directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def describe(self, name: str) -> str:
        return str(self.root / name)

    def size(self, name: str) -> int | None:
        file_path = self.root / name
        return file_path.stat().st_size if file_path.is_file() else None

    def digest(self, name: str, on_chunk: Callable[[int], None], algorithm: str) -> str:
        # All cores: verification runs before training resumes, with nothing else to do.
        return hash_file(self.root / name, progress=on_chunk, algorithm=algorithm, threads=True)[1]


class ObjectFiles:
    """Sizes and hashes of the objects under an fsspec URL prefix, read in large sequential blocks."""

    def __init__(self, url: str, storage_options: StorageOptions | None = None) -> None:
        self.url = url
        self.fs, self.prefix = open_fs(url, storage_options)

    def describe(self, name: str) -> str:
        return f"{self.url}/{name}"

    def size(self, name: str) -> int | None:
        try:
            info = self.fs.info(f"{self.prefix}/{name}")
        except FileNotFoundError:
            return None
        return int(info["size"]) if info.get("type") == "file" else None

    def digest(self, name: str, on_chunk: Callable[[int], None], algorithm: str) -> str:
        with self.fs.open(f"{self.prefix}/{name}", "rb", block_size=_REMOTE_BLOCK) as f:
            return hash_stream(f, progress=on_chunk, algorithm=algorithm, threads=True)[1]


_REMOTE_BLOCK = 16 << 20


def verify_against(
    manifest: Manifest,
    reader: LocalFiles | ObjectFiles,
    files: Iterable[str] | None = None,
    progress: ProgressFn | None = None,
) -> VerifyReport:
    """Check ``reader``'s files against ``manifest``: also used on a local copy of remote objects,
    so that what is loaded is exactly what was verified."""
    location: Location = reader.root if isinstance(reader, LocalFiles) else reader.url
    report = VerifyReport(location, manifest)
    names = list(manifest.files) if files is None else list(files)
    total = sum(manifest.files[n].size for n in names if n in manifest.files)
    done = 0
    to_hash = []
    for name in names:
        entry = manifest.files.get(name)
        where = reader.describe(name)
        if entry is None:
            report.problems.append(f"{where}: not listed in the manifest")
        elif (actual := reader.size(name)) is None:
            report.problems.append(f"{where}: missing")
        elif actual != entry.size:
            report.problems.append(f"{where}: size {actual} bytes, manifest says {entry.size} (truncated or extended)")
        else:
            to_hash.append((name, entry))

    def on_chunk(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(done, total)

    for name, entry in to_hash:
        digest = reader.digest(name, on_chunk, manifest.hash_algorithm)  # the one its format names
        if digest != entry.hash:
            report.problems.append(
                f"{reader.describe(name)}: content hash {digest[:16]}… does not match the manifest's {entry.hash[:16]}…"
            )
    return report


def require_intact(
    path: str | os.PathLike[str], files: Iterable[str] | None = None, storage_options: StorageOptions | None = None
) -> Manifest:
    """Verify, raising :class:`CheckpointCorruptError` that names each bad file."""
    report = verify_checkpoint(path, files, storage_options=storage_options)
    if not report.intact:
        raise CheckpointCorruptError(
            f"checkpoint {report.path} failed verification:\n  " + "\n  ".join(report.problems)
        )
    assert report.manifest is not None
    return report.manifest
