"""Protocol attempts forked from a warm interpreter: exact-resume checks at unit-test speed.

A fresh interpreter per attempt (what ``field-evidence`` does) spends ~4 s of a 2-core machine on
importing torch and Lightning, four times per check. Here every attempt is forked from a
``multiprocessing`` fork server that imported them once per test session. The fork server never
trains: a child forked from a process that has run torch's OpenMP pool would hang in its first
parallel op, which is also why the test process itself is not forked.

Each attempt is still a process of its own, in a session of its own, so a fault drill's SIGKILL of
its process group takes that attempt's ranks and DataLoader workers and nothing else. The resume is
a real restart from disk (verification, load, data fast-forward), without the interpreter start-up.
For two ranks, the attempt forks its second rank before any torch work and both join a gloo group
through Lightning's environment variables, as ``torchrun`` would start them.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_field.core.distributed import end_process_groups
from lightning_field.evidence import worker
from lightning_field.evidence.protocol import Attempt, note_timeout, prepare_attempt
from lightning_field.evidence.worker import RunSpec

PRELOAD = ["lightning.pytorch", "torchmetrics", "lightning_field.evidence.worker"]
"""What the fork server imports once: everything an attempt needs before the user's own modules."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class _Forked:
    spec: RunSpec
    process: Any  # multiprocessing.Process
    log_path: Path


class ForkedLauncher:
    """A :class:`~lightning_field.evidence.protocol.Launcher` that forks each attempt from a fork
    server (started on first use, shared by every check in the process).

    Args:
        devices: ranks per attempt; above 1 each attempt is a gloo DDP job on loopback.

    Raises:
        ValueError: ``devices`` is below 1.
    """

    def __init__(self, devices: int = 1) -> None:
        if devices < 1:
            raise ValueError(f"devices must be >= 1, got {devices}")
        self.devices = devices
        self._context = multiprocessing.get_context("forkserver")
        # The server is started once per process; a preload list given after that is ignored.
        self._context.set_forkserver_preload(PRELOAD)

    def spawn(self, spec: RunSpec, cwd: Path) -> _Forked:
        spec_path, log_path = prepare_attempt(spec)
        port = free_port() if self.devices > 1 else 0
        process = self._context.Process(
            target=run_attempt,
            args=(str(spec_path), str(log_path), str(cwd), self.devices, port),
            name=f"lightning-field-{spec.name}-{spec.attempt}",
        )
        process.start()
        return _Forked(spec, process, log_path)

    def wait(self, handle: _Forked, timeout_s: float) -> Attempt:
        process = handle.process
        process.join(timeout_s)
        if process.exitcode is None:
            _kill_group(process.pid)
            process.join()
            note_timeout(handle.log_path, timeout_s)
        _kill_group(process.pid)  # a rank or loader worker left behind
        assert handle.spec.launched_unix is not None
        return Attempt(
            handle.spec.attempt, int(process.exitcode), handle.spec.launched_unix, time.time(), handle.log_path
        )


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def run_attempt(spec_path: str, log_path: str, cwd: str, devices: int, port: int) -> None:
    """The forked attempt: its own session and log, then ``worker.run``; rank 0 also reaps the others."""
    os.setsid()  # the drill kills this process group: this attempt's ranks and workers only
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.chdir(cwd)
    # A forkserver child inherits "forkserver" as its start method; a user's script has the
    # platform default, which is what its DataLoader workers (and their start-up cost) must see.
    multiprocessing.set_start_method(None, force=True)
    rank, peers = 0, list[int]()  # the forked peers' process ids
    if devices > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(devices), NODE_RANK="0")
        for other in range(1, devices):
            pid = os.fork()  # before any torch work in this process: safe to fork
            if pid == 0:
                rank, peers = other, []
                break
            peers.append(pid)
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank))
    code = 1
    try:
        code = worker.run(RunSpec.read(spec_path))
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            end_process_groups()
    for pid in peers:
        _, status = os.waitpid(pid, 0)
        peer_code = os.waitstatus_to_exitcode(status)
        if peer_code != 0 and code == 0:
            code = peer_code if peer_code > 0 else 128 - peer_code
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)  # see core.distributed.exit_finished_process: no C++ teardown races at exit
