"""Verification: a checkpoint is trusted only after every byte matches its manifest."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from lightning_field.checkpoint.stores import (
    CheckpointReader,
    LocalStore,
    checkpoint_location,
    read_manifest,
    store_for,
)
from lightning_field.core.errors import CheckpointError
from lightning_field.core.manifest import MANIFEST_NAME, Manifest, ManifestError
from lightning_field.core.member_paths import UnsafeMemberError, resolve_member
from lightning_field.core.signing import keys_from_environment
from lightning_field.core.storage import Location, StorageOptions, basename

_STEP_IN_NAME = re.compile(r"(?:^|-)step=(\d+)(?=-|$)")


def steps_in_name(name: str) -> set[int]:
    """The steps a checkpoint's name states: ``epoch=0-step=20``, ``failed-step=5``, ``epoch=0-step=20-v1``
    and ``step=20`` state one; a name without ``step=`` (``last``, ``model-epoch=3``) states none."""
    return {int(step) for step in _STEP_IN_NAME.findall(name)}


def name_step_problem(location: Location, manifest: Manifest) -> str | None:
    """Why a checkpoint whose name states a step other than its manifest's is refused, or None: a
    directory named ``epoch=0-step=20`` holding step 10's manifest is an older checkpoint put in a
    newer one's place (or renamed), and is never resumed. A name that states no step is not checked."""
    stated = steps_in_name(basename(location))
    if not stated or stated == {manifest.step}:
        return None
    named = ", ".join(str(step) for step in sorted(stated))
    return (
        f"{location}: its name says step {named}, but its manifest is of step {manifest.step} (renamed, or another"
        " checkpoint put in its place): refused"
    )


class CheckpointCorruptError(CheckpointError, RuntimeError):
    """A checkpoint's files do not match its manifest. The message names every bad file."""


def refuse_misnamed(location: Location, manifest: Manifest) -> None:
    """Refuse to load a checkpoint whose name states another step than its manifest (:func:`name_step_problem`):
    named by the user (``ckpt_path=...``) as much as found by ``"last"``, the name is what they trusted.

    Raises:
        CheckpointCorruptError: naming both steps.
    """
    if (misnamed := name_step_problem(location, manifest)) is not None:
        raise CheckpointCorruptError(f"checkpoint {location} was refused:\n  {misnamed}")


@dataclass
class VerifyReport:
    path: Location
    manifest: Manifest | None
    problems: list[str] = field(default_factory=list)
    # Per file of a local checkpoint, the stat identity it had while it was hashed, unchanged over
    # the hash: a later check of the same bytes trusts this hash instead of reading them again.
    fingerprints: dict[str, tuple[int, ...]] = field(default_factory=dict)
    signature_refused: bool = False  # the manifest's signature, not a file, is (among) the problems

    @property
    def files_intact(self) -> bool:
        """Every file matched its manifest: what is wrong, if anything, is the signature alone."""
        return self.manifest is not None and len(self.problems) == int(self.signature_refused)

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
    store: CheckpointReader | None = None,
    manifest: Manifest | None = None,
) -> VerifyReport:
    """Check sizes, then hashes, of ``files`` (default: every file in the manifest), once the
    checkpoint's name agrees with its manifest's step (:func:`name_step_problem`).

    Sizes are compared before any hashing so a truncated file is reported without reading it.
    ``path`` may be an fsspec URL; its objects are then streamed through the hash. ``store``: the
    store that reads it (default: the one :func:`~lightning_field.checkpoint.stores.store_for` picks).
    ``manifest``: the checkpoint's manifest where the caller has read it already (a resolver listing
    the checkpoints), so that each is read once.
    """
    location = checkpoint_location(path)  # an advertised <name>.ckpt: its folder
    reader = store or store_for(location, storage_options)
    if manifest is None:
        try:
            manifest = read_manifest(location, store=reader)
        except ManifestError as err:
            return VerifyReport(location, None, [str(err)])
    if (misnamed := name_step_problem(location, manifest)) is not None:
        return VerifyReport(location, manifest, [misnamed])  # refused by its name: no byte needs hashing
    return verify_against(manifest, reader, location, files, progress)


def verify_against(
    manifest: Manifest,
    reader: CheckpointReader,
    location: Location,
    files: Iterable[str] | None = None,
    progress: ProgressFn | None = None,
    earlier: VerifyReport | None = None,
) -> VerifyReport:
    """Check the files of the checkpoint at ``location``, as ``reader`` reads them, against
    ``manifest``: also used on a local copy of remote objects, so that what is loaded is exactly
    what was verified.

    ``earlier``: this process's verification of the same local checkpoint (the resolver's, handed
    to the load). A file it hashed is not hashed again when its manifest entry and its stat
    identity (device, inode, size, modification and change times) are unchanged since; any
    difference, or a remote checkpoint, is hashed again.
    """
    report = VerifyReport(location, manifest)
    keys = keys_from_environment()
    if keys is not None and (unsigned := keys.check(manifest.signed_content(), manifest.signature)) is not None:
        report.problems.append(f"{reader.describe(location, MANIFEST_NAME)}: {unsigned}")
        report.signature_refused = True
    names = list(manifest.files) if files is None else list(files)
    total = sum(manifest.files[n].size for n in names if n in manifest.files)
    done = 0
    to_hash = []
    for name in names:
        entry = manifest.files.get(name)
        where = reader.describe(location, name)
        try:
            actual = reader.size(location, name) if entry is not None else None
        except UnsafeMemberError as err:  # a symlink out of the checkpoint, a device: never read
            report.problems.append(str(err))
            continue
        if entry is None:
            report.problems.append(f"{where}: not listed in the manifest")
        elif actual is None:
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

    local = isinstance(reader, LocalStore) and isinstance(location, Path)
    for name, entry in to_hash:
        before = _fingerprint(location, name) if local else None
        if before is not None and _still_verified(earlier, location, manifest, name, before):
            report.fingerprints[name] = before
            on_chunk(entry.size)
            continue
        digest = reader.digest(location, name, on_chunk, manifest.hash_algorithm)  # the one its format names
        if before is not None and digest == entry.hash and _fingerprint(location, name) == before:
            report.fingerprints[name] = before
        if digest != entry.hash:
            where, recorded = reader.describe(location, name), entry.hash[:16]
            report.problems.append(f"{where}: content hash {digest[:16]}… does not match the manifest's {recorded}…")
    return report


def _fingerprint(location: Location, name: str) -> tuple[int, ...] | None:
    path = resolve_member(Path(location), name)
    if path is None:
        return None
    st = os.stat(path)
    # The change time cannot be set back by a writer, unlike the modification time.
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _still_verified(
    earlier: VerifyReport | None, location: Location, manifest: Manifest, name: str, now: tuple[int, ...]
) -> bool:
    if earlier is None or not earlier.intact or earlier.manifest is None or not isinstance(earlier.path, Path):
        return False
    same_place = earlier.path.resolve() == Path(location).resolve()
    same_entry = earlier.manifest.files.get(name) == manifest.files.get(name)
    return same_place and same_entry and earlier.fingerprints.get(name) == now


def require_intact(
    path: str | os.PathLike[str],
    files: Iterable[str] | None = None,
    storage_options: StorageOptions | None = None,
    store: CheckpointReader | None = None,
) -> Manifest:
    """Verify, raising :class:`CheckpointCorruptError` that names each bad file."""
    report = verify_checkpoint(path, files, storage_options=storage_options, store=store)
    if not report.intact:
        raise CheckpointCorruptError(
            f"checkpoint {report.path} failed verification:\n  " + "\n  ".join(report.problems)
        )
    assert report.manifest is not None
    return report.manifest
