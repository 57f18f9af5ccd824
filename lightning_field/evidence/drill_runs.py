"""A restore drill once the live run has recorded its step: its process, and what its result means.

The drill process (``drill_replay.py``) is started in a session of its own, so that stopping it
stops whatever it started. It leaves a result (passed, mismatch, or an error); this turns it into
the drill's record, decides what the result says about the checkpoint (an error of a drill whose
checkpoint retention removed before it could load it says nothing: *skipped*), logs it, and records
it beside the checkpoint's manifest. It keeps the checkpoints whose drills the release record needs:
where retention removed the newest drill-passed checkpoint, or one whose drill found a mismatch, it
puts the drill's private copy back in its place; and once a newer checkpoint passes, it removes the
older one kept for its drill. Kept apart from the callback (``drill.py``), which decides when to drill.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_field.core.manifest import ManifestError, read_manifest, write_drill_record
from lightning_field.core.storage import Location, as_location

if TYPE_CHECKING:
    from lightning_field.checkpoint.committed import CommittedCheckpoint

__all__ = [
    "ERROR",
    "MISMATCH",
    "PASSED",
    "SKIPPED",
    "STORAGE_OPTIONS_ENV",
    "RunningDrill",
    "drill_record",
    "mark_checkpoint",
    "record_beside_checkpoint",
    "release",
    "release_superseded",
    "same_checkpoint",
    "start_drill",
    "stop_drill",
]

log = logging.getLogger("lightning_field.evidence.drill")  # the callback's logger: users filter one name

PASSED, MISMATCH, ERROR, SKIPPED = "passed", "mismatch", "error", "skipped"

RestoreCopy = Callable[[Path, Location], bool]
"""A store's ``restore_linked_copy(copy, checkpoint)`` (``LocalStore``'s): renames a private copy back
into its checkpoint's place when nothing holds that name, and says whether it did."""

STORAGE_OPTIONS_ENV = "FIELD_DRILL_STORAGE_OPTIONS"
"""How the drill process gets the checkpoint callback's storage options (JSON): in its environment,
not in the spec file, because they can hold credentials."""


@dataclass
class RunningDrill:
    """A drill process in flight, and what its record will need."""

    process: subprocess.Popen[bytes]
    checkpoint: str
    step: int
    created_unix: float | None
    result_path: Path
    log_path: Path
    started: float
    protected: Path | None  # the private copy the drill loads; None: it loads the checkpoint itself
    storage_options: Mapping[str, Any]  # the checkpoint callback's, for a checkpoint under a URL


def start_drill(
    spec: dict[str, Any],
    work: Path,
    sys_path: list[str],
    protected: Path | None,
    storage_options: Mapping[str, Any] | None = None,
) -> RunningDrill:
    """Write ``spec`` into ``work`` and start the drill process on it, its output going to ``drill.log``.

    Raises:
        TypeError: ``storage_options`` cannot be written as JSON for the drill process.
    """
    spec_path = work / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=2, default=str))
    log_path = work / "drill.log"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(sys_path)
    env[STORAGE_OPTIONS_ENV] = json.dumps(dict(storage_options or {}))
    with open(log_path, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "lightning_field.evidence.drill_replay", str(spec_path)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    expected = spec["expected"]
    return RunningDrill(
        process,
        expected["checkpoint"],
        expected["step"],
        expected["created_unix"],
        work / "result.json",
        log_path,
        time.monotonic(),
        protected,
        dict(storage_options or {}),
    )


def exit_without_result(running: RunningDrill, lines: int = 3) -> str:
    """Why a drill process that wrote no result ended: its exit status and its log's last lines."""
    message = f"drill process exited {running.process.returncode} without a result"
    try:
        with open(running.log_path, "rb") as log:
            log.seek(max(log.seek(0, os.SEEK_END) - 4096, 0))
            tail = [line for line in log.read().decode(errors="replace").splitlines() if line.strip()][-lines:]
    except OSError as err:
        return f"{message} (its log {running.log_path} cannot be read: {err.strerror})"
    if not tail:
        return f"{message} (its log {running.log_path} is empty)"
    return f"{message}; its log {running.log_path} ends: " + " | ".join(line.strip()[:300] for line in tail)


def stop_drill(running: RunningDrill) -> None:
    """Kill the drill's process group, wait for it, and release its copy."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(running.process.pid, signal.SIGKILL)
    running.process.wait()
    release(running)


def release(running: RunningDrill) -> None:
    """Delete the drill's private copy of its checkpoint, once no process will load it."""
    if running.protected is not None:
        shutil.rmtree(running.protected, ignore_errors=True)


def same_checkpoint(running: RunningDrill) -> bool:
    """The directory still holds the very checkpoint the drill was for (names can be reused)."""
    try:
        manifest = read_manifest(running.checkpoint, running.storage_options)
    except ManifestError:
        return False
    return manifest.step == running.step and manifest.created_unix == running.created_unix


def mark_checkpoint(
    checkpoint: str | os.PathLike[str], record: dict[str, Any], storage_options: Mapping[str, Any] | None = None
) -> None:
    """Record the drill beside the checkpoint's manifest, where the checkpoint is (a local folder or a
    URL); :func:`~lightning_field.core.manifest.read_manifest` reads it back as ``restore_tested`` and
    ``restore_drill``."""
    write_drill_record(checkpoint, record, record["outcome"] == PASSED, storage_options)


def record_beside_checkpoint(
    running: RunningDrill, record: dict[str, Any], current: bool, checkpoint: CommittedCheckpoint | None
) -> bool:
    """Record the drill beside its checkpoint, when the checkpoint is still there (``current``); else,
    where ``checkpoint``'s retention removed it and the outcome is worth keeping (:func:`_restorer`),
    put the drill's private copy back as the checkpoint, with the record beside its manifest (written
    into the copy first, so the checkpoint reappears with its record, never without it). Call it
    before :func:`release`.

    Returns:
        Whether the checkpoint now carries the drill's record.
    """
    if current:
        mark_checkpoint(running.checkpoint, record, running.storage_options)
        return True
    restore_copy = _restorer(running, record, checkpoint)
    if restore_copy is not None and _put_back(running, record, restore_copy):
        return True
    if record["outcome"] != SKIPPED:
        log.info(
            "Restore drill for %s (step %d) is recorded in the event log only: retention removed the checkpoint,"
            " or a save of the same name replaced it, while the drill ran on its copy",
            running.checkpoint,
            running.step,
        )
    return False


def _restorer(
    running: RunningDrill, record: dict[str, Any], checkpoint: CommittedCheckpoint | None
) -> RestoreCopy | None:
    """How to put the drill's copy back, when its outcome is worth keeping: a mismatch always (the
    release record's evidence of the failure); a pass while no newer checkpoint has passed a drill
    (the record's evidence that the run's checkpoints restore: with ``save_top_k=1`` retention has
    usually removed a checkpoint before its drill ends). None where the store cannot (it lacks
    ``restore_linked_copy``)."""
    if checkpoint is None or running.protected is None or not checkpoint.checkpointer.is_own(running.checkpoint):
        return None
    if record["outcome"] == PASSED:
        drilled = (running.step, running.created_unix or 0.0)
        committed = [e.manifest for e in checkpoint.checkpointer.committed() if e.manifest is not None]
        if any(m.restore_tested and (m.step, m.created_unix) > drilled for m in committed):
            return None
    elif record["outcome"] != MISMATCH:
        return None
    restore: RestoreCopy | None = getattr(checkpoint.store_at(running.checkpoint), "restore_linked_copy", None)
    return restore


def release_superseded(checkpoint: CommittedCheckpoint | None) -> None:
    """After a pass on the newest drill-passed checkpoint: remove the older one retention kept for its
    drill (``Checkpointer.protection_reason``), unless ModelCheckpoint's own retention still keeps it."""
    if checkpoint is None or checkpoint.save_top_k == -1:  # -1 keeps all: nothing to list for
        return
    try:
        removed = checkpoint.checkpointer.remove_superseded_drilled(checkpoint.retains)
    except OSError as err:  # removed first by someone else
        log.warning("RestoreDrill could not remove a checkpoint kept for an older drill: %s", err)
        return
    for path in removed:
        log.info("Removed %s, kept for its restore drill until a newer checkpoint passed one", path)


def _put_back(running: RunningDrill, record: dict[str, Any], restore_copy: RestoreCopy) -> bool:
    copy = running.protected
    if copy is None or not copy.is_dir():
        return False
    try:
        manifest = read_manifest(copy)
    except ManifestError:
        return False
    if (manifest.step, manifest.created_unix) != (running.step, running.created_unix):
        return False  # not the commit the drill was for: never put anything else in its place
    try:
        mark_checkpoint(copy, record)
        restored = restore_copy(copy, as_location(running.checkpoint))
    except (OSError, ValueError) as err:
        log.warning(
            "Restore drill for %s (step %d): its copy could not be put back (%s)", running.checkpoint, running.step, err
        )
        return False
    if restored:
        log.info(
            "Restore drill for %s (step %d) %s on its private copy after retention removed the checkpoint: the copy"
            " is put back as the checkpoint, with the drill recorded beside it",
            running.checkpoint,
            running.step,
            record["outcome"],
        )
    return restored


def drill_record(running: RunningDrill, result: dict[str, Any], current: bool) -> dict[str, Any]:
    """The drill's record from its process's ``result``, logged at the level its outcome deserves.

    Args:
        running: the finished drill.
        result: what the drill process wrote (or the error standing in for it).
        current: the checkpoint directory still holds the checkpoint the drill was for.
    """
    outcome = result.get("outcome", ERROR)
    record = {
        "checkpoint": running.checkpoint,
        "step": running.step,
        "created_unix": running.created_unix,
        "outcome": outcome,
        "passed": outcome == PASSED,
        "checks": result.get("checks", {}),
        "error": result.get("error"),
        "seconds": time.monotonic() - running.started,
        "log": str(running.log_path),
        "finished_unix": time.time(),
        "protected_copy": running.protected is not None,
    }
    if outcome == ERROR and not current and running.protected is None:
        # Its error says nothing about the checkpoint: the drill had nothing to load.
        record["outcome"] = SKIPPED
        record["reason"] = "the checkpoint was removed by retention, or replaced, before its drill loaded it"
        log.warning(
            "Restore drill for %s (step %d) skipped: %s (%s); see %s",
            running.checkpoint,
            running.step,
            record["reason"],
            record["error"],
            running.log_path,
        )
    if record["outcome"] == PASSED:
        log.info("Restore drill passed for %s (step %d)", running.checkpoint, running.step)
    elif record["outcome"] == MISMATCH:
        failed = [name for name, check in record["checks"].items() if not check.get("passed")]
        log.error(
            "RESTORE DRILL FAILED for checkpoint %s (step %d): replaying the next step from it differs from the"
            " live run in %s. Resuming from it would not continue this run; see %s",
            running.checkpoint,
            running.step,
            ", ".join(failed),
            running.log_path,
        )
    elif record["outcome"] == ERROR:
        log.error(
            "Restore drill for checkpoint %s (step %d) could not run: %s; see %s",
            running.checkpoint,
            running.step,
            record["error"],
            running.log_path,
        )
    return record
