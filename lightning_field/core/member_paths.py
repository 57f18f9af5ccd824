"""Paths a document names inside a directory it describes, checked before any of them is used.

A manifest, an evidence bundle or a release record names its files by relative path, and whoever
can write the document chooses those names. A name is used only when it is a plain relative POSIX
path that stays inside its directory: not absolute, normalized (no ``.``, ``..`` or empty parts),
no backslash, no NUL or other control character. On a local disk the file it reaches must also
be a regular file whose real path, symlinks followed, is still inside the directory: a symlink
out of the checkpoint, a FIFO that would block a reader, or a device such as ``/dev/zero`` that
never ends is refused as well.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath

__all__ = ["UnsafeMemberError", "check_member_name", "member_name_problem", "resolve_member"]


class UnsafeMemberError(ValueError):
    """A document names a path that leaves its directory, or reaches something other than a file there."""


def member_name_problem(name: object) -> str | None:
    """Why ``name`` cannot name a file inside a directory, or None where it can."""
    if not isinstance(name, str) or not name:
        return f"{name!r} is not a file name"
    if any(ord(c) < 32 or c == "\x7f" for c in name) or "\\" in name:
        return f"{name!r} holds a control character or a backslash"
    if name.startswith("/"):
        return f"{name!r} is an absolute path"
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return f"{name!r} is not a normalized relative path (empty, '.' or '..' parts)"
    if str(PurePosixPath(name)) != name:
        return f"{name!r} is not a normalized relative path"
    return None


def check_member_name(name: object, where: str | os.PathLike[str]) -> str:
    """``name``, once it is a plain relative path inside ``where``'s directory.

    Raises:
        UnsafeMemberError: naming ``where`` and the name.
    """
    problem = member_name_problem(name)
    if problem is not None:
        raise UnsafeMemberError(f"{where}: names {problem}, which would leave its directory")
    assert isinstance(name, str)
    return name


def resolve_member(root: Path, name: str) -> Path | None:
    """The regular file ``name`` reaches inside the local directory ``root``, or None where nothing
    is there.

    Raises:
        UnsafeMemberError: ``name`` is unsafe, its real path (symlinks followed) leaves ``root``,
            or it is not a regular file (a directory, FIFO, socket or device).
    """
    path = root / check_member_name(name, root)
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if os.path.commonpath([real_root, real]) != real_root:
        raise UnsafeMemberError(f"{path}: a symlink to {real}, outside the directory {root}")
    if not stat.S_ISREG(mode):
        raise UnsafeMemberError(f"{path}: not a regular file (a directory, FIFO, socket or device)")
    return path
