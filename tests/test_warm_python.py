"""The warm python (tests/warm_python.py) leaves nothing running: a job that ends, or is given up
on, takes what it started with it, and a test that gives up on a child never hangs the suite."""

from __future__ import annotations

import os
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
