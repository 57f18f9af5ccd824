"""Verification: a checkpoint is trusted only after every byte matches its manifest."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from lightning_field.core.fsio import hash_file
from lightning_field.core.manifest import Manifest, ManifestError, read_manifest


class CheckpointCorruptError(RuntimeError):
    """A checkpoint's files do not match its manifest. The message names every bad file."""


@dataclass
class VerifyReport:
    path: Path
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
) -> VerifyReport:
    """Check sizes, then hashes, of ``files`` (default: every file in the manifest).

    Sizes are compared before any hashing so a truncated file is reported without reading it.
    """
    path = Path(path)
    try:
        manifest = read_manifest(path)
    except ManifestError as err:
        return VerifyReport(path, None, [str(err)])
    report = VerifyReport(path, manifest)
    names = list(manifest.files) if files is None else list(files)
    total = sum(manifest.files[n].size for n in names if n in manifest.files)
    done = 0
    to_hash = []
    for name in names:
        entry = manifest.files.get(name)
        file_path = path / name
        if entry is None:
            report.problems.append(f"{file_path}: not listed in the manifest")
        elif not file_path.is_file():
            report.problems.append(f"{file_path}: missing")
        elif (actual := file_path.stat().st_size) != entry.size:
            report.problems.append(
                f"{file_path}: size {actual} bytes, manifest says {entry.size} (truncated or extended)"
            )
        else:
            to_hash.append((name, entry))

    def on_chunk(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(done, total)

    for name, entry in to_hash:
        _, digest = hash_file(path / name, progress=on_chunk)
        if digest != entry.hash:
            report.problems.append(
                f"{path / name}: content hash {digest[:16]}… does not match the manifest's {entry.hash[:16]}…"
            )
    return report


def require_intact(path: str | os.PathLike[str], files: Iterable[str] | None = None) -> Manifest:
    """Verify, raising :class:`CheckpointCorruptError` that names each bad file."""
    report = verify_checkpoint(path, files)
    if not report.intact:
        raise CheckpointCorruptError(
            f"checkpoint {report.path} failed verification:\n  " + "\n  ".join(report.problems)
        )
    assert report.manifest is not None
    return report.manifest
