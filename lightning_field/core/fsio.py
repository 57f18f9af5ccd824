"""Durable file primitives: every byte a checkpoint relies on goes through here.

A checkpoint is only as trustworthy as the order in which its bytes reach the disk. These helpers
make that order explicit: data is fsynced before the rename that publishes it, and the parent
directory is fsynced after, so a power cut or SIGKILL can never expose a half-written file under a
committed name.
"""

from __future__ import annotations

import ctypes
import errno
import io
import os
import shutil
import sys
from concurrent.futures import wait
from pathlib import Path
from typing import Any, BinaryIO

from lightning_field.core.hashing import new_hasher, write_hash_threads
from lightning_field.core.workers import HASHING

_THREADED_HASH_MIN = 1 << 20
# Writes below this size are gathered (up to _COALESCE_BYTES) before they are hashed and written.
_COALESCED_MAX = 64 << 10
_COALESCE_BYTES = 1 << 20
"""Buffers at least this big are hashed on a helper thread while being written; smaller ones inline."""

_WRITEBACK_CHUNK = 32 << 20
"""Large buffers are written in pieces of this size, each followed by a writeback request."""

_SYNC_FILE_RANGE_WRITE = 2


def _load_sync_file_range() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _load_sync_file_range()


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Persist a directory entry (a rename or a new file) itself, not just the file's data."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class HashingWriter(io.RawIOBase):
    """A write-only file that hashes and counts bytes as they pass, so no second read pass is needed.

    ``torch.save`` streams each tensor storage straight into ``write``; hashing that same buffer
    keeps the checkpoint's content hash exact without holding the serialised state in memory.

    Three things overlap so a save costs about as long as its slowest part, not the sum of them:

    * a large buffer is hashed on a helper thread while this thread writes it (both release the
      GIL), and ``write`` returns only when both are done, so the caller may reuse the buffer;
    * the kernel is asked to start writing each written chunk back to disk straight away (Linux
      ``sync_file_range``), so ``finish``'s fsync waits for the tail instead of the whole file;
    * hashing stays strictly in write order: one hasher, fed by one call at a time; where at least
      four cores are ours, that hasher spreads each large buffer over BLAKE3's threads
      (``hashing.write_hash_threads``), so the hash keeps up with disks faster than one core hashes.

    Small writes (torch's zip records: a header and padding per tensor) are gathered into one hash
    update and one system call per MiB: about a tenth of a 10 MB snapshot's write time.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.path = Path(path)
        self._file: BinaryIO = open(self.path, "xb", buffering=0)  # noqa: SIM115 - closed in close()
        self._hasher = new_hasher(threads=write_hash_threads())
        self._writeback = _sync_file_range is not None
        self._kicked = 0
        self._small = bytearray()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n = len(view)
        if n < _COALESCED_MAX:
            # torch.save's zip writer sends a header and a few bytes of padding per record, hundreds
            # per checkpoint: gathered here, they cost one hash update and one system call per MiB.
            self._small += view
            if len(self._small) >= _COALESCE_BYTES:
                self._flush_small()
            return n
        self._flush_small()
        if n < _THREADED_HASH_MIN:
            self._hasher.update(view)
            self._write_all(view)
        else:
            hashed = HASHING.submit(self._hasher.update, view)  # a parked thread: see core/workers.py
            try:
                self._write_all(view)
            finally:
                wait([hashed])  # the caller's buffer must outlive the hash, even when the write failed
            hashed.result()
        return n

    def _flush_small(self) -> None:
        if self._small:
            self._hasher.update(self._small)
            self._write_all(memoryview(self._small))
            self._small = bytearray()

    def _write_all(self, view: memoryview) -> None:
        written = 0
        while written < len(view):
            chunk = view[written : written + _WRITEBACK_CHUNK]
            done = 0
            while done < len(chunk):
                done += self._file.write(chunk[done:])
            written += done
            self.size += done
            if self.size - self._kicked >= _WRITEBACK_CHUNK:
                self._start_writeback()

    def _start_writeback(self) -> None:
        """Ask the kernel to begin writing ``[_kicked, size)`` to disk now; durability is still fsync's job."""
        if not self._writeback or _sync_file_range is None:
            return
        rc = _sync_file_range(self._file.fileno(), self._kicked, self.size - self._kicked, _SYNC_FILE_RANGE_WRITE)
        if rc != 0:
            self._writeback = False  # unsupported here (e.g. some network filesystems): fsync does it all
        self._kicked = self.size

    def finish(self, sync: bool = True) -> tuple[int, str]:
        """fsync (unless ``sync=False``) and close; return (size, hex digest)."""
        self._flush_small()
        self._file.flush()
        if sync:
            os.fsync(self._file.fileno())
        self.close()
        return self.size, self._hasher.hexdigest()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
        super().close()


def write_bytes_durably(path: str | os.PathLike[str], data: bytes, durable: bool = True) -> tuple[int, str]:
    """Write a new file, fsync it (unless ``durable=False``), and return (size, hash)."""
    writer = HashingWriter(path)
    try:
        writer.write(data)
        return writer.finish(sync=durable)
    except BaseException:
        writer.close()
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` so readers see the old or the new content, never a mix;
    ``durable=False`` skips the fsyncs, where the file need only outlive the process, not the machine."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    if tmp.exists():
        tmp.unlink()
    write_bytes_durably(tmp, data, durable)
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


_RENAME_EXCHANGE = 2


def exchange_or_replace_dir(src: Path, dst: Path) -> Path | None:
    """Publish directory ``src`` under ``dst``.

    If ``dst`` exists it is swapped out atomically (Linux ``renameat2(RENAME_EXCHANGE)``) and the
    old directory is returned at ``src``'s path for the caller to delete; otherwise a plain atomic
    rename is done. Where the exchange is unsupported the old directory is first moved aside, which
    leaves a short window in which ``dst`` does not exist but is never half-written.
    """
    if not dst.exists():
        os.rename(src, dst)
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None:
        at_fdcwd = -100
        rc = renameat2(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), _RENAME_EXCHANGE)
        if rc == 0:
            return src
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise OSError(err, os.strerror(err), str(dst))
    aside = dst.with_name(f".trash-{dst.name}-{os.getpid()}")
    os.rename(dst, aside)
    os.rename(src, dst)
    return aside


def remove_tree(path: Path) -> None:
    """Delete a directory tree, or a symbolic link (``save_last="link"``'s) without touching what it names:
    ``shutil.rmtree`` refuses a link, and with ``ignore_errors`` it would leave the link behind silently."""
    if path.is_symlink():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def remove_dir_unseen(path: Path, durable: bool = True) -> None:
    """Delete a directory (or a link to one) so that no reader ever sees it half-deleted: hide it by
    rename first.

    The hidden name starts with ``.trash-``, which checkpoint resolvers skip, like the directory
    :func:`exchange_or_replace_dir` moves aside.
    """
    if not path.exists() and not path.is_symlink():
        return
    hidden = path.with_name(f".trash-{path.name}-{os.getpid()}")
    os.rename(path, hidden)
    if durable:
        fsync_dir(path.parent)
    remove_tree(hidden)
