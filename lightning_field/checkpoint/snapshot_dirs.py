"""Where step snapshots live on a machine: one private folder per user under a node-local parent
(``/dev/shm`` by default), then one per persistent checkpoint directory. Without torch or
Lightning, so that ``field ckpt list`` finds a run's snapshot tier as cheaply as its checkpoints."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from lightning_field.core.hashing import IDENTITY_ALGORITHM, new_hasher
from lightning_field.core.storage import as_location, basename

__all__ = ["DEFAULT_PARENT", "make_private", "private_folder_problem", "snapshot_dir_for"]

DEFAULT_PARENT = Path("/dev/shm")


def snapshot_dir_for(
    checkpoint_dir: str | os.PathLike[str], parent: str | os.PathLike[str] | None = None, node: int | None = None
) -> Path:
    """Where the snapshots of the checkpoints under ``checkpoint_dir`` live: one private folder per
    user under ``parent`` (``/dev/shm`` where it is writable, else the temporary directory), then
    one per checkpoint directory, so that a restarted run on the same machine finds its own.

    ``node``: the node rank of a run over several nodes (None in a one-node run). Each node's folder
    is named for it, so that nodes sharing a host (two launcher agents on one machine) never share one.
    """
    if parent is None:
        parent = DEFAULT_PARENT if os.access(DEFAULT_PARENT, os.W_OK | os.X_OK) else Path(tempfile.gettempdir())
    location = as_location(checkpoint_dir)
    identity = str(location.resolve()) if isinstance(location, Path) else location
    key = new_hasher(IDENTITY_ALGORITHM)
    key.update(identity.encode())
    suffix = "" if node is None else f"-node{int(node)}"
    name = f"{basename(location)}-{key.hexdigest()[:16]}{suffix}"
    return Path(parent) / f"lightning_field-snapshots-{os.getuid()}" / name


def make_private(root: Path) -> None:
    """Create ``root`` (and its per-user parent) private; refuse one another user could write.

    Raises:
        PermissionError: a folder on the way is not a directory of this user's, or others can write it.
    """
    root.parent.parent.mkdir(parents=True, exist_ok=True)
    for folder in (root.parent, root):
        folder.mkdir(mode=0o700, exist_ok=True)
        info = folder.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
            raise PermissionError(
                f"snapshot directory {folder} is not a private directory of this user (owner uid {info.st_uid},"
                f" mode {stat.filemode(info.st_mode)}): a snapshot planted there would be resumed. Remove it, or"
                " pass SnapshotConfig(directory=...) a directory of your own."
            )


def private_folder_problem(root: Path) -> str | None:
    """:func:`make_private` as a problem to share between ranks: why ``root`` is unusable, or None."""
    try:
        make_private(root)
    except OSError as err:
        return str(err)
    return None
