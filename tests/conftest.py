"""Shared helpers: real child processes, killed for real, with nothing left running afterwards."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from lightning_field import ManifestCheckpoint

pytest_plugins = ["suite_budget", "warm_python"]  # the slow marker and limits; the warm python of child jobs

TESTS_DIR = Path(__file__).parent
TRAIN_JOB = TESTS_DIR / "jobs" / "train_job.py"


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONWARNINGS"] = "ignore"
    env.setdefault("OMP_NUM_THREADS", "1")
    # A child that hangs is sent SIGABRT before it is killed: with the fault handler on, every Python
    # process of its group (DDP ranks, loader workers) prints where each of its threads was stuck.
    env["PYTHONFAULTHANDLER"] = "1"
    return env


def make_trainer(root: Path, max_steps: int, dirpath: Path | None = None, **checkpoint: object) -> pl.Trainer:
    """A quiet CPU Trainer with one ManifestCheckpoint (every 2 steps, keep all unless overridden)."""
    options: dict[str, object] = {"every_n_train_steps": 2, "save_top_k": -1, **checkpoint}
    callback = ManifestCheckpoint(dirpath=dirpath or root / "ckpts", **options)
    return pl.Trainer(
        default_root_dir=root,
        max_steps=max_steps,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[callback],
    )


def rewrite_shared_state(checkpoint: Path, change: Callable[[dict], object], keys: object = None) -> None:
    """Rewrite a committed checkpoint's ``state.pt`` with ``change`` applied and its manifest to match
    (size and hash; signed with ``keys``, a ``ManifestKeys``, or unsigned), as anyone who can write
    the directory could: every hash verifies afterwards."""
    from lightning_field.core.hashing import hash_file  # imported here: most tests never forge
    from lightning_field.core.manifest import SHARED_STATE_FILE, read_manifest

    state = torch.load(checkpoint / SHARED_STATE_FILE, weights_only=False)  # the test's own file
    change(state)
    (checkpoint / SHARED_STATE_FILE).unlink()
    torch.save(state, checkpoint / SHARED_STATE_FILE)
    manifest = read_manifest(checkpoint)
    entry = manifest.files[SHARED_STATE_FILE]
    entry.size, entry.hash = hash_file(checkpoint / SHARED_STATE_FILE)
    manifest.sign(keys)  # type: ignore[arg-type]
    manifest.write(checkpoint)


def run_in_session(
    argv: Sequence[str], timeout: float, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in its own session, output captured; on timeout the whole process group gets
    SIGABRT (Python children print every thread's stack), then SIGKILL, and the test fails with it."""
    proc = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=env if env is not None else child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGABRT)
        try:
            out, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out = _output_after_kill(proc)
        raise AssertionError(
            f"child {list(argv)} timed out after {timeout}s; output, ending with the stacks of every process:\n"
            f"{out[-16000:]}"
        ) from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # DataLoader workers or DDP ranks left behind
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def _output_after_kill(proc: subprocess.Popen[str]) -> str:
    """What the killed group wrote; bounded, because a process outside the group (a warm job in a
    session of its own) can hold the pipe open, and an unbounded read would hang the whole suite."""
    try:
        out, _ = proc.communicate(timeout=30)
        return out
    except subprocess.TimeoutExpired as still_held:
        partial = still_held.output or b""
        text = partial.decode(errors="replace") if isinstance(partial, bytes) else partial
        assert proc.stdout is not None
        proc.stdout.close()
        proc.wait()
        return text + "\n[the output pipe is still held by processes outside the killed group]\n"


def python_program() -> str:
    """The warm python (tests/warm_python.py) where its server runs, else this interpreter."""
    return os.environ.get("FIELD_WARM_PYTHON", sys.executable)


@pytest.fixture
def warm_children(monkeypatch: pytest.MonkeyPatch) -> None:
    """The product starts its own workers (restore drills, scale ranks, evidence attempts) from
    ``sys.executable``: in a test that calls it in-process, from the warm python instead."""
    monkeypatch.setattr(sys, "executable", python_program())


def run_child(args: Sequence[str], timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python args...`` (:func:`python_program`) in its own session (:func:`run_in_session`)."""
    return run_in_session([python_program(), *map(str, args)], timeout, cwd)


def run_train_job(root: Path, out: Path, *extra: str, expect_rc: int | None = 0, timeout: float = 120) -> str:
    result = run_child([TRAIN_JOB, "--root", root, "--out", out, *extra], timeout=timeout)
    if expect_rc is not None:
        assert result.returncode == expect_rc, f"train job exited {result.returncode}:\n{result.stdout[-4000:]}"
    return result.stdout


def assert_bitwise_equal(a: object, b: object, path: str = "") -> None:
    """Every tensor and value in two nested structures is identical, bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(a, b), f"{path}: max |Δ| = {(a.double() - b.double()).abs().max().item():.3g}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{path}: keys differ"
        for key in a:
            assert_bitwise_equal(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{path}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_bitwise_equal(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def max_weight_difference(a: dict, b: dict) -> float:
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


@pytest.fixture
def quiet_lightning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONWARNINGS", "ignore")


@pytest.fixture(scope="session")
def s3_endpoint() -> object:
    """A real S3 API on loopback (moto's server, threaded) for the whole session, with dummy
    credentials in the environment; child processes inherit them. Yields the endpoint URL."""
    pytest.importorskip("s3fs", reason="object-store tests need the [s3] extra (pip install -e .[dev])")
    from moto.server import ThreadedMotoServer

    with pytest.MonkeyPatch.context() as env:
        for name, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_SESSION_TOKEN": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }.items():
            env.setenv(name, value)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        try:
            host, port = server.get_host_and_port()
            yield f"http://{host}:{port}"
        finally:
            server.stop()


@pytest.fixture
def s3_bucket(s3_endpoint: str, request: pytest.FixtureRequest) -> tuple[str, dict[str, str]]:
    """A fresh, empty bucket per test: (``s3://`` URL, fsspec storage options)."""
    import boto3

    name = "t-" + "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:50].strip("-")
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=name)
    return f"s3://{name}", {"endpoint_url": s3_endpoint}


@pytest.fixture(scope="session")
def shared_shards(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """One folder, for every pytest worker of this run, where library streams' shard files are
    written once (each is written to a private folder and renamed into place: workers race)."""
    base = tmp_path_factory.getbasetemp()
    return (base if worker_id == "master" else base.parent) / "shared-shards"


# Test files whose tests share nothing (no module fixture): under `--dist loadgroup` (.ci/run) they
# are dealt out one test at a time, so the long conformance matrix does not leave one worker
# finishing alone. Every other file stays on one worker, so its module fixtures run once.
SPREAD_FILES = {"test_conformance.py", "test_conformance_plain.py"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name not in SPREAD_FILES:
            item.add_marker(pytest.mark.xdist_group(item.path.name))
    # The largest indivisible work first, the matrix dealt out test by test last (longest processing
    # time first): a file of many multi-process tests handed out at the end would leave one worker
    # finishing alone. A file's size is its count of slow tests; the order inside a file is kept.
    slow = Counter(item.path.name for item in items if item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: (item.path.name in SPREAD_FILES, -slow[item.path.name], item.path.name))
