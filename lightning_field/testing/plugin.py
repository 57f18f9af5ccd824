"""The pytest plugin (entry point ``pytest11: lightning_field``): a fixture, a marker, an option.

* ``field_evidence``: a fixture that is :func:`~lightning_field.testing.assert_resumes_exactly`
  with the evidence bundle in the test's own ``tmp_path``.
* ``@pytest.mark.resume``: marks a test as an exact-resume check, so ``pytest -m resume`` runs just
  those (and ``-m "not resume"`` skips them). A test that uses the fixture is marked automatically.
* ``--field-keep[=DIR]``: copy the bundles of failing checks to ``DIR`` (default
  ``field-evidence-failures/``) and name them in the summary; they are otherwise left in pytest's
  temporary directories, which pytest prunes.

This module imports only pytest and the standard library: a suite that never asks for the fixture
imports neither torch nor Lightning because of it.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from lightning_field.testing.resume import assert_resumes_exactly

MARKER = "resume"
FIXTURE = "field_evidence"
DEFAULT_KEEP_DIR = "field-evidence-failures"

_BUNDLES = pytest.StashKey[list[Path]]()
_KEPT = pytest.StashKey[list[tuple[str, Path]]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("lightning_field", "exact-resume checks (lightning_field)")
    group.addoption(
        "--field-keep",
        nargs="?",
        const=DEFAULT_KEEP_DIR,
        default=None,
        metavar="DIR",
        help=f"copy the evidence bundles of failing resume checks to DIR (default {DEFAULT_KEEP_DIR}/)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}: an exact-resume check (lightning_field); select with -m {MARKER}")
    config.stash[_KEPT] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if FIXTURE in getattr(item, "fixturenames", ()) and item.get_closest_marker(MARKER) is None:
            item.add_marker(MARKER)


@pytest.fixture
def field_evidence(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``field_evidence(module, data, **options)``: ``assert_resumes_exactly`` with its bundle under
    this test's ``tmp_path``; returns the passing evidence, raises ``ResumeCheckFailed`` otherwise."""
    bundles: list[Path] = []
    request.node.stash[_BUNDLES] = bundles

    def check(module: Any, data: Any = None, **options: Any) -> Any:
        bundle = options.pop("bundle_dir", None) or tmp_path / f"resume-evidence-{len(bundles) + 1}"
        bundles.append(Path(bundle))
        return assert_resumes_exactly(module, data, bundle_dir=bundle, **options)

    yield check


# Old-style wrapper (not ``wrapper=True``): this plugin loads in every suite of an environment that
# has lightning_field installed, so it must work with pytest 7 as well as 8.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    keep = item.config.getoption("--field-keep")
    bundles = item.stash.get(_BUNDLES, [])
    if keep and report.when == "call" and report.failed and bundles:
        target_root = Path(keep)
        for bundle in bundles:
            if not bundle.is_dir():
                continue
            target = target_root / re.sub(r"[^\w.-]+", "_", item.nodeid) / bundle.name
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(bundle, target)
            item.config.stash[_KEPT].append((item.nodeid, target.resolve()))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    kept = config.stash.get(_KEPT, [])
    if kept:
        terminalreporter.section("lightning_field: kept evidence of failing resume checks")
        for nodeid, path in kept:
            terminalreporter.write_line(f"{nodeid}: {path / 'evidence.md'}")
