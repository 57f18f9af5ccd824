"""A warm ``python`` for the suite's child jobs: a program that behaves as the interpreter does for
``python [-u] script.py ...``, ``python [-u] -m module ...`` and ``python [-u] -c code ...``, but is forked from a
server that has imported torch, Lightning and lightning_field once (docs/testing.md).

A fresh interpreter spends ~4 s of a 2-core machine importing them, and the suite starts hundreds:
the jobs it runs, and the ranks Lightning's DDP launcher starts from them (it runs ``sys.executable``,
which is this program inside a warm job). What stays as a fresh start is all that the test is about:

- each job is a process of its own, in a session of its own, with the command line, environment,
  working directory and standard streams it was started with, and ``__main__`` run as Python runs it;
- its exit status, a death by signal included, is this program's own; the signals a test or a
  launcher sends it (SIGTERM, SIGINT, SIGUSR1, ...) reach the job; and a SIGKILL of this program or
  its process group kills the job and everything the job started;
- the server never trains: a child forked from a process that has run torch's OpenMP pool would
  hang in its first parallel op.

What differs: the job's pid is not this program's pid (the job finds the one its launcher knows in
``FIELD_WARM_LAUNCHED_PID``), and modules the server imported are already in ``sys.modules``. Tests
about either, about console scripts or about a fresh install start a real interpreter
(``sys.executable``), as do options other than ``-u``, ``-m`` and ``-c``, and a missing server.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import stat
import struct
import sys
import threading
from pathlib import Path
from typing import Any

PRELOAD = ("torch", "lightning.pytorch", "torchmetrics", "lightning_field.checkpoint.manifest_checkpoint",
           "lightning_field.evidence.worker", "hydra", "omegaconf", "s3fs", "datasets")  # fmt: skip
"""What the server imports once: what nearly every job imports first (Lightning's ``ModelCheckpoint``
imports s3fs, where it is installed, in its ``setup``: 0.5 s a job), and ``datasets`` (0.8 s), which
the streamed-data jobs import."""

SOCKET_ENV = "FIELD_WARM_SOCKET"
LAUNCHED_PID_ENV = "FIELD_WARM_LAUNCHED_PID"

CLIENT = '''#!{python} -SI
# The warm python of tests/warm_python.py: hands its command line, environment, working directory
# and standard streams to the server, relays signals, and ends as the job ended.
import json, os, signal, socket, struct, sys
REAL = {python!r}
argv = sys.argv[1:]
unbuffered = argv[:1] == ["-u"]  # what torchrun's agent starts its workers with
argv = argv[1:] if unbuffered else argv
path = os.environ.get("{env}")
if not path or not argv or (argv[0].startswith("-") and argv[0] not in ("-m", "-c")):
    os.environ.pop("{pid_env}", None)  # a real interpreter is the process its launcher knows
    os.execv(REAL, [REAL, *(["-u"] if unbuffered else []), *argv])
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    server.connect(path)
except OSError:
    os.environ.pop("{pid_env}", None)
    os.execv(REAL, [REAL, *(["-u"] if unbuffered else []), *argv])
streams = []
for fd in (0, 1, 2):
    try:
        os.fstat(fd)
        streams.append(fd)
    except OSError:
        pass
request = json.dumps({{"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "streams": streams,
                      "pid": os.getpid(), "unbuffered": unbuffered}}).encode()
try:
    socket.send_fds(server, [struct.pack("!Q", len(request))], streams)
    server.sendall(request)
    replies = server.makefile("rb")
    line = replies.readline()  # the job's pid, sent by the job itself as it starts
except OSError:  # the server went away with this request unanswered
    line = b""
if not line.strip():  # no job was started: run it cold, as without a server
    os.environ.pop("{pid_env}", None)
    os.execv(REAL, [REAL, *(["-u"] if unbuffered else []), *argv])
pid = int(line)
def relay(signum, frame):
    try:  # SIGABRT asks for stacks: like a group's, the job's ranks and workers get it too
        (os.killpg if signum == signal.SIGABRT else os.kill)(pid, signum)
    except ProcessLookupError:
        pass
for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
               signal.SIGABRT):
    signal.signal(signum, relay)
try:
    line = replies.readline()
except OSError:  # the server went away while the job ran: its status is unknown
    line = b""
code = int(line) if line.strip() else 1
if code < 0:  # died of a signal: so does this program
    if -code not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
os._exit(code & 0xFF)
'''


def write_client(directory: Path) -> Path:
    """The program to start in place of ``sys.executable`` (it needs ``FIELD_WARM_SOCKET`` set), and
    beside it the package's console scripts (``field``, ``field-train``, ...) run by it: with
    ``directory`` first on ``PATH``, a shell runs ``python`` and those scripts warm."""
    program = directory / "python"
    program.write_text(CLIENT.format(python=sys.executable, env=SOCKET_ENV, pid_env=LAUNCHED_PID_ENV))
    program.chmod(program.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    for script in Path(sys.executable).parent.glob("field*"):
        wrapper = directory / script.name
        wrapper.write_text(f'#!/bin/sh\nexec "{program}" "{script}" "$@"\n')
        wrapper.chmod(program.stat().st_mode)
    return program


def serve(socket_path: str, client: str) -> None:
    """Import ``PRELOAD``, then fork one job per connection until this process is killed."""
    for name in PRELOAD:
        importlib.import_module(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    jobs: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, connection)
    parent = os.getppid()
    print("ready", flush=True)
    while os.getppid() == parent:  # a pytest worker that died (SIGKILL, no unconfigure) takes it along
        for key, _ in selector.select(timeout=1.0):
            if key.fileobj is listener:
                try:
                    connection, _ = listener.accept()
                except OSError:
                    continue  # the client gave up while it waited to be accepted
                inherited = [listener.fileno(), selector.fileno(), *jobs, *(c.fileno() for _, c in jobs.values())]
                pid = _start(connection, client, inherited)
                if pid is None:
                    connection.close()
                    continue
                pidfd = os.pidfd_open(pid)
                jobs[pidfd] = (pid, connection)
                selector.register(pidfd, selectors.EVENT_READ)
            else:
                pidfd = key.fd
                pid, connection = jobs.pop(pidfd)
                selector.unregister(pidfd)
                os.close(pidfd)
                # The job is a zombie until reaped, so its group id cannot be reused yet: what it
                # started and left behind (a rank, a loader worker) ends with it, as its client does.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
                with contextlib.suppress(OSError):
                    connection.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                connection.close()


def _start(connection: socket.socket, client: str, inherited: list[int]) -> int | None:
    try:
        header, streams, _, _ = socket.recv_fds(connection, 8, 3)
        size = struct.unpack("!Q", header)[0]
        body = b""
        while len(body) < size:
            chunk = connection.recv(size - len(body))
            if not chunk:
                return None
            body += chunk
        request = json.loads(body)
    except (OSError, ValueError, struct.error):
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        for fd in streams:
            os.close(fd)
        # The job sends its pid itself (_run_job): the server replies nothing that a client killed since
        # it connected could make fail, and a client that reads no pid knows that no job started.
        return pid
    for fd in inherited:
        with contextlib.suppress(OSError):
            os.close(fd)
    os._exit(_run_job(request, streams, connection, client))


def _run_job(request: dict[str, Any], streams: list[int], connection: socket.socket, client: str) -> int:
    os.setsid()  # the job's ranks and loader workers: one group, killed together
    try:
        connection.sendall(f"{os.getpid()}\n".encode())
    except OSError:
        return 1  # its client is gone: so is the job, before it ran anything
    for target, fd in zip(request["streams"], streams, strict=True):
        os.dup2(fd, target)
        os.close(fd)
    for target in {0, 1, 2} - set(request["streams"]):
        os.close(target)
    if request.get("unbuffered"):
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(write_through=True)  # type: ignore[attr-defined]
    threading.Thread(target=_die_with_client, args=(connection,), daemon=True).start()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # The pid its launcher knows it by (torchrun's agent reports the worker it started by it).
    os.environ[LAUNCHED_PID_ENV] = str(request["pid"])
    if os.environ.get("PYTHONFAULTHANDLER"):
        faulthandler.enable(all_threads=True)  # what the interpreter does at start-up for this variable
    sys.executable = client  # what Lightning's DDP launcher and the product start for more ranks
    server_paths = set(sys.path)
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in server_paths]
    argv = request["argv"]
    code = 0
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0:1] = [os.getcwd(), *extra]
            runpy._run_module_as_main(argv[1])  # type: ignore[attr-defined]  # what `python -m` calls
        elif argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[0:1] = ["", *extra]
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        else:
            sys.argv = list(argv)
            sys.path[0:1] = [str(Path(argv[0]).resolve().parent), *extra]
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as stop:
        code = _exit_code(stop.code)
    except BaseException:
        sys.excepthook(*sys.exc_info())  # as the interpreter reports it: torch's DDP hook adds "[rankN]:"
        code = 1
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()  # type: ignore[attr-defined]  # what the interpreter runs at exit
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    return code


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _die_with_client(connection: socket.socket) -> None:
    """The client is gone (killed, or its group was): so are this job and what it started."""
    with contextlib.suppress(OSError):
        while connection.recv(1024):
            pass
    os.killpg(os.getpid(), signal.SIGKILL)


# ------------------------------------------------------------------------------------ the pytest plugin
_server = object()  # a config.stash key (pytest is not imported by the server)


def pytest_collection_finish(session: Any) -> None:
    """Start the server once per pytest process, outside every test, when a selected test may use it."""
    if not any(item.get_closest_marker("slow") for item in session.items) or SOCKET_ENV in os.environ:
        return
    import subprocess
    import tempfile

    directory = Path(tempfile.mkdtemp(prefix="field-warm-"))
    socket_path, client = str(directory / "server.sock"), write_client(directory)
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    server = subprocess.Popen([sys.executable, __file__, socket_path, str(client)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, start_new_session=True, text=True)  # fmt: skip
    assert server.stdout is not None
    if server.stdout.readline().strip() != "ready":
        server.kill()
        return  # the jobs start fresh interpreters, as they would without the server
    session.config.stash[_server] = server
    os.environ[SOCKET_ENV] = socket_path
    os.environ["FIELD_WARM_PYTHON"] = str(client)


def pytest_unconfigure(config: Any) -> None:
    server = config.stash.get(_server, None)
    if server is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        os.environ.pop(SOCKET_ENV, None)
        os.environ.pop("FIELD_WARM_PYTHON", None)


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
