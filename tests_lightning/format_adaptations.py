"""Test-time-only adaptations of *format*, kept apart so that results can be counted with and without them.

A ``ManifestCheckpoint`` checkpoint is a folder (``state.pt``, rank files, ``manifest.json``) named
without an extension, and ``dirpath`` also holds the ``LAST`` pointer and the ``SNAPSHOT_LINEAGE``
token; the run writes its event log to ``<default_root_dir>/field/events.jsonl``. Lightning's tests
assert on file names, directory listings and ``torch.load(path)`` of a ``.ckpt`` file. Each adaptation
below changes only how the *test code* sees that format, never what ``ManifestCheckpoint`` decides
(which steps it saves, which it keeps, what ``best_model_path``/``last_model_path`` name, what a
checkpoint holds): a test that still fails with all of them on fails for a behaviour.

The listing and loading wrappers act only on calls made from Lightning's test code (a caller whose
module is ``tests_pytorch.checkpointing.*`` or ``tests_pytorch.helpers.*``), except the
``load_from_checkpoint`` one (Lightning's own loader), which acts only on a committed checkpoint
folder, where plain Lightning raises ``IsADirectoryError``.
Installed with ``--tl-format-adapt``; without ``--tl-swap`` they must change no result (the runner's
``control+adapt`` run checks that).
"""

from __future__ import annotations

import os
import pathlib
import posixpath
import sys
from typing import Any

MANIFEST = "manifest.json"
STATE_FILE = "state.pt"
BOOKKEEPING_FILES = ("LAST", "SNAPSHOT_LINEAGE")
EVENT_LOG_DIR, EVENT_LOG_FILE = "field", "events.jsonl"

ADAPTATIONS: dict[str, str] = {
    "hide-bookkeeping": (
        "os.listdir / Path.iterdir called by test code leave out the regular files LAST and SNAPSHOT_LINEAGE "
        "(the commit pointer and the snapshot run token ManifestCheckpoint keeps in dirpath, docs/checkpoints.md): "
        "the tests assert the exact set of entries in dirpath."
    ),
    "hide-checkpoint-folders": (
        "the same listings leave out a committed checkpoint folder '<name>' whose state.pt is the '<name>.ckpt' "
        "beside it (the file ModelCheckpoint would have written, and the path the callback advertises): the "
        "folder holds the manifest and every rank's state (docs/checkpoints.md), the tests list files."
    ),
    "hide-event-log": (
        "the same listings leave out a 'field' folder holding only events.jsonl (the run's event log, written to "
        "<default_root_dir>/field/): tests that use default_root_dir as dirpath assert the exact listing. "
        "(Arguably not format: plain Lightning writes nothing there; counted separately for that reason.)"
    ),
}


TEST_CODE = ("tests_pytorch.checkpointing.", "tests_pytorch.helpers.")
"""The modules whose calls are adapted: the upstream test files and their helpers (not its conftest)."""


def _caller_is_test(depth: int = 2) -> bool:
    """Whether the function that called our wrapper is Lightning's test code (:data:`TEST_CODE`)."""
    frame = sys._getframe(depth)
    return str(frame.f_globals.get("__name__", "")).startswith(TEST_CODE)


_isfile = posixpath.isfile
_isdir = posixpath.isdir
_listdir = os.listdir


def is_checkpoint_folder(path: Any) -> bool:
    try:
        path = os.fspath(path)
    except TypeError:
        return False
    return _isdir(path) and _isfile(os.path.join(path, MANIFEST))


def _hidden(directory: Any, name: str, enabled: set[str]) -> bool:
    full = os.path.join(os.fspath(directory), name)
    if "hide-bookkeeping" in enabled and name in BOOKKEEPING_FILES and _isfile(full):
        return True
    if "hide-checkpoint-folders" in enabled and is_checkpoint_folder(full):
        state = os.path.join(full, STATE_FILE)
        siblings = [os.path.join(os.fspath(directory), n) for n in _listdir(directory) if n.startswith(name + ".")]
        return any(_isfile(s) and os.path.samefile(s, state) for s in siblings if _isfile(state))
    if "hide-event-log" in enabled and name == EVENT_LOG_DIR and _isdir(full):
        return set(_listdir(full)) <= {EVENT_LOG_FILE}
    return False


def install(swapped: bool, enabled: tuple[str, ...] | None = None) -> list[str]:
    """Install the adaptations (all, or those named); returns the names installed."""
    chosen = set(ADAPTATIONS if enabled is None else enabled)
    unknown = chosen - set(ADAPTATIONS)
    if unknown:
        raise ValueError(f"unknown adaptations {sorted(unknown)}; known: {sorted(ADAPTATIONS)}")

    listing = chosen & {"hide-bookkeeping", "hide-checkpoint-folders", "hide-event-log"}
    if listing:

        def listdir(path: Any = ".") -> list[Any]:
            names = _listdir(path)
            if _caller_is_test() and not isinstance(path, int):
                names = [n for n in names if not (isinstance(n, str) and _hidden(path, n, listing))]
            return names

        original_iterdir = pathlib.Path.iterdir

        def iterdir(self: pathlib.Path) -> Any:
            entries = original_iterdir(self)
            if not _caller_is_test():
                return entries
            return iter([p for p in entries if not _hidden(self, p.name, listing)])

        os.listdir = listdir
        pathlib.Path.iterdir = iterdir  # type: ignore[method-assign]

    return sorted(chosen)
