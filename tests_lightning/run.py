#!/usr/bin/env python
"""Run Lightning's own ModelCheckpoint tests plain and with ``ManifestCheckpoint`` swapped in; count both.

A developer tool, not part of CI (it needs Lightning's source, which CI cannot fetch). Usage, from the
repository root, with the project's interpreter::

    LIGHTNING_SRC=/path/to/pytorch-lightning .venv/bin/python tests_lightning/run.py [--snapshots-off]

``LIGHTNING_SRC`` (or ``--src``) is either a source tree holding ``tests/tests_pytorch`` (a checkout of
the tag matching the installed Lightning) or a git directory (a clone, or a bare mirror) from which the
tag of the installed version is extracted (the newest ``X.Y.*`` tag at or below it where that tag is
missing, said so). Without it, the tag is cloned from GitHub where the network allows, else the tool
exits 2 saying what to set. Nothing is copied into this repository: the test files are extracted into
``--work`` (default ``$TMPDIR/tests_lightning``) and run there.

Runs (``--runs``; default ``control,control-adapt,swap,swap-adapt``):

- ``control``: Lightning's tests as they are;
- ``control-adapt``: the same with the format-only adaptations installed, which must change nothing;
- ``swap``: ``ModelCheckpoint`` replaced by ``ManifestCheckpoint`` at its defaults (raw counts);
- ``swap-adapt``: the same with the format-only adaptations (``tests_lightning/format_adaptations.py``);
- ``swap-nosnap``, ``swap-nosnap-adapt``: as above with ``SnapshotConfig(every_n_train_steps=None)``
  (added by ``--snapshots-off``);
- ``swap-adapt-count``: a diagnostic (``--diagnose-save-count``), not an adaptation: ``swap-adapt`` where each
  persistent save also calls ``torch.save`` once, so tests that count a mocked ``torch.save`` compare the
  number of checkpoints saved instead of failing on a mechanism.

Prints pass/fail counts per file for each run, the tests each adaptation-free run fails, and writes
``summary.json`` (every test's outcome in every run), the junit XML and the log of each run to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
UPSTREAM_URL = "https://github.com/Lightning-AI/pytorch-lightning.git"
TEST_FILES = (
    "tests_pytorch/checkpointing/test_model_checkpoint.py",
    "tests_pytorch/checkpointing/test_checkpoint_callback_frequency.py",
    "tests_pytorch/checkpointing/test_trainer_checkpoint.py",
)
# What the three files need from Lightning's tests folder (its helpers and conftest), and the
# pytest settings of its pyproject.toml (filterwarnings and the like), as Lightning's CI runs them.
NEEDED = (
    "pyproject.toml",
    "tests/tests_pytorch/__init__.py",
    "tests/tests_pytorch/conftest.py",
    "tests/tests_pytorch/helpers",
    "tests/tests_pytorch/checkpointing",
)
# Test-only requirements of Lightning's suite (requirements/pytorch/test.txt, extra.txt) that these files
# import and the project's venv lacks: installed with --no-deps into a folder of the work dir, never the venv.
TEST_DEPS = {"cloudpickle": "cloudpickle", "tensorboardX": "tensorboardX"}
RUNS = {
    "control": [],
    "control-adapt": ["--tl-format-adapt"],
    "swap": ["--tl-swap"],
    "swap-adapt": ["--tl-swap", "--tl-format-adapt"],
    "swap-nosnap": ["--tl-swap", "--tl-snapshots=off"],
    "swap-nosnap-adapt": ["--tl-swap", "--tl-snapshots=off", "--tl-format-adapt"],
    # Diagnostic, not counted as an adaptation: tests counting a mocked torch.save count saves (swap_plugin).
    "swap-adapt-count": ["--tl-swap", "--tl-format-adapt", "--tl-count-saves"],
}


class SourceError(SystemExit):
    def __init__(self, message: str) -> None:
        print(f"tests_lightning: {message}", file=sys.stderr)
        super().__init__(2)


def installed_lightning_version(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import lightning; print(lightning.__version__)"], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def _version_key(tag: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", tag)[:3])


def pick_tag(tags: list[str], version: str) -> tuple[str | None, str]:
    """The tag of ``version``, else the newest tag of its minor series at or below it, else None."""
    if version in tags:
        return version, f"tag {version} (the installed version)"
    major_minor = ".".join(version.split(".")[:2])
    series = [t for t in tags if re.fullmatch(rf"{re.escape(major_minor)}\.\d+", t)]
    lower = [t for t in series if _version_key(t) <= _version_key(version)]
    if lower:
        tag = max(lower, key=_version_key)
        return tag, f"tag {tag} (no tag {version}; the newest {major_minor}.x tag at or below it)"
    return None, f"no {major_minor}.x tag at or below {version}"


def _git(git_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], capture_output=True, text=True)


def _git_dir_of(path: Path) -> Path | None:
    if (path / ".git").exists():
        return path / ".git"
    if (path / "HEAD").is_file() and (path / "objects").is_dir():
        return path  # a bare repository
    return None


def extract_from_git(git_dir: Path, version: str, dest: Path) -> str:
    tags = _git(git_dir, "tag").stdout.split()
    tag, why = pick_tag(tags, version)
    ref = tag
    if ref is None:
        ref = "HEAD"
        why += "; using the default branch (HEAD)"
    files = _git(git_dir, "ls-tree", "-r", "--name-only", ref, "--", *NEEDED)
    if files.returncode != 0 or not files.stdout.strip():
        raise SourceError(f"{git_dir} at {ref} has none of {NEEDED}: {files.stderr.strip()}")
    for name in files.stdout.split():  # one blob at a time: a mirror may lack unrelated (LFS) objects
        blob = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{ref}:{name}"], capture_output=True)
        if blob.returncode != 0:
            raise SourceError(f"cannot read {ref}:{name} from {git_dir}: {blob.stderr.decode().strip()}")
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(blob.stdout)
    commit = _git(git_dir, "rev-parse", f"{ref}^{{commit}}").stdout.strip()
    return f"{why}, commit {commit[:12]}, from {git_dir}"


def copy_from_tree(src: Path, dest: Path, version: str) -> str:
    for name in NEEDED:
        source = src / name
        if not source.exists():
            raise SourceError(f"{src} is not a Lightning source tree: {name} is missing")
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
    info = src / "src" / "version.info"
    tree_version = info.read_text().strip() if info.is_file() else "unknown"
    note = "" if tree_version == version else f" (WARNING: it is {tree_version}, the installed Lightning {version})"
    return f"source tree {src}, version.info {tree_version}{note}"


def prepare_source(src: str | None, version: str, work: Path) -> tuple[Path, str]:
    dest = work / "lightning-src"
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    if src:
        path = Path(src).expanduser().resolve()
        if not path.exists():
            raise SourceError(f"LIGHTNING_SRC={src} does not exist")
        git_dir = _git_dir_of(path)
        if (path / "tests" / "tests_pytorch").is_dir() and (git_dir is None or os.environ.get("TL_USE_TREE")):
            return dest, copy_from_tree(path, dest, version)
        if git_dir is None:
            raise SourceError(f"LIGHTNING_SRC={src} is neither a Lightning source tree nor a git directory")
        return dest, extract_from_git(git_dir, version, dest)
    clone = work / "clone.git"
    if not clone.exists():
        print(f"tests_lightning: LIGHTNING_SRC not set; trying to clone {UPSTREAM_URL} (tag {version})...")
        try:
            done = subprocess.run(
                ["git", "clone", "--bare", "--filter=blob:none", "--no-tags", UPSTREAM_URL, str(clone)],
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            done = None
        if done is None or done.returncode != 0:
            shutil.rmtree(clone, ignore_errors=True)
            reason = "timed out" if done is None else " ".join(done.stderr.strip().splitlines()[-1:])
            raise SourceError(
                f"Lightning's source is needed and could not be fetched ({reason}). Set LIGHTNING_SRC to a "
                f"checkout of pytorch-lightning at tag {version} (or the newest tag below it), or to any clone or "
                f"bare mirror of it (the tag is then extracted), e.g. `git clone --bare --filter=blob:none "
                f"{UPSTREAM_URL} /tmp/pl.git && LIGHTNING_SRC=/tmp/pl.git python tests_lightning/run.py`. "
                "This is a developer tool: CI has no network beyond package registries."
            )
        _git(clone, "fetch", "--filter=blob:none", "origin", "refs/tags/*:refs/tags/*")
    return dest, extract_from_git(clone, version, dest)


def ensure_test_deps(python: str, work: Path) -> Path:
    deps = work / "deps"
    env = {**os.environ, "PYTHONPATH": str(deps)}
    missing = [
        pip_name
        for module, pip_name in TEST_DEPS.items()
        if subprocess.run([python, "-c", f"import {module}"], env=env, capture_output=True).returncode != 0
    ]
    if missing:
        print(f"tests_lightning: installing Lightning's test-only requirements {missing} into {deps} (not the venv)")
        done = subprocess.run(
            [python, "-m", "pip", "install", "-q", "--no-deps", "--target", str(deps), *missing],
            capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode != 0:
            raise SourceError(f"cannot install {missing}: {done.stderr.strip()[-500:]}")
    return deps


def run_pytest(python: str, name: str, tests_dir: Path, deps: Path, out: Path, args: argparse.Namespace) -> Path:
    xml = out / f"{name}.xml"
    log = out / f"{name}.log"
    command = [python, "-m", "pytest", "-p", "no:cacheprovider", "--color=no", "-q", "-rfE", f"--junitxml={xml}"]
    if args.workers > 1:
        command += ["-n", str(args.workers)]
    if RUNS[name]:
        command += ["-p", "tests_lightning.swap_plugin", *RUNS[name]]
    if args.adapt_only and "--tl-format-adapt" in RUNS[name]:
        command += [f"--tl-adapt-only={args.adapt_only}"]
    if args.k:
        command += ["-k", args.k]
    command += list(args.files or TEST_FILES)
    pythonpath = [str(REPO_ROOT), str(deps), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in pythonpath if p)}
    print(f"tests_lightning: [{name}] {' '.join(command[1:])}", flush=True)
    with log.open("w") as handle:
        handle.write(f"# cwd {tests_dir}\n# {' '.join(command)}\n")
        handle.flush()
        try:
            subprocess.run(
                command, cwd=tests_dir, env=env, stdout=handle, stderr=subprocess.STDOUT, timeout=args.timeout
            )
        except subprocess.TimeoutExpired:
            print(f"tests_lightning: [{name}] timed out after {args.timeout} s (see {log})")
    tail = log.read_text().strip().splitlines()[-1:] or [""]
    print(f"tests_lightning: [{name}] {tail[0]}", flush=True)
    return xml


def read_junit(xml: Path) -> dict[str, str]:
    """``{nodeid: outcome}``, outcome one of passed, failed, error (setup/teardown only), skipped."""
    if not xml.is_file():
        return {}
    outcomes: dict[str, str] = {}
    rank = {"passed": 0, "skipped": 1, "error": 2, "failed": 3}
    for case in ET.parse(xml).getroot().iter("testcase"):
        path = case.get("classname", "").replace(".", "/")
        nodeid = f"{path}.py::{case.get('name')}"
        kinds = {child.tag for child in case}
        if "failure" in kinds:
            outcome = "failed"
        elif "error" in kinds:
            outcome = "error"
        elif "skipped" in kinds:
            outcome = "skipped"
        else:
            outcome = "passed"
        previous = outcomes.get(nodeid, "passed")
        outcomes[nodeid] = max(previous, outcome, key=rank.__getitem__)
    return outcomes


def counts_by_file(outcomes: dict[str, str]) -> dict[str, dict[str, int]]:
    table: dict[str, dict[str, int]] = {}
    for nodeid, outcome in outcomes.items():
        row = table.setdefault(nodeid.split("::")[0], {"passed": 0, "failed": 0, "error": 0, "skipped": 0})
        row[outcome] += 1
    return table


def _snapshot_parent() -> Path:
    """ManifestCheckpoint's default step-snapshot parent on this machine (docs/checkpoints.md)."""
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    return base / f"lightning_field-snapshots-{os.getuid()}"


def _snapshot_folders() -> set[str]:
    parent = _snapshot_parent()
    return set(os.listdir(parent)) if parent.is_dir() else set()


def _remove_test_snapshot_folders(before: set[str]) -> None:
    """Step snapshots live outside dirpath and outlive it (by design), so every upstream test's ``tmp_path``
    leaves a folder in the snapshot parent. Remove those these runs added (named after a pytest ``tmp_path``,
    ``test_*``); anything else there, such as another suite's, is left alone."""
    parent = _snapshot_parent()
    added = sorted(n for n in _snapshot_folders() - before if n.startswith("test_"))
    for name in added:
        shutil.rmtree(parent / name, ignore_errors=True)
    if added:
        print(f"tests_lightning: removed {len(added)} step-snapshot folders these runs left in {parent}")


def fmt(row: dict[str, int] | None) -> str:
    if not row:
        return "-"
    bad = row["failed"] + row["error"]
    return f"{row['passed']} pass / {bad} fail" + (f" ({row['error']} err)" if row["error"] else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", default=os.environ.get("LIGHTNING_SRC"), help="Lightning source tree or git dir")
    parser.add_argument("--runs", default="control,control-adapt,swap,swap-adapt", help=f"of {', '.join(RUNS)}")
    parser.add_argument("--snapshots-off", action="store_true", help="add swap-nosnap and swap-nosnap-adapt")
    parser.add_argument("--diagnose-save-count", action="store_true", help="add the swap-adapt-count diagnostic")
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "tests_lightning"))
    parser.add_argument("--out", default=None, help="results folder (default: WORK/results)")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="pytest-xdist workers (default 1: serial; workers share one tests folder, whose per-test artifact "
        "check then blames whichever test runs beside the one that wrote)",
    )
    parser.add_argument("--timeout", type=int, default=1200, help="seconds per run")
    parser.add_argument("--adapt-only", default=None, help="the *-adapt runs apply only these adaptations (a,b,...)")
    parser.add_argument("-k", default=None, help="pytest -k expression")
    parser.add_argument("--files", nargs="*", default=None, help=f"test files (default: {' '.join(TEST_FILES)})")
    args = parser.parse_args(argv)

    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    if args.snapshots_off:
        runs += [r for r in ("swap-nosnap", "swap-nosnap-adapt") if r not in runs]
    if args.diagnose_save_count and "swap-adapt-count" not in runs:
        runs.append("swap-adapt-count")
    unknown = [r for r in runs if r not in RUNS]
    if unknown:
        parser.error(f"unknown runs {unknown}; known: {list(RUNS)}")
    if REPO_ROOT in Path(args.work).resolve().parents or Path(args.work).resolve() == REPO_ROOT:
        parser.error("--work must be outside this repository (Lightning's files are never copied into it)")

    python = sys.executable
    version = installed_lightning_version(python)
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out).resolve() if args.out else work / "results"
    out.mkdir(parents=True, exist_ok=True)
    src_dir, provenance = prepare_source(args.src, version, work)
    deps = ensure_test_deps(python, work)
    print(f"tests_lightning: installed lightning {version}; tests from {provenance}")

    snapshots_before = _snapshot_folders()
    results: dict[str, dict[str, str]] = {}
    for name in runs:
        results[name] = read_junit(run_pytest(python, name, src_dir / "tests", deps, out, args))
    _remove_test_snapshot_folders(snapshots_before)

    files = sorted({n.split("::")[0] for outcomes in results.values() for n in outcomes})
    tables = {name: counts_by_file(outcomes) for name, outcomes in results.items()}
    width = max([len(f) for f in files] + [5])
    print("\n" + "file".ljust(width) + "".join(f" | {name:>22}" for name in runs))
    for f in [*files, "total"]:
        cells = []
        for name in runs:
            if f == "total":
                total = {k: sum(r[k] for r in tables[name].values()) for k in ("passed", "failed", "error", "skipped")}
                cells.append(fmt(total))
            else:
                cells.append(fmt(tables[name].get(f)))
        print(f.ljust(width) + "".join(f" | {c:>22}" for c in cells))

    bad = {"failed", "error"}
    for raw, adapted in (("swap", "swap-adapt"), ("swap-nosnap", "swap-nosnap-adapt")):
        if raw in results and adapted in results:
            fixed = sorted(n for n, o in results[raw].items() if o in bad and results[adapted].get(n) == "passed")
            still = sorted(n for n, o in results[adapted].items() if o in bad)
            print(f"\n{raw}: {len(fixed)} failures are format-only (pass in {adapted}); {len(still)} remain:")
            for nodeid in still:
                print(f"  {results[adapted][nodeid]:6} {nodeid}")
    if "swap-adapt" in results and "swap-adapt-count" in results:
        counted = sorted(
            n for n, o in results["swap-adapt"].items() if o in bad and results["swap-adapt-count"].get(n) == "passed"
        )
        print(f"\ndiagnostic: {len(counted)} swap-adapt failures pass once saves are counted as torch.save calls:")
        for nodeid in counted:
            print(f"  {nodeid}")
    if "control" in results and "control-adapt" in results:
        changed = sorted(n for n in results["control"] if results["control"][n] != results["control-adapt"].get(n))
        verdict = "none" if not changed else ", ".join(changed)
        print(f"\nadaptations' effect on plain ModelCheckpoint (control vs control-adapt): {verdict}")

    summary = {"lightning": version, "source": provenance, "runs": runs, "counts": tables, "outcomes": results}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    print(f"\ntests_lightning: logs, junit XML and summary.json in {out}")
    control_bad = [n for n, o in results.get("control", {}).items() if o in bad]
    if control_bad:
        print(f"tests_lightning: the control run failed {len(control_bad)} tests: the environment, not the swap")
        return 1
    return 0 if all(results.values()) else 3


if __name__ == "__main__":
    sys.exit(main())
