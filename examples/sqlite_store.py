"""A checkpoint store of your own in 30 lines: checkpoints as rows of one SQLite table.

``KeyValueStore`` turns four methods into the whole store protocol (the commit, listing,
verification, the load, retention), and this store passes the same conformance tests as the ones
that ship (tests/test_stores.py). Use it as
``ManifestCheckpoint(dirpath="runs/a", storage=StorageConfig(store=SqliteStore("ckpt.db")))``.
"""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any

from lightning_field.checkpoint.stores.key_value import KeyValueStore


class SqliteStore(KeyValueStore):
    """Each file of a checkpoint is one row; a row's write is one transaction, so it is atomic."""

    def __init__(self, database: str) -> None:
        self.database = database
        self._run("CREATE TABLE IF NOT EXISTS objects (key TEXT PRIMARY KEY, value BLOB NOT NULL)")

    def _run(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        # A connection per call, closed after it: ranks and the writer thread share none.
        with contextlib.closing(sqlite3.connect(self.database, timeout=60)) as db, db:
            return db.execute(sql, args).fetchall()

    def get(self, key: str) -> bytes | None:
        rows = self._run("SELECT value FROM objects WHERE key = ?", key)
        return bytes(rows[0][0]) if rows else None

    def set(self, key: str, value: bytes) -> None:
        self._run("INSERT OR REPLACE INTO objects VALUES (?, ?)", key, value)

    def keys(self, prefix: str) -> list[str]:
        return [key for (key,) in self._run("SELECT key FROM objects WHERE substr(key, 1, ?) = ?", len(prefix), prefix)]

    def delete(self, key: str) -> None:
        self._run("DELETE FROM objects WHERE key = ?", key)
