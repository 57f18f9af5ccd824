"""The warm python (tests/warm_python.py) leaves nothing running: a job that ends, or is given up
on, takes what it started with it, and a test that gives up on a child never hangs the suite."""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from pathlib import Path

import pytest
from conftest import child_env, python_program, run_in_session

pytestmark = pytest.mark.slow

SLEEPER = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)"

LEAVES_A_SLEEPER = """
import os, subprocess, sys, time
python, pid_file = sys.argv[1:3]
subprocess.Popen([python, "-c", {sleeper!r}, pid_file])
while not os.path.exists(pid_file):  # the sleeper has started
    time.sleep(0.05)
{after}
"""


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def warm_program() -> str:
    program = python_program()
    if "FIELD_WARM_PYTHON" not in os.environ:
        pytest.skip("the warm python's server is not running in this pytest process")
    return program


def test_a_warm_job_that_ends_takes_the_processes_it_left_behind(warm_program: str, tmp_path: Path) -> None:
    pid_file = tmp_path / "sleeper.pid"
    # It ends at once, its sleeper (a warm job of its own, in a session of its own) left running.
    code = LEAVES_A_SLEEPER.format(sleeper=SLEEPER, after="")
    result = run_in_session([warm_program, "-c", code, warm_program, str(pid_file)], timeout=60, env=child_env())
    assert result.returncode == 0, result.stdout
    assert _gone(int(pid_file.read_text()), within_s=10), "the job's sleeper outlived it"


def test_a_timed_out_warm_job_with_ranks_in_sessions_of_their_own_fails_the_test_without_hanging(
    warm_program: str, tmp_path: Path
) -> None:
    """The hang seen once in a full run: a DDP job whose rank 1 (a warm job in a session of its own,
    started through the warm python) deadlocked; the timeout killed rank 0, and rank 1 kept the output
    pipe open, so the suite waited on it forever."""
    pid_file = tmp_path / "sleeper.pid"
    code = LEAVES_A_SLEEPER.format(sleeper=SLEEPER, after="time.sleep(600)")
    started = time.monotonic()
    with pytest.raises(AssertionError, match="timed out after 5s"):
        run_in_session([warm_program, "-c", code, warm_program, str(pid_file)], timeout=5, env=child_env())
    assert time.monotonic() - started < 60
    assert _gone(int(pid_file.read_text()), within_s=10), "the job's rank outlived the test that gave up on it"


def test_a_client_gone_before_its_job_started_leaves_the_server_serving_warm_jobs(warm_program: str) -> None:
    """Seen in a full run: a client killed between connecting and learning its job's pid (a test's timeout,
    a kill of its group) made the server's reply raise BrokenPipeError, which ended the server. Every
    later job of that pytest worker then started cold (the suite ran ~40 % longer), and the test above,
    whose jobs must be warm, hung on a cold job's sleeper."""
    request = json.dumps({"argv": ["-c", "import time; time.sleep(30)"], "env": child_env(), "cwd": os.getcwd(),
                          "streams": [1, 2], "pid": os.getpid(), "unbuffered": False}).encode()  # fmt: skip
    with open(os.devnull, "wb") as null:
        for _ in range(3):
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.connect(os.environ["FIELD_WARM_SOCKET"])
            socket.send_fds(client, [struct.pack("!Q", len(request))], [null.fileno(), null.fileno()])
            client.sendall(request)
            client.close()  # gone before the server replies with its job's pid
    probe = "import sys; print('warm' if 'lightning.pytorch' in sys.modules else 'cold')"
    result = run_in_session([warm_program, "-c", probe], timeout=60, env=child_env())
    assert result.stdout.strip() == "warm", f"the job started cold: the server is gone\n{result.stdout}"
