"""The commit protocol on a POSIX filesystem: hidden temporary directory, fsync, atomic rename.

1. Every rank writes its files into a hidden ``.tmp-*`` directory, hashing while writing, and fsyncs.
2. Rank 0 writes ``manifest.json`` (temporary file, fsync, rename) into it, renames the directory
   into place, fsyncs the parent, and replaces the ``LAST`` pointer.

A crash before the directory rename leaves only a hidden directory, which no reader lists and the
next run's setup deletes. After it, the checkpoint is complete.

**The advertised file.** ModelCheckpoint's users open the path it advertises with
``Model.load_from_checkpoint``, ``torch.load`` or ``trainer.fit(ckpt_path=...)``. A checkpoint's
``state.pt`` is the complete Lightning checkpoint, so after the commit it gets a second name beside
the folder, ``<name>.ckpt`` (:func:`advertise`): a hard link, no byte copied, the very bytes the
manifest hashes. The folder stays the unit of the commit (one rename), so the commit protocol,
verification, retention, drills and every reader stay as they were; the manifest is still the
commit, and a ``.ckpt`` without a committed folder behind it is never resumed as ours.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from lightning_field.checkpoint.stores.base import RankOutcome, write_rank_files
from lightning_field.core.fsio import (
    atomic_write_bytes,
    exchange_or_replace_dir,
    fsync_dir,
    remove_dir_unseen,
    remove_tree,
)
from lightning_field.core.hashing import hash_file
from lightning_field.core.manifest import MANIFEST_NAME, SHARED_STATE_FILE, Manifest
from lightning_field.core.member_paths import resolve_member

LAST_POINTER = "LAST"
TEMP_PREFIXES = (".tmp-", ".trash-")
ADVERTISED_SUFFIX = ".ckpt"
"""ModelCheckpoint's ``FILE_EXTENSION``: ``<name>.ckpt`` beside a checkpoint folder ``<name>`` is its ``state.pt``."""


class LocalStore:
    """Checkpoints in a local directory (a :class:`~lightning_field.checkpoint.stores.base.CheckpointStore`)."""

    writes_in_place = True
    durable = True  # a class default too: a user's subclass may not call this __init__

    def __init__(self, durable: bool = True) -> None:
        # False: no fsync anywhere, for checkpoints that need only outlive the process, not the
        # machine (step snapshots in /dev/shm): the page cache survives a killed process.
        self.durable = durable

    # ------------------------------------------------------------------ writing
    def prepare(self, final: Path) -> None:
        """Nothing to do: the rename in :meth:`publish` swaps out any checkpoint of the same name."""

    def hidden_dir(self, final: Path, token: str) -> Path:
        """The hidden directory this save's files are written into before the rename publishes it."""
        return temp_dir_for(final.parent, final.name, token)

    @contextlib.contextmanager
    def staging(self, final: Path, token: str) -> Iterator[Path]:
        """The hidden directory itself: what is written there is what the rename publishes."""
        yield self.hidden_dir(final, token)

    def upload(self, final: Path, staging: Path, names: list[str]) -> str | None:
        """Nothing to upload: the files are already in place."""
        return None

    def write(self, final: Path, token: str, rank: int, files: dict[str, tuple[Any, list[str]]]) -> RankOutcome:
        return write_rank_files(self.hidden_dir(final, token), rank, files, durable=self.durable)

    def publish(self, final: Path, token: str, manifest: Manifest) -> None:
        publish(temp_dir_for(final.parent, final.name, token), final, manifest, durable=self.durable)

    def discard(self, final: Path, token: str) -> None:
        shutil.rmtree(temp_dir_for(final.parent, final.name, token), ignore_errors=True)

    def remove(self, final: Path) -> None:
        unadvertise(final)  # first: the advertised name never outlives the commit it names
        remove_dir_unseen(final, durable=self.durable)

    def clean_leftovers(self, dirpath: Path) -> list[Path]:
        return clean_leftovers(dirpath)

    # ------------------------------------------------------------------ reading
    def checkpoints(self, dirpath: Path) -> list[Path]:
        if not dirpath.is_dir():
            return []
        return [
            child
            for child in dirpath.iterdir()
            if not child.name.startswith(".") and child.is_dir() and (child / MANIFEST_NAME).is_file()
        ]

    # Reads go through resolve_member: whoever can write the directory chooses what a name reaches.
    def read(self, checkpoint: Path, name: str) -> bytes | None:
        try:
            path = resolve_member(checkpoint, name)
            return None if path is None else path.read_bytes()
        except FileNotFoundError:  # removed between the check and the read
            return None

    def put(self, checkpoint: Path, name: str, data: bytes) -> None:
        atomic_write_bytes(checkpoint / name, data)

    def size(self, checkpoint: Path, name: str) -> int | None:
        path = resolve_member(checkpoint, name)
        return None if path is None else path.stat().st_size

    def digest(self, checkpoint: Path, name: str, on_chunk: Callable[[int], None], algorithm: str) -> str:
        path = resolve_member(checkpoint, name)
        if path is None:
            raise FileNotFoundError(f"{checkpoint / name}: no such file")
        # All cores: verification runs before training resumes, with nothing else to do.
        return hash_file(path, progress=on_chunk, algorithm=algorithm, threads=True)[1]

    def describe(self, checkpoint: Path, name: str) -> str:
        return str(checkpoint / name)

    @contextlib.contextmanager
    def local_copy(self, checkpoint: Path, names: list[str]) -> Iterator[Path]:
        yield checkpoint  # already local: what is verified and loaded is the checkpoint itself

    # ------------------------------------------------------------------ optional capabilities
    def exists(self, dirpath: Path) -> bool:
        """Whether ``dirpath`` is an existing directory (``field ckpt list`` tells absent from empty)."""
        return dirpath.is_dir()

    def linked_copy(self, checkpoint: Path, name: str) -> Path:
        """A copy of ``checkpoint`` beside it, named ``name``, whose files are hard links: no byte is
        copied, and the removal of ``checkpoint`` by retention leaves the copy whole (a restore
        drill loads from it). ``name`` should be hidden (``.tmp-...``), which readers never list and
        :meth:`clean_leftovers` removes.

        Raises:
            OSError: the filesystem cannot link (the partial copy is removed).
        """
        copy = checkpoint.parent / name
        try:
            shutil.copytree(checkpoint, copy, copy_function=os.link)
        except OSError:  # shutil.Error, which gathers copytree's per-file errors, is one too
            shutil.rmtree(copy, ignore_errors=True)
            raise
        return copy

    def restore_linked_copy(self, copy: Path, checkpoint: Path) -> bool:
        """Put ``copy`` (made by :meth:`linked_copy` from ``checkpoint``) back as ``checkpoint`` by one
        atomic rename, when retention has removed ``checkpoint`` since: its files are the committed
        bytes, so readers see the checkpoint whole again or not at all. A restore drill keeps the
        checkpoint it recorded this way.

        Returns:
            False, changing nothing, when anything exists under ``checkpoint``'s name (a save of the
            same name wins) or ``copy`` is gone; True once ``copy`` is ``checkpoint``.

        Raises:
            ValueError: ``copy`` is not a hidden directory beside ``checkpoint``, or ``checkpoint``
                is itself hidden: only a private copy is ever renamed into a checkpoint's place.
            OSError: the rename failed for another reason.
        """
        if (
            copy.parent != checkpoint.parent
            or not copy.name.startswith(TEMP_PREFIXES)
            or checkpoint.name in ("", ".", "..")
            or checkpoint.name.startswith(".")
        ):
            raise ValueError(f"{copy} is not a private copy beside {checkpoint}")
        if not copy.is_dir() or os.path.lexists(checkpoint):
            return False
        try:
            # A committed checkpoint is never an empty directory, so this rename never replaces one.
            os.rename(copy, checkpoint)
        except OSError as err:
            if err.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.ENOENT):
                return False  # a save of the same name published first, or the copy went meanwhile
            raise
        if self.durable:
            fsync_dir(checkpoint.parent)
        return True


def clean_leftovers(dirpath: Path) -> list[Path]:
    """Delete the hidden directories interrupted saves and removals left behind."""
    removed: list[Path] = []
    if not dirpath.is_dir():
        return removed
    for child in dirpath.iterdir():
        if child.name.startswith(TEMP_PREFIXES):
            if child.is_dir() or child.is_symlink():
                remove_tree(child)
            else:
                child.unlink(missing_ok=True)  # an advertised link that was never renamed into place
            removed.append(child)
    return removed


def advertise(checkpoint: Path, suffix: str = ADVERTISED_SUFFIX, durable: bool = True) -> Path | None:
    """Give a committed checkpoint's ``state.pt`` the name ``<name><suffix>`` beside its folder,
    replacing what had it atomically; that path, or None for a checkpoint without ``state.pt`` (a
    sharded one).

    A hard link: no byte is copied, and what a user's ``torch.load`` reads is what the manifest
    hashes. Where the filesystem has no hard links, a relative symbolic link (as ``save_last="link"``).

    Raises:
        OSError: neither link could be made, or a directory has the advertised name.
    """
    state = checkpoint / SHARED_STATE_FILE
    if not state.is_file():
        return None
    target = checkpoint.with_name(checkpoint.name + suffix)
    name_file(state, target, symbolic=False, durable=durable)
    return target


def name_file(source: Path, name: Path, symbolic: bool, durable: bool = True) -> None:
    """Make ``name`` another name of the file ``source``, replacing what had it in one rename: a hard
    link, or a relative symbolic link where ``symbolic`` or the filesystem has no hard links.

    Raises:
        OSError: no link could be made, or a directory has the name.
    """
    temp = name.parent / f".tmp-{name.name}-{os.getpid()}"
    temp.unlink(missing_ok=True)
    relative = os.path.relpath(source, name.parent)
    if symbolic:
        os.symlink(relative, temp)
    else:
        try:
            os.link(source, temp)
        except OSError:
            os.symlink(relative, temp)
    try:
        os.replace(temp, name)
    except OSError:
        temp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(name.parent)


def named_checkpoint(path: Path) -> Path | None:
    """The committed checkpoint folder whose ``state.pt`` the file ``path`` is, under any name in its
    folder (the advertised ``<name>.ckpt``, a ``last.ckpt`` that names the newest), else None."""
    folder = advertised_checkpoint(path)
    if folder is not None or not path.is_file():
        return folder
    try:
        identity = path.stat()
        siblings = list(path.parent.iterdir())
    except OSError:
        return None
    for sibling in siblings:
        state = sibling / SHARED_STATE_FILE
        try:
            same = os.path.samestat(identity, state.stat()) and (sibling / MANIFEST_NAME).is_file()
        except OSError:  # not a folder, or no state.pt
            continue
        if same and not sibling.name.startswith("."):
            return sibling
    return None


def advertised_checkpoint(path: Path) -> Path | None:
    """The checkpoint folder whose advertised file ``path`` is (:func:`advertise`: the same file as its
    ``state.pt``, a manifest beside it), else None: a file of anyone else's is never taken for ours."""
    if not path.suffix or path.name.startswith("."):
        return None
    folder = path.with_name(path.name[: -len(path.suffix)])
    try:
        if (folder / MANIFEST_NAME).is_file() and os.path.samefile(path, folder / SHARED_STATE_FILE):
            return folder
    except OSError:  # either is missing, or unreadable
        return None
    return None


def unadvertise(checkpoint: Path) -> None:
    """Remove the advertised files of ``checkpoint`` (:func:`advertise`), and nothing that is not one."""
    if not checkpoint.parent.is_dir():
        return
    ours = os.path.join(checkpoint.name, SHARED_STATE_FILE)
    for sibling in checkpoint.parent.iterdir():
        if not sibling.name.startswith(checkpoint.name + ".") or sibling.is_dir():
            continue
        if (sibling.is_symlink() and os.readlink(sibling) == ours) or advertised_checkpoint(sibling) == checkpoint:
            sibling.unlink(missing_ok=True)


def temp_dir_for(dirpath: Path, name: str, token: str) -> Path:
    return dirpath / f".tmp-{name}-{token}"


def write_last_pointer(
    dirpath: str | os.PathLike[str], checkpoint: str | os.PathLike[str], durable: bool = True
) -> None:
    """Point ``LAST`` at ``checkpoint`` by atomic replace: readers (``resolver.read_last_pointer``)
    never see it missing. Written last in :func:`publish`, after the directory rename."""
    atomic_write_bytes(Path(dirpath) / LAST_POINTER, (Path(checkpoint).name + "\n").encode(), durable)


def publish(tmp: Path, final: Path, manifest: Manifest, durable: bool = True, compact: bool = False) -> None:
    """Rank 0's last step: manifest last, then the directory rename that makes it visible, then LAST."""
    manifest.write(tmp, durable, compact)
    if durable:
        fsync_dir(tmp)
    replaced = exchange_or_replace_dir(tmp, final)
    if durable:
        fsync_dir(final.parent)
    write_last_pointer(final.parent, final, durable)
    if replaced is not None:
        remove_tree(replaced)  # a "last" committed where save_last="link" had left a link
