"""A restore drill once the live run has recorded its step: its process, and what its result means.

The drill process (``drill_replay.py``) is started in a session of its own, so that stopping it
stops whatever it started. It leaves a result (passed, mismatch, or an error); this turns it into
the drill's record, decides what the result says about the checkpoint (an error of a drill whose
checkpoint retention removed before it could load it says nothing: *skipped*), logs it, and records
it beside the checkpoint's manifest. Kept apart from the callback (``drill.py``), which decides when to drill.
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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_field.core.manifest import ManifestError, read_manifest, write_drill_record

__all__ = [
    "ERROR",
    "MISMATCH",
    "PASSED",
    "SKIPPED",
    "STORAGE_OPTIONS_ENV",
    "RunningDrill",
    "drill_record",
    "mark_checkpoint",
    "release",
    "same_checkpoint",
    "start_drill",
    "stop_drill",
]

log = logging.getLogger("lightning_field.evidence.drill")  # the callback's logger: users filter one name

PASSED, MISMATCH, ERROR, SKIPPED = "passed", "mismatch", "error", "skipped"

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


def mark_checkpoint(checkpoint: str, record: dict[str, Any], storage_options: Mapping[str, Any] | None = None) -> None:
    """Record the drill beside the checkpoint's manifest, where the checkpoint is (a local folder or a
    URL); :func:`~lightning_field.core.manifest.read_manifest` reads it back as ``restore_tested`` and
    ``restore_drill``."""
    write_drill_record(checkpoint, record, record["outcome"] == PASSED, storage_options)


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
    elif not current:
        log.info(
            "Restore drill for %s (step %d) ran on its private copy; the checkpoint itself has since been removed"
            " by retention or replaced, so no manifest is marked",
            running.checkpoint,
            running.step,
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
