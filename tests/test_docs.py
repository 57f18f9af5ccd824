"""The README and the pages under docs/: their runnable shell blocks run, the layout page matches the
package tree, and their relative links resolve.

Why: a command in the docs that no longer runs, or a layout page that names modules which moved, is
worse than no docs. These tests make both fail in CI instead of in a newcomer's terminal.

**The runnable marker.** An HTML comment ``<!-- runnable -->`` on the line right before a
```` ```bash ```` fence marks that block as runnable (Markdown renderers do not show the comment)::

    <!-- runnable -->
    ```bash
    field-train experiment=demo
    field ckpt verify outputs/field-train/demo/checkpoints/epoch=1-step=60
    ```

The runnable blocks of one page run in the order they appear, in one fresh working directory that
page's blocks share (so a block may use what an earlier block of the same page wrote), each as
``bash -euo pipefail``: every command must exit 0. The console scripts (``field``, ``field-train``,
...) come from the virtual environment of the interpreter running the tests, put first on ``PATH``
(``.ci/run`` does the same). Mark a block only when it runs in seconds on 2 CPU cores with no
network, GPU or cluster; a block that needs one of those, or runs for minutes, stays unmarked.

**The layout page.** ``docs/layout.md`` holds a table between ``<!-- layout:begin -->`` and
``<!-- layout:end -->`` whose first column is a path under ``lightning_field/``: a subpackage as
``name/``, a module as ``name.py`` or ``sub/name.py``. Every subpackage and module of the package must
be in it, and everything in it must exist.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_in_session

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "lightning_field"
README = REPO / "README.md"
DOCS = REPO / "docs"
LAYOUT_PAGE = DOCS / "layout.md"
PAGES = [README, *sorted(DOCS.glob("*.md"))]

RUNNABLE_MARKER = "<!-- runnable -->"
BLOCK_TIMEOUT_S = 300
README_MAX_LINES = 200

_FENCE = re.compile(r"^```")
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _page_id(page: Path) -> str:
    return str(page.relative_to(REPO))


def runnable_blocks(page: Path) -> list[str]:
    """The page's runnable bash blocks, in order. A marker not followed by a bash fence is an error,
    so that a mistyped block is not silently skipped."""
    lines = page.read_text().splitlines()
    blocks: list[str] = []
    for number, line in enumerate(lines):
        if line.strip() != RUNNABLE_MARKER:
            continue
        fence = lines[number + 1].strip() if number + 1 < len(lines) else ""
        if fence != "```bash":
            raise AssertionError(
                f"{_page_id(page)}:{number + 1}: {RUNNABLE_MARKER} must be followed by a ```bash fence"
            )
        body: list[str] = []
        for inner in lines[number + 2 :]:
            if _FENCE.match(inner):
                break
            body.append(inner)
        else:
            raise AssertionError(f"{_page_id(page)}:{number + 1}: the runnable block is never closed")
        blocks.append("\n".join(body) + "\n")
    return blocks


def _block_env(page: Path) -> dict[str, str]:
    env = dict(os.environ)
    # The console scripts of the environment that runs the tests, whatever PATH held before; on the
    # pages under docs/, run by the warm python (tests/warm_python.py). The README's own blocks
    # start them as a fresh shell does.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    if page != README and "FIELD_WARM_PYTHON" in os.environ:
        env["PATH"] = os.path.dirname(os.environ["FIELD_WARM_PYTHON"]) + os.pathsep + env["PATH"]
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MPLBACKEND", "Agg")
    env["PYTHONWARNINGS"] = "ignore"
    return env


def _run_block(block: str, cwd: Path, page: Path) -> subprocess.CompletedProcess[str]:
    """``bash -euo pipefail`` in its own session (``conftest.run_in_session``)."""
    return run_in_session(["bash", "-euo", "pipefail", "-c", block], BLOCK_TIMEOUT_S, cwd, _block_env(page))


PAGES_WITH_BLOCKS = [page for page in PAGES if runnable_blocks(page)]


def test_the_docs_have_runnable_blocks() -> None:
    """Guards the parser: if the marker convention broke, no page would have a block and the test
    below would run nothing."""
    assert README in PAGES_WITH_BLOCKS
    assert len(PAGES_WITH_BLOCKS) >= 5, [_page_id(p) for p in PAGES_WITH_BLOCKS]


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES_WITH_BLOCKS, ids=_page_id)
def test_runnable_blocks_run_as_written(page: Path, tmp_path: Path) -> None:
    for number, block in enumerate(runnable_blocks(page), start=1):
        result = _run_block(block, tmp_path, page)
        assert result.returncode == 0, (
            f"{_page_id(page)}: runnable block {number} exited {result.returncode} in {tmp_path}:\n"
            f"{block}\noutput:\n{result.stdout[-8000:]}"
        )


def test_readme_is_short() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines: move reference text to docs/"


def _github_anchor(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_github_anchor(line.lstrip("#")) for line in page.read_text().splitlines() if line.startswith("#")}


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in _LINK.findall(page.read_text()):
        if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
            continue
        path_part, _, anchor = target.partition("#")
        linked = (page.parent / path_part).resolve() if path_part else page
        if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in _anchors(linked)):
            broken.append(target)
    assert not broken, f"{_page_id(page)} links to what does not exist: {broken}"


def _layout_table_paths() -> list[str]:
    text = LAYOUT_PAGE.read_text()
    begin, end = "<!-- layout:begin -->", "<!-- layout:end -->"
    assert begin in text and end in text, f"{_page_id(LAYOUT_PAGE)} lost its {begin} ... {end} table"
    table = text.split(begin, 1)[1].split(end, 1)[0]
    paths = []
    for line in table.splitlines():
        match = re.match(r"\|\s*`([^`]+)`\s*\|", line)
        if match:
            paths.append(match.group(1))
    return paths


def _package_tree() -> set[str]:
    """Every module and subpackage of lightning_field/, as the layout table names them."""
    names: set[str] = set()
    for module in PACKAGE.rglob("*.py"):
        if "__pycache__" in module.parts:
            continue
        relative = module.relative_to(PACKAGE)
        if module.name == "__init__.py" and relative.parent != Path("."):
            names.add(relative.parent.as_posix() + "/")
        else:
            names.add(relative.as_posix())
    return names


def test_layout_page_names_every_module() -> None:
    named = set(_layout_table_paths())
    unnamed = sorted(_package_tree() - named)
    assert not unnamed, f"{_page_id(LAYOUT_PAGE)} does not name these (add a row with their concern): {unnamed}"


def test_layout_page_names_only_what_exists() -> None:
    table = _layout_table_paths()
    assert len(table) == len(set(table)), "a path is named twice in the layout table"
    missing = [path for path in table if not (PACKAGE / path).exists()]
    assert not missing, f"{_page_id(LAYOUT_PAGE)} names paths that do not exist under lightning_field/: {missing}"
    not_modules = [path for path in table if not path.endswith((".py", "/"))]
    assert not not_modules, f"layout rows name a module (.py) or a subpackage (/): {not_modules}"
    # Outside the table too: every module the page names in a code span exists, in the package or at
    # the repository's top (folders outside the table may be run-directory paths, so only modules).
    spans = [s for s in _CODE_SPAN.findall(LAYOUT_PAGE.read_text()) if re.fullmatch(r"[\w./-]+\.py", s)]
    stale = [s for s in spans if not (PACKAGE / s).exists() and not (REPO / s).exists()]
    assert not stale, f"{_page_id(LAYOUT_PAGE)} names paths that do not exist: {stale}"
