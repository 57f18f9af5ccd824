"""Soak test: SIGKILL a training job at random moments while it checkpoints, and check what survives.

The long version of ``tests/test_fault_injection.py``'s kill test. Each trial starts a real child
process (this file with ``--child``, in its own session) that trains the demo model with a ~26 MB
state and saves a ``ManifestCheckpoint`` at every step with ``save_top_k=1``, so every step also
removes the previous checkpoint and kills land in removals too. Trials alternate between
``save_last=True`` (the CI test's configuration, where "last" is an alias that moves with each save)
and ``save_last=False``. Once the first checkpoint is committed, the parent waits a random time and
SIGKILLs the child's whole process group. Then it checks:

* every committed checkpoint (``committed_checkpoints``) has a readable manifest and verifies intact;
* ``latest_recoverable`` finds a checkpoint (one was committed before the kill, and an old one is only
  removed after a newer one commits), verification accepts it as recoverable, and its weights load;
* the ``LAST`` pointer, when present, names a committed checkpoint that verifies intact;
* the child really died of the SIGKILL (not of an error of its own first).

It counts the trials that left a hidden ``.tmp-*`` directory (killed in the middle of writing a
checkpoint) and ``.trash-*`` (killed in the middle of removing one), prints one summary line, and
exits 1 if any check failed (the failing trials' directories are kept and named).

Usage::

    python benchmarks/kill_during_save_soak.py [--trials 200] [--seed 20261130] [--dir PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

CHECKPOINT_DIR = "checkpoints"


def child_main(root: Path, hidden: int, seed: int, save_last: bool) -> None:
    """The training job: a checkpoint at every step until it is killed."""
    import warnings

    warnings.filterwarnings("ignore")
    import lightning.pytorch as pl
    import torch

    from lightning_field import ManifestCheckpoint
    from lightning_field.workloads.demo import DemoDataModule, DemoRegressor

    torch.set_num_threads(1)
    pl.seed_everything(seed, verbose=False)
    checkpoint = ManifestCheckpoint(
        dirpath=root / CHECKPOINT_DIR, every_n_train_steps=1, save_top_k=1, save_last=save_last
    )
    trainer = pl.Trainer(
        default_root_dir=root,
        max_steps=1_000_000,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=[checkpoint],
    )
    trainer.fit(DemoRegressor(hidden=hidden), datamodule=DemoDataModule(size=64))
    print("CHILD FINISHED WITHOUT BEING KILLED", flush=True)


@dataclass
class Trial:
    index: int
    delay: float
    save_last: bool
    violations: list[str] = field(default_factory=list)
    tmp_left: bool = False
    trash_left: bool = False
    committed: int = 0
    latest: str | None = None
    latest_step: int | None = None
    seconds: float = 0.0


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def log_tail(path: Path, n: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"


def run_trial(index: int, root: Path, delay: float, save_last: bool, hidden: int, start_timeout: float) -> Trial:
    from lightning_field.checkpoint import committed_checkpoints

    trial = Trial(index, delay, save_last)
    started = time.monotonic()
    root.mkdir(parents=True)
    ckpts = root / CHECKPOINT_DIR
    log = root / "child.log"
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        str(root),
        "--hidden",
        str(hidden),
        "--seed",
        str(index),
        "--save-last",
        str(int(save_last)),
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + start_timeout
        while not committed_checkpoints(ckpts):
            if proc.poll() is not None:
                trial.violations.append(
                    f"child exited ({proc.returncode}) before its first checkpoint: {log_tail(log)}"
                )
                return trial
            if time.monotonic() > deadline:
                trial.violations.append(f"no checkpoint committed within {start_timeout:.0f}s: {log_tail(log)}")
                return trial
            time.sleep(0.005)
        time.sleep(delay)
        if proc.poll() is not None:
            trial.violations.append(f"child exited ({proc.returncode}) before the kill: {log_tail(log)}")
    finally:
        kill_group(proc)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            trial.violations.append("child did not die within 30s of SIGKILL")
    if not trial.violations and proc.returncode != -signal.SIGKILL:
        trial.violations.append(f"child exit status {proc.returncode}, expected -SIGKILL: {log_tail(log)}")
    check(trial, ckpts)
    trial.seconds = time.monotonic() - started
    return trial


def check(trial: Trial, ckpts: Path) -> None:
    from lightning_field import latest_recoverable, load_weights, verify_checkpoint
    from lightning_field.checkpoint import committed_checkpoints, read_last_pointer

    names = [p.name for p in ckpts.iterdir()] if ckpts.is_dir() else []
    trial.tmp_left = any(n.startswith(".tmp-") for n in names)
    trial.trash_left = any(n.startswith(".trash-") for n in names)
    entries = committed_checkpoints(ckpts)
    trial.committed = len(entries)
    intact = set()
    for entry in entries:
        if entry.manifest is None:
            trial.violations.append(f"committed {entry.path.name} has an unreadable manifest: {entry.error}")
            continue
        report = verify_checkpoint(entry.path)
        if report.intact:
            intact.add(entry.path.name)
        else:
            trial.violations.append(f"committed {entry.path.name} fails verification: {report.problems}")
    latest = latest_recoverable(ckpts)
    if latest is None:
        trial.violations.append(
            f"latest_recoverable found nothing although a checkpoint was committed; dir: {sorted(names)}"
        )
    else:
        trial.latest = latest.name
        report = verify_checkpoint(latest)
        if not report.recoverable:
            trial.violations.append(
                f"latest_recoverable returned {latest.name}, which verification rejects: {report.problems}"
            )
        else:
            trial.latest_step = report.manifest.step if report.manifest else None
            try:
                load_weights(latest)
            except Exception as err:  # any failure to load the advertised checkpoint is a violation
                trial.violations.append(f"weights of {latest.name} do not load: {type(err).__name__}: {err}")
    pointer = read_last_pointer(ckpts)
    if pointer is not None and pointer.name not in intact:
        trial.violations.append(
            f"LAST names {pointer.name}, which is not a committed intact checkpoint; dir: {sorted(names)}"
        )


def default_parent() -> Path:
    tmp = Path(tempfile.gettempdir())
    return tmp if tmp.stat().st_dev == Path.cwd().stat().st_dev else Path.cwd()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--seed", type=int, default=20261130, help="seeds the kill delays (and each child's training)")
    p.add_argument(
        "--max-delay", type=float, default=1.0, help="kill uniformly within this many seconds after the first commit"
    )
    p.add_argument("--hidden", type=int, default=120_000, help="demo model width; 120000 gives a ~26 MB state")
    p.add_argument(
        "--start-timeout", type=float, default=180.0, help="seconds a child may take to commit its first checkpoint"
    )
    p.add_argument("--dir", type=Path, default=None, help="where to run (default: a temp dir on this filesystem)")
    p.add_argument("--verbose", action="store_true", help="one line per trial")
    p.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--save-last", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        child_main(args.child, args.hidden, args.seed, bool(args.save_last))
        return 0

    import logging

    logging.getLogger("lightning_field").setLevel(logging.ERROR)  # skipped-checkpoint warnings are counted instead
    parent = args.dir if args.dir is not None else default_parent()
    parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="kill-soak-", dir=parent))
    rng = random.Random(args.seed)
    print(
        f"kill-during-save soak: {args.trials} trials, kill within {args.max_delay}s of the first commit,"
        f" hidden={args.hidden}, seed={args.seed}, under {workdir}, load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    started = time.monotonic()
    trials: list[Trial] = []
    kept: list[Path] = []
    try:
        for i in range(args.trials):
            root = workdir / f"trial{i:04d}"
            trial = run_trial(i, root, rng.uniform(0.0, args.max_delay), i % 2 == 0, args.hidden, args.start_timeout)
            trials.append(trial)
            if trial.violations:
                kept.append(root)
                print(
                    f"trial {i + 1} ({root.name}): VIOLATION (kept {root}):\n  " + "\n  ".join(trial.violations),
                    flush=True,
                )
            else:
                shutil.rmtree(root, ignore_errors=True)
            if args.verbose or (i + 1) % 20 == 0 or trial.violations:
                print(
                    f"trial {i + 1}/{args.trials} (save_last={trial.save_last}): killed {trial.delay:.3f}s after"
                    f" first commit, latest step"
                    f" {trial.latest_step}, committed {trial.committed}, .tmp {'yes' if trial.tmp_left else 'no'},"
                    f" .trash {'yes' if trial.trash_left else 'no'}, {trial.seconds:.1f}s"
                    f"  [{sum(t.tmp_left for t in trials)} mid-save so far, {time.monotonic() - started:.0f}s]",
                    flush=True,
                )
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    finally:
        if not kept:
            shutil.rmtree(workdir, ignore_errors=True)
    bad = [t for t in trials if t.violations]
    mid_save = sum(t.tmp_left for t in trials)
    mid_remove = sum(t.trash_left for t in trials)
    by_last = {flag: sum(t.tmp_left for t in trials if t.save_last == flag) for flag in (True, False)}
    steps = [t.latest_step for t in trials if t.latest_step is not None]
    verdict = "PASS" if not bad and len(trials) == args.trials else "FAIL"
    print(
        f"SOAK {verdict}: {len(trials)}/{args.trials} trials, {len(bad)} with violations;"
        f" {mid_save} killed mid-save (.tmp-* left: {by_last[True]} with save_last, {by_last[False]} without),"
        f" {mid_remove} mid-removal (.trash-* left);"
        f" latest recoverable step median {sorted(steps)[len(steps) // 2] if steps else '-'}"
        f" (max {max(steps) if steps else '-'}); {time.monotonic() - started:.0f}s"
        + (f"; failing trials kept under {workdir}" if kept else ""),
        flush=True,
    )
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
