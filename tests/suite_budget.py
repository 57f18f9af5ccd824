"""The suite's budget, enforced as it runs (docs/testing.md).

- A test that starts a Python process (``python``, a console script, a ``spawn`` or ``forkserver``
  process; in the test or in a fixture it uses) is marked ``slow``, as is one that trains in-process
  for more than about a second: ``pytest -m "not slow"`` is the edit loop. The process rule does not
  depend on the machine's load: an unmarked test that starts one fails, whatever its time.
- No test takes more than ``FIELD_TEST_LIMIT_S`` (60 s) over its setup, call and teardown: the whole
  suite has 7 minutes on 2 cores, and a test over a minute is one to split or to share runs with.
"""

from __future__ import annotations

import multiprocessing
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import pytest

_started = pytest.StashKey[list[str]]()
_seconds = pytest.StashKey[float]()


def starts_an_interpreter(program: str) -> bool:
    """Python itself, or a console script beside it (field, field-train, torchrun, ...): seconds of
    imports each. Tools such as ``git`` (the code manifest) start in milliseconds and do not count."""
    name = Path(program).name
    return name.startswith("python") or Path(program).parent == Path(sys.executable).parent or (
        "/" not in program and shutil.which(program, path=str(Path(sys.executable).parent)) is not None
    )


class ProcessWatch:
    """Notes each child started while a test's setup, call or teardown runs, on that test."""

    def __init__(self) -> None:
        self.item: pytest.Item | None = None

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        popen_init, process_start, watch = subprocess.Popen.__init__, BaseProcess.start, self

        def popen(process: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
            argv = shlex.split(args) if isinstance(args, str) else [str(a) for a in args]
            if argv and starts_an_interpreter(argv[0]):
                watch.note(f"subprocess {' '.join(argv)}")
            popen_init(process, args, *rest, **kwargs)

        def start(process: BaseProcess) -> None:
            method = getattr(process, "_start_method", None) or multiprocessing.get_start_method(allow_none=True)
            if method in ("spawn", "forkserver"):  # a fork (DataLoader workers) copies this warm process
                watch.note(f"multiprocessing ({method}) {process.name}")
            process_start(process)

        monkeypatch.setattr(subprocess.Popen, "__init__", popen)
        monkeypatch.setattr(BaseProcess, "start", start)

    def note(self, what: str) -> None:
        if self.item is not None:
            self.item.stash.setdefault(_started, []).append(what[:160])

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        self.item = item
        yield
        self.item = None


def pytest_configure(config: pytest.Config) -> None:
    watch = ProcessWatch()
    patch = pytest.MonkeyPatch()
    watch.install(patch)
    config.add_cleanup(patch.undo)
    config.pluginmanager.register(watch, "field-process-watch")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    seconds = item.stash.get(_seconds, 0.0) + report.duration
    item.stash[_seconds] = seconds
    if report.when != "teardown" or report.failed:
        return
    problems = []
    started = item.stash.get(_started, [])
    if started and item.get_closest_marker("slow") is None:
        problems.append(
            f"{item.nodeid} started {len(started)} process(es) but is not marked slow (first: {started[0]}):"
            " mark it @pytest.mark.slow, or its file with pytestmark, so that -m 'not slow' stays in-process"
        )
    limit_s = float(os.environ.get("FIELD_TEST_LIMIT_S", "60"))
    if seconds > limit_s:
        problems.append(
            f"{item.nodeid} took {seconds:.1f} s (setup, call and teardown), over the {limit_s:g} s limit per"
            " test (FIELD_TEST_LIMIT_S; docs/testing.md): split it, or share its runs through a fixture"
        )
    if problems:
        report.outcome = "failed"
        report.longrepr = "\n".join(problems)
