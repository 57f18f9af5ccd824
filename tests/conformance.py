"""The conformance protocol: an uninterrupted run, the same run SIGKILLed, then resumed with
``ckpt_path="last"``, compared bit for bit (weights, optimizers, LR schedulers, callback state and
the logged epoch metrics of every epoch the resumed attempt closed). The uninterrupted run is the
user's own, with plain ``ModelCheckpoint``, wherever the row has a plain control (``has_plain_control``).

Single-process configurations are forked from a fork server that has imported Lightning once (a
run costs its training, not Lightning's import); multi-rank ones start ``jobs/conformance_job.py``
through Lightning's DDP launcher, as a user's script would. Multi-node ones run under two torchrun
elastic agents on loopback (one per simulated node, c10d rendezvous, ``--max-restarts=1``): the
kill and the resume are one launch, since torchrun itself restarts the group. Scripts, ranks,
agents and workers start from the suite's warm python (``warm_python.py``) where it runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import multiprocessing
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

TESTS_DIR = Path(__file__).parent
JOB = TESTS_DIR / "jobs" / "conformance_job.py"
CLI_JOB = TESTS_DIR / "jobs" / "cli_job.py"
sys.path.insert(0, str(JOB.parent))

import conformance_job  # noqa: E402  (tests/jobs is not a package)

CONFIGS = conformance_job.CONFIGS


@dataclass
class Outcome:
    """How one checkpoint callback fared on one configuration."""

    name: str
    checkpoint: str  # "field" or "plain"
    killed_rc: int | None = None
    stopped_at_step: int | None = None  # where a first attempt that stopped (not killed) ended
    resumed_from_step: int | None = None
    trained_batches: int | None = None  # batches the rerun trained
    # Per checkpoint the rerun committed (field only): whether its manifest says the lineage is not exact.
    inexact_lineage: list[bool] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)
    error: str | None = None
    log: str = ""

    @property
    def exact(self) -> bool:
        return self.error is None and not self.differences and bool(self.resumed_from_step)

    def summary(self) -> str:
        if self.error:
            return f"error: {self.error.splitlines()[-1][:160]}"
        if not self.resumed_from_step:
            return "started over from step 0"
        if self.differences:
            return f"diverged after resuming at step {self.resumed_from_step}: {self.differences[0]}"
        return f"exact (resumed at step {self.resumed_from_step})"


def _child(name: str, root: Path, out: Path, checkpoint: str, kill: bool, resume: bool, log: Path,
           shards: Path | None) -> None:
    import os

    if shards is not None:
        os.environ[conformance_job.SHARDS_ENV] = str(shards)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    # Under pytest, sys.stdout/err are its capture objects, not fds 1 and 2: the child's own
    # output (tracebacks, warnings) must reach the log file the outcome is read from.
    sys.stdout = sys.stderr = os.fdopen(fd, "w", buffering=1)
    # A forkserver child inherits "forkserver" as its start method. Its DataLoader workers would then
    # start a fork server of their own per run (a fresh interpreter importing Lightning, ~4 s, left
    # running after the run ends); a user's script starts them with the platform default.
    multiprocessing.set_start_method(None, force=True)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C raises KeyboardInterrupt, as in a script
    try:
        conformance_job.run(name, str(root), str(out), checkpoint, kill, resume)
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


PRELOAD = ["conformance_job", "lightning.pytorch", "torchmetrics", "lightning_field.checkpoint.manifest_checkpoint",
           "omegaconf", "s3fs", "stream_data", "datasets", "litdata", "webdataset"]  # fmt: skip
"""What the forked runs would import themselves: ``lightning_field`` imports its names lazily;
Lightning's ``ModelCheckpoint.setup`` imports s3fs, where it is installed, to ask whether ``dirpath`` is
object storage (0.5 s of a 1.1 s run); the stream rows import their library (``datasets``: 0.8 s)."""


def _fork_server() -> Any:
    """Children fork from a server process that has imported Lightning and never trained.

    A test process that has already trained in-process holds torch's OpenMP thread pool, and a
    child forked from it hangs in its first parallel op (libgomp is not fork-safe): seen as every
    forked run of a worker hanging once another test file had trained there. The fork server
    keeps the start-up cheap (imports done once) and the children safe.
    """
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def _forked(
    name: str, root: Path, out: Path, checkpoint: str, kill: bool, resume: bool, shards: Path | None
) -> tuple[int, str]:
    log = root.parent / f"{root.name}-{'kill' if kill else 'resume' if resume else 'run'}.log"
    process = _fork_server().Process(target=_child, args=(name, root, out, checkpoint, kill, resume, log, shards))
    process.start()
    process.join(180)
    if process.is_alive():
        process.kill()
        process.join()
        return -999, log.read_text()
    return process.exitcode or 0, log.read_text() if log.exists() else ""


def _job_env(shards: Path | None) -> dict[str, str]:
    from conftest import child_env

    env = child_env()
    if shards is not None:
        env[conformance_job.SHARDS_ENV] = str(shards)
    return env


def _launched(
    name: str, root: Path, out: Path, checkpoint: str, kill: bool, resume: bool, shards: Path | None
) -> tuple[int, str]:
    from conftest import python_program, run_in_session

    args = [JOB, name, "--root", root, "--out", out, "--checkpoint", checkpoint]
    args += ["--kill"] if kill else []
    args += ["--resume"] if resume else []
    result = run_in_session([python_program(), *map(str, args)], timeout=180, env=_job_env(shards))
    return result.returncode, result.stdout


def _cli_launched(
    name: str, root: Path, out: Path, checkpoint: str, kill: bool, resume: bool, shards: Path | None
) -> tuple[int, str]:
    """The user's LightningCLI script, everything on its command line, as a user would run it."""
    from conftest import python_program, run_in_session

    config = CONFIGS[name]
    callback = "lightning_field.ManifestCheckpoint" if checkpoint == "field" else "ModelCheckpoint"
    args = [
        "fit", "--seed_everything=1234", "--trainer.accelerator=cpu", f"--trainer.max_steps={config.max_steps}",
        f"--trainer.default_root_dir={root}", "--trainer.logger=false", "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false", "--trainer.num_sanity_val_steps=0", "--trainer.limit_val_batches=0",
        f"--trainer.callbacks+={callback}", f"--trainer.callbacks.dirpath={root / 'checkpoints'}",
        f"--trainer.callbacks.every_n_train_steps={config.every_n_train_steps}",
        "--trainer.callbacks.save_top_k=-1", "--trainer.callbacks.save_last=true",
        "--trainer.callbacks+=conformance_job.RecordRun",
        *(["--trainer.callbacks+=conformance_job.KillAtStep", f"--trainer.callbacks.step={config.kill_at}"]
          if kill else []),
        *(["--ckpt_path=last"] if resume else []),
    ]  # fmt: skip
    env = _job_env(shards)
    env["CONFORMANCE_OUT"] = str(out)
    root.mkdir(parents=True, exist_ok=True)
    result = run_in_session([python_program(), str(CLI_JOB), *args], timeout=180, env=env)
    return result.returncode, result.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _agent_command(name: str, root: Path, out: Path, checkpoint: str, kill: bool, port: int) -> list[str]:
    """One simulated node's torchrun elastic agent (c10d rendezvous on loopback, one restart)."""
    from conftest import python_program

    config = CONFIGS[name]
    return [
        python_program(), "-m", "torch.distributed.run", f"--nnodes={config.nodes}",
        f"--nproc-per-node={config.devices}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id=conformance-{port}", "--max-restarts=1", "--monitor-interval=0.5",
        str(JOB), name, "--root", str(root), "--out", str(out), "--checkpoint", checkpoint,
        *(["--kill"] if kill else []),
    ]  # fmt: skip


def _start_agent(command: list[str], shards: Path | None, node: str, log: Path) -> subprocess.Popen[bytes]:
    env = _job_env(shards)
    # The launch line docs/conformance.md documents: without it, restarted groups can hang (pytorch#135712).
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    env["CONFORMANCE_NODE"] = node  # which simulated machine: its "node-local" snapshot directory
    with open(log, "w") as sink:
        return subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_agents(agents: list[subprocess.Popen[bytes]], timeout: float) -> list[int]:
    codes = []
    try:
        for agent in agents:
            codes.append(agent.wait(timeout=timeout))
    except subprocess.TimeoutExpired:
        codes.append(-999)
    finally:
        for agent in agents:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()
    return codes


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _start_agents(name: str, root: Path, out: Path, checkpoint: str, kill: bool, shards: Path | None
                  ) -> tuple[list[subprocess.Popen[bytes]], list[Path], int]:  # fmt: skip
    """Node 0's agent first, and the others once it listens: node 0 then hosts the rendezvous
    store, so the loss of another node leaves the rendezvous standing."""
    port = _free_port()
    command = _agent_command(name, root, out, checkpoint, kill, port)
    logs = [root.parent / f"{root.name}-node{n}.log" for n in range(CONFIGS[name].nodes)]
    agents = [_start_agent(command, shards, "node-0", logs[0])]
    for _ in range(300):
        if _listening(port) or agents[0].poll() is not None:
            break
        time.sleep(0.05)
    agents += [_start_agent(command, shards, f"node-{n}", log) for n, log in enumerate(logs[1:], start=1)]
    return agents, logs, port


def _torchrun(name: str, root: Path, out: Path, checkpoint: str, kill: bool, shards: Path | None) -> tuple[int, str]:
    """One agent per simulated node, as a multi-node job starts; returns the worse exit status."""
    agents, logs, _ = _start_agents(name, root, out, checkpoint, kill, shards)
    codes = _wait_agents(agents, 240)
    text = "\n".join(f"--- node {n} ---\n{log.read_text()}" for n, log in enumerate(logs))
    return next((c for c in codes if c != 0), 0), text


def _launched_on_nodes(
    name: str, root: Path, out: Path, checkpoint: str, kill: bool, resume: bool, shards: Path | None
) -> tuple[int, str]:
    """A launch of one torchrun agent per simulated node; it resumes by itself (``resume`` is implied)."""
    return _torchrun(name, root, out, checkpoint, kill=kill, shards=shards)


def _lose_a_node(name: str, root: Path, out: Path, checkpoint: str, shards: Path | None) -> tuple[int, str]:
    """Node 1 stops at the kill step (its worker marks it); then its agent and worker are SIGKILLed, its
    snapshot directory deleted, and a new agent with an empty directory joins the restarted group."""
    agents, logs, port = _start_agents(name, root, out, checkpoint, True, shards)
    mark = root / "node-lost"
    deadline = time.monotonic() + 180
    while not mark.exists() and time.monotonic() < deadline and all(a.poll() is None for a in agents):
        time.sleep(0.05)
    if not mark.exists():
        codes = _wait_agents(agents, 1)
        return codes[0] or -998, "\n".join(log.read_text() for log in logs)
    time.sleep(0.2)  # the mark is written just before the worker stops itself
    lost = agents.pop(1)
    for pid in {int(p) for p in mark.read_text().split()} | {lost.pid}:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)  # the agent and the worker program lead process groups of their own
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    lost.wait()
    shutil.rmtree(root / "snapshots" / "node-1")
    replacement_log = root.parent / f"{root.name}-node1-replacement.log"
    agents.append(_start_agent(_agent_command(name, root, out, checkpoint, True, port), shards,
                               "node-1-replacement", replacement_log))  # fmt: skip
    codes = _wait_agents(agents, 240)
    logs.append(replacement_log)
    text = "\n".join(f"--- {log.name} ---\n{log.read_text()}" for log in logs)
    return next((c for c in codes if c != 0), 0), text


def _uninterrupted_run(
    go: Any, name: str, root: Path, out: Path, checkpoint: str, shards: Path | None
) -> tuple[int, str]:
    """The row's run without a kill, with ``checkpoint``'s callback: where the suite shares a folder
    (``shards``), made once per suite and copied to ``out`` for every test that needs it (a row's
    conformance test, its plain control, the column "ours against plain"), under a lock so that two
    workers never make it twice. The run is the same command wherever it is made; only its folder differs."""
    if shards is None:
        return go(name, root, out, checkpoint, kill=False, resume=False, shards=shards)
    cache = shards.parent / "uninterrupted-runs"
    cache.mkdir(parents=True, exist_ok=True)
    key = _training_key(name)
    made = cache / f"{key}-{checkpoint}.pt"
    with open(cache / f"{key}-{checkpoint}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if made.is_file():
            shutil.copyfile(made, out)
            return 0, f"(the uninterrupted run made earlier in this suite: {made})"
        rc, log = go(name, root, out, checkpoint, kill=False, resume=False, shards=shards)
        if rc == 0:
            partial = made.with_suffix(".partial")
            shutil.copyfile(out, partial)
            os.replace(partial, made)
        return rc, log


HOW_INTERRUPTED = ("kill_at", "kill_after_micro_batches", "interrupt", "lose_node", "damage_newest_snapshot",
                   "snapshot_in_line", "same_training_as", "what")  # fmt: skip
"""Fields that say how a row is interrupted or how its snapshots commit, not what it trains."""


def _training_key(name: str) -> str:
    """The name a row's uninterrupted run is made under: its own, or the row it trains alike with
    (``same_training_as``), which must then differ from it only in how it is interrupted."""
    other = CONFIGS[name].same_training_as
    if other is None:
        return name
    blank = {field: getattr(conformance_job.Config, field, None) for field in HOW_INTERRUPTED}
    mine, theirs = (dataclasses.replace(CONFIGS[n], **blank) for n in (name, other))
    if mine != theirs:
        raise AssertionError(f"{name} is marked same_training_as={other!r}, but trains differently: {mine} != {theirs}")
    return other


def has_plain_control(name: str) -> bool:
    """Whether the row runs with plain ``ModelCheckpoint`` too. Not after SIGTERM: plain Lightning exits 0
    there, so torchrun would not restart it. Nor with a snapshot interval of the row's own:
    ModelCheckpoint has no snapshots, so its run would be the same as the default ("auto") rows'."""
    config = CONFIGS[name]
    return config.interrupt != "SIGTERM" and not isinstance(config.snapshot_every, int)


def run_protocol(name: str, checkpoint: str, tmp: Path, shards: Path | None = None) -> Outcome:
    """Reference, killed, resumed; the outcome names the first difference from the reference.

    The reference is the user's own uninterrupted run, with plain ``ModelCheckpoint``, wherever the row
    has a plain control: a resume with ``ManifestCheckpoint`` passes only if it continues to what the
    user's script computes without this package (which also needs the uninterrupted runs with and
    without it to be bitwise equal: the conformance table's fourth column). Rows without one compare
    with ``ManifestCheckpoint``'s own uninterrupted run.

    ``shards``: where library streams' shard files are written once and read by every run (the
    suite shares one folder), else beside the runs in ``tmp``.
    """
    config = CONFIGS[name]
    if config.nodes > 1:
        return _run_elastic_protocol(name, checkpoint, tmp, shards)
    go = _cli_launched if config.cli else _launched if config.devices > 1 else _forked
    outcome = Outcome(name, checkpoint)
    reference, resumed = tmp / f"{checkpoint}-reference.pt", tmp / f"{checkpoint}-resumed.pt"
    against = "plain" if has_plain_control(name) else checkpoint
    rc, log = _uninterrupted_run(go, name, tmp / f"{against}-reference", reference, against, shards)
    if rc != 0:
        outcome.error, outcome.log = f"reference run exited {rc}: {_tail(log)}", log
        return outcome
    root = tmp / f"{checkpoint}-interrupted"
    first = tmp / f"{checkpoint}-first-attempt.pt"
    outcome.killed_rc, log = go(name, root, first, checkpoint, kill=True, resume=False, shards=shards)
    if outcome.killed_rc != interrupted_exit_status(name):
        outcome.error = f"interrupted run exited {outcome.killed_rc}, not {interrupted_exit_status(name)}: {_tail(log)}"
        outcome.log = log
        return outcome
    if config.stop is not None:
        outcome.stopped_at_step = torch.load(first, weights_only=False)["step"]
    rc, log = go(name, root, resumed, checkpoint, kill=False, resume=True, shards=shards)
    outcome.log = log
    if rc != 0:
        outcome.error = f"resumed run exited {rc}: {_tail(log)}"
        return outcome
    # A finished run's rerun is judged against the state it stopped with, which the uninterrupted
    # run (the same command) has left behind only after the rest of its epoch's end.
    _judged(outcome, first if config.finished_rerun else reference, resumed)
    if config.finished_rerun and outcome.trained_batches:
        outcome.differences.insert(0, f"the rerun trained {outcome.trained_batches} batch(es) after the run had"
                                      f" stopped at step {outcome.stopped_at_step}")  # fmt: skip
    outcome.inexact_lineage = _lineage_marks(root / "checkpoints", outcome.resumed_from_step or 0)
    return outcome


def uninterrupted_against_plain(name: str, tmp: Path, shards: Path | None = None) -> list[str]:
    """The conformance column "uninterrupted, ours against plain Lightning": the row's run without any
    kill, once with ``ManifestCheckpoint`` at the row's settings and once with ``ModelCheckpoint``; every
    difference in what training computed (weights, optimizer and scheduler state, step, epoch, the
    epochs' logged metrics). Callback states differ by design (two different callbacks) and are not compared."""
    config = CONFIGS[name]
    go = _cli_launched if config.cli else _launched if config.devices > 1 else _forked
    outputs = {}
    for checkpoint in ("field", "plain"):
        out, root = tmp / f"{checkpoint}-uninterrupted.pt", tmp / f"{checkpoint}-uninterrupted"
        launch = _launched_on_nodes if config.nodes > 1 else go
        rc, log = _uninterrupted_run(launch, name, root, out, checkpoint, shards)
        if rc != 0:
            return [f"the uninterrupted {checkpoint} run exited {rc}: {_tail(log)}"]
        outputs[checkpoint] = torch.load(out, weights_only=False)
    ours, plain = ({**run, "callbacks": {}} for run in (outputs["field"], outputs["plain"]))
    return compare(plain, ours)


def interrupted_exit_status(name: str) -> int:
    """How the first attempt ends: -9 for a SIGKILL, 75 for a preemption save, 0 for a stop, 1 for
    Ctrl-C (Lightning's graceful KeyboardInterrupt exits 1) or an exception in the user's code."""
    config = CONFIGS[name]
    if config.stop is not None:
        return 0
    if config.interrupt == "SIGINT" or config.fault is not None:
        return 1
    return 75 if config.interrupt == "SIGTERM" else -9


def _run_elastic_protocol(name: str, checkpoint: str, tmp: Path, shards: Path | None) -> Outcome:
    """Reference launch; then a launch whose rank 1 is SIGKILLed once and which torchrun restarts, or
    (``lose_node``) one that loses node 1 (agent, worker, snapshot directory) and goes on with a new,
    empty node in its place, which torchrun's restarted group takes in."""
    outcome = Outcome(name, checkpoint)
    reference, resumed = tmp / f"{checkpoint}-reference.pt", tmp / f"{checkpoint}-resumed.pt"
    where = tmp / f"{checkpoint}-reference"
    rc, log = _uninterrupted_run(_launched_on_nodes, name, where, reference, checkpoint, shards)
    if rc != 0:
        outcome.error, outcome.log = f"reference launch exited {rc}: {_tail(log)}", log
        return outcome
    root = tmp / f"{checkpoint}-interrupted"
    config = CONFIGS[name]
    if config.lose_node:
        rc, outcome.log = _lose_a_node(name, root, resumed, checkpoint, shards)
        outcome.killed_rc = -9 if (root / "node-lost").exists() else None
        restarted = True  # the new node's log says so: the resume is judged below
    else:
        rc, outcome.log = _torchrun(name, root, resumed, checkpoint, kill=True, shards=shards)
        # The agent's own account of how the interrupted worker (its pid is in the mark) ended.
        mark = root / "killed"
        ended = dict(
            (int(pid), int(code))
            for code, pid in re.findall(r"failed \(exitcode: (-?\d+)\) local_rank: \d+ \(pid: (\d+)\)", outcome.log)
        )
        outcome.killed_rc = ended.get(int(mark.read_text())) if mark.exists() else None
        restarted = len(list(root.glob("started-*"))) == 2 * config.nodes * config.devices
    if outcome.killed_rc is None:
        outcome.error = f"no worker or node of the first attempt was interrupted: {_tail(outcome.log)}"
    elif not restarted:
        outcome.error = f"torchrun did not restart the group: {_tail(outcome.log)}"
    elif rc != 0:
        outcome.error = f"the restarted launch exited {rc}: {_tail(outcome.log)}"
    if outcome.error:
        return outcome
    return _judged(outcome, reference, resumed)


def _judged(outcome: Outcome, reference: Path, resumed: Path) -> Outcome:
    expected, got = torch.load(reference, weights_only=False), torch.load(resumed, weights_only=False)
    outcome.resumed_from_step = got["start_step"]
    outcome.trained_batches = got.get("batches_trained")
    if CONFIGS[outcome.name].finished_rerun:  # what training changes; a stopped run's epoch end is not training
        expected = {**expected, "epoch": got["epoch"], "callbacks": got["callbacks"], "epoch_metrics": {}}
        got = {**got, "epoch_metrics": {}}
    outcome.differences = compare(expected, got)
    return outcome


def _lineage_marks(checkpoints: Path, after_step: int) -> list[bool]:
    """For each checkpoint newer than ``after_step`` with a manifest: whether it records that its lineage
    is not exact against an uninterrupted run (an allowed Trainer-setting change or an inexact resume)."""
    from lightning_field.core.manifest import MANIFEST_NAME, read_manifest

    marks = []
    for path in sorted(checkpoints.iterdir()) if checkpoints.is_dir() else []:
        if (path / MANIFEST_NAME).is_file() and (manifest := read_manifest(path)).step > after_step:
            marks.append(bool(manifest.provenance.get("changed_settings") or manifest.provenance.get("inexact_resume")))
    return marks


def compare(expected: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """Every difference between a reference and a resumed run, most telling first."""
    found: list[str] = []
    for key in ("step", "epoch"):
        if expected[key] != got[key]:
            found.append(f"{key}: {got[key]} != {expected[key]} (reference)")
    for key in ("state_dict", "optimizers", "schedulers", "callbacks"):
        found += _differences(expected[key], got[key], key)
    for epoch, metrics in sorted(got["epoch_metrics"].items()):
        reference = expected["epoch_metrics"].get(epoch)
        if reference is None:
            found.append(f"epoch_metrics[{epoch}]: the reference closed no such epoch")
            continue
        for metric in sorted(set(metrics) | set(reference)):
            a, b = reference.get(metric), metrics.get(metric)
            if a != b:
                found.append(f"epoch_metrics[{epoch}].{metric}: {b} != {a} (reference)")
    return found


def _differences(a: Any, b: Any, path: str) -> list[str]:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = (
            isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
            and torch.equal(a, b)
        )
        if same:
            return []
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape:
            return [f"{path}: max |Δ| = {(a.double() - b.double()).abs().max().item():.3g}"]
        return [f"{path}: {b!r} != {a!r}"]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(map(str, b))} != {sorted(map(str, a))}"]
        return [d for k in a for d in _differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path}: length {len(b)} != {len(a)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _differences(x, y, f"{path}[{i}]")]
    if a != b and not (isinstance(a, float) and isinstance(b, float) and a != a and b != b):  # NaN == NaN here
        return [f"{path}: {b!r} != {a!r}"]
    return []


def _tail(log: str, lines: int = 12) -> str:
    return "\n".join(log.strip().splitlines()[-lines:])


def _cell(
    outcome: Outcome | None, refused_reason: str | None = None, changed: str | None = None, allowed: str | None = None
) -> str:
    if outcome is None:
        return "not run"
    stopped, trained = outcome.stopped_at_step, outcome.trained_batches
    if CONFIGS[outcome.name].finished_rerun and outcome.exact:
        return f"**nothing to do**: no step trained, the state stopped at step {stopped} as it was"
    if CONFIGS[outcome.name].finished_rerun and trained:
        return f"trains on: {trained} more batch(es) after the run had stopped at step {stopped}"
    if allowed is not None and outcome.error is None and allowed in outcome.log and all(outcome.inexact_lineage):
        return f"resumes, **marked inexact** in every later manifest: `{allowed}`"
    if outcome.exact:
        return "exact, bitwise"
    if refused_reason is not None and outcome.error is not None and refused_reason in outcome.log:
        return f"**refused**: not recoverable ({refused_reason})"
    if changed is not None and outcome.error is not None and changed in outcome.log:
        return f"**refused** before training: `{changed}`"
    if outcome.differences:
        return "diverges: " + outcome.differences[0].replace("state_dict.", "").replace("|Δ|", "Δ")
    return outcome.summary()


def main() -> None:
    """Print the README's conformance table from fresh runs (takes minutes):
    ``cd tests && python conformance.py [NAME ...]``."""
    import tempfile

    from test_conformance import ALLOWED, CHANGED, REFUSED

    names = sys.argv[1:] or list(CONFIGS)
    print("| configuration | plain Lightning (`ModelCheckpoint`) | lightning_field (`ManifestCheckpoint`)"
          " | uninterrupted, ours against plain |")
    print("|---|---|---|---|")
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            field_outcome = run_protocol(name, "field", Path(tmp))
            # As the plain suite: none after SIGTERM (plain Lightning exits 0, nothing restarts it), none
            # for a snapshot interval of the row's own (ModelCheckpoint has none: the default rows' run).
            plain_runs = has_plain_control(name)
            plain = run_protocol(name, "plain", Path(tmp)) if plain_runs else None
            invisible = _invisible_cell(uninterrupted_against_plain(name, Path(tmp))) if plain_runs else "not run"
        cell = _cell(field_outcome, REFUSED.get(name), CHANGED.get(name), ALLOWED.get(name))
        print(f"| `{name}`: {CONFIGS[name].what} | {_cell(plain)} | {cell} | {invisible} |", flush=True)


def _invisible_cell(differences: list[str]) -> str:
    if not differences:
        return "bitwise equal"
    return "differs: " + differences[0].replace("state_dict.", "").replace("|Δ|", "Δ")


if __name__ == "__main__":
    main()
