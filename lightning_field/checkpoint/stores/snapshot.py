"""The step snapshots' store: a :class:`~lightning_field.checkpoint.stores.local.LocalStore` made for
a checkpoint every few steps in node-local memory (``/dev/shm``).

Three things differ from a persistent checkpoint's store, each because a snapshot is taken so often
that its cost is counted against every step (``benchmarks/RESULTS.md`` §15):

* no fsync: a snapshot need only outlive the process, and the page cache does;
* files are written in the raw tensor format (:mod:`~lightning_field.checkpoint.tensor_file`), not
  pickled by ``torch.save`` (a file whose state it cannot carry falls back to ``torch.save``; the
  reader tells them apart by their first bytes);
* the oldest snapshot's files are reused by the next one: :meth:`SnapshotStore.recycle` un-publishes
  it (a rename into a hidden spare directory, so no reader sees it half-overwritten) and the next
  save moves each of its files into its own hidden directory and overwrites it in place. On tmpfs a
  new file faults in fresh pages as it is written (about twice the cost of the copy itself); an old
  one's pages are already there. It also bounds the memory snapshots take to two copies of the state:
  while a snapshot is written, the one before it is the only complete one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any

from lightning_field.checkpoint.stores.base import RankOutcome, save_durably, write_rank_files
from lightning_field.checkpoint.stores.local import LocalStore, publish
from lightning_field.core.fsio import remove_dir_unseen
from lightning_field.core.manifest import Manifest

__all__ = ["SPARE_DIR", "SnapshotStore"]

SPARE_DIR = ".tmp-spare"
"""The retired snapshot, hidden (a ``.tmp-`` name: never listed, removed at set-up), until the next
snapshot's files take its place."""


class SnapshotStore(LocalStore):
    """Node-local snapshots: no fsync, raw tensor files, the retired snapshot's files reused."""

    def __init__(self) -> None:
        super().__init__(durable=False)

    def recycle(self, retired: Path) -> None:
        """Un-publish ``retired`` so the next snapshot's files overwrite its pages; a spare left by an
        earlier recycle (a snapshot that failed before taking it) is removed first."""
        spare = retired.parent / SPARE_DIR
        shutil.rmtree(spare, ignore_errors=True)
        try:
            os.rename(retired, spare)
        except OSError:
            remove_dir_unseen(retired, durable=False)

    def publish(self, final: Path, token: str, manifest: Manifest) -> None:
        # Compact JSON: the indented form a person reads takes json's pure-Python encoder (~1 ms a step).
        publish(self.hidden_dir(final, token), final, manifest, durable=False, compact=True)

    def write(self, final: Path, token: str, rank: int, files: dict[str, tuple[Any, list[str]]]) -> RankOutcome:
        spare = final.parent / SPARE_DIR
        return write_rank_files(
            self.hidden_dir(final, token),
            rank,
            files,
            durable=False,
            save=lambda obj, path, durable: _save_raw(obj, path, spare / path.name),
        )


def _save_raw(obj: Any, path: Path, recycled: Path) -> tuple[int, str]:
    # Imported here: reading checkpoints (``field ckpt``) goes through the stores and must not pay for torch.
    from lightning_field.checkpoint.tensor_file import write_tensor_file

    reuse = False
    with contextlib.suppress(OSError):  # no spare file of this name (the first snapshots, another rank count)
        os.rename(recycled, path)
        reuse = True
    written = write_tensor_file(obj, path, durable=False, reuse=reuse)
    if written is not None:
        return written
    if reuse:
        path.unlink()
    return save_durably(obj, path, durable=False)  # a state the raw format does not carry
