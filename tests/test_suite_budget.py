"""The suite's own budget (tests/suite_budget.py): the edit loop stays in-process, and no test runs
over its time limit unnoticed. Each rule is run on a small suite of its own, through pytester."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

TESTS_DIR = Path(__file__).parent


def _suite(pytester: pytest.Pytester, body: str) -> None:
    pytester.makeconftest(f"import sys\nsys.path.insert(0, {str(TESTS_DIR)!r})\npytest_plugins = ['suite_budget']\n")
    pytester.makeini("[pytest]\nmarkers =\n    slow: starts processes\n")
    pytester.makepyfile(test_user=body)


@pytest.mark.slow
def test_an_unmarked_test_that_starts_python_fails_naming_it_and_the_same_test_marked_slow_passes(
    pytester: pytest.Pytester,
) -> None:
    _suite(pytester, """
import subprocess, sys
import pytest

def test_unmarked():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

@pytest.mark.slow
def test_marked():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

def test_git_is_not_an_interpreter():
    subprocess.run(["git", "--version"], check=True, capture_output=True)
""")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(["*test_unmarked started 1 process(es) but is not marked slow*"])
    assert "test_marked started" not in result.stdout.str()


def test_a_test_over_the_limit_fails_with_its_time_and_the_limit(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FIELD_TEST_LIMIT_S", "0.2")
    _suite(pytester, """
import time

def test_long():
    time.sleep(0.4)

def test_short():
    pass
""")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*test_long took 0.? s (setup, call and teardown), over the 0.2 s limit per test*"])


@pytest.mark.slow
def test_under_loadgroup_every_test_of_a_file_runs_on_one_worker(pytester: pytest.Pytester) -> None:
    # .ci/run's --dist loadgroup with the groups tests/conftest.py sets: a file's module fixtures run
    # once. pytest 9.2 with pytest-xdist 3.8 silently dealt the tests out one by one (xdist#1386).
    pytester.makeconftest("""
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.xdist_group(item.path.name))
""")
    pytester.makepyfile(test_one="\n".join(f"def test_{i}(): pass" for i in range(6)))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", "-v")
    workers = {line.split()[0] for line in result.stdout.lines if "PASSED" in line}
    assert len(workers) == 1, result.stdout.str()
