"""Preemption and requeue under a real SLURM (slurmctld, slurmd, munge on loopback; ``.ci/slurm``).

Every job is ``tests/jobs/slurm_job.py`` (Lightning's BoringModel, a plain shuffled DataLoader of 24
batches, 80 steps) submitted with one of docs/slurm.md's batch scripts. "Exact" means the requeued job's final
weights equal, bit for bit, those of the same job that SLURM ran without interruption.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import torch
from conftest import Job, sh, wait_for

MAX_STEPS = 80


def differing(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    assert a.keys() == b.keys()
    return [key for key in a if not torch.equal(a[key], b[key])]


def preempted_step(job: Job) -> int:
    """The step of the save at the signal; the requeued attempt must have loaded that checkpoint."""
    match = re.search(r"Preempted \(SIGUSR1\): saved recoverable checkpoint (\S+) at step (\d+)", job.output())
    assert match, f"job {job.id} printed no preemption save:\n{job.output()[-3000:]}"
    events = [json.loads(line) for line in (job.root / "field" / "events.jsonl").read_text().splitlines()]
    loads = [(e["attempt"], e["payload"]["path"]) for e in events if e["event"] == "ckpt_load"]
    # The message names the .ckpt the callback advertises; the event, the checkpoint folder behind it (since
    # retired: a newer checkpoint committed after the resume).
    assert loads == [(2, match.group(1).removesuffix(".ckpt"))], loads
    return int(match.group(2))


def test_sigusr1_saves_at_the_signal_requeues_itself_and_the_requeued_job_resumes_bitwise_exactly(
    submit: Callable[..., Job], uninterrupted: Callable[[], Job], tmp_path: Path
) -> None:
    """``sbatch --requeue --signal=B:USR1@60``; mid-run ``scancel --batch --signal=USR1`` (what SLURM
    sends before the time limit). ManifestCheckpoint saves at the step reached, runs ``scontrol
    requeue`` itself (Lightning's auto-requeue is on under SLURM), and the job's next start resumes at
    that step and ends with the uninterrupted job's weights. Control, in the same SLURM, the same
    signal: plain Lightning (ModelCheckpoint, its own SLURM handler) saves ``hpc_ckpt`` inside the
    signal handler, requeues, resumes from it mid-epoch with a plain loader, and ends elsewhere."""
    reference = uninterrupted()
    field = submit(tmp_path / "field", "--mode", "manifest")
    plain = submit(tmp_path / "plain", "--mode", "plain")

    reached = {}
    for job in (field, plain):
        reached[job.id] = job.wait_reached()
        sh("scancel", "--batch", "--signal=USR1", job.id)
    for job in (field, plain):
        job.release_requeued()
    for job in (reference, field, plain):
        assert job.wait_finished() == "COMPLETED", job.output()[-3000:]

    # The product: saved at the step the signal found, requeued by its own scontrol call ...
    step = preempted_step(field)
    assert reached[field.id] <= step < MAX_STEPS
    assert "DUE TO JOB REQUEUE" in field.output()
    assert field.restarts() == 1
    # ... and its next start (SLURM_RESTART_COUNT=1) began exactly there, and ended on the same weights.
    assert [(a["restart"], a["start_step"]) for a in field.attempts()] == [(0, 0), (1, step)]
    assert f"FINISHED at step {MAX_STEPS}" in field.output()
    assert differing(field.final_weights(), reference.final_weights()) == []

    # The control: Lightning's handler saved and requeued too, and its second start resumed mid-run ...
    assert "Handling auto-requeue signal" in plain.output()
    assert plain.restarts() == 1
    plain_attempts = plain.attempts()
    assert [a["restart"] for a in plain_attempts] == [0, 1]
    assert 0 < plain_attempts[1]["start_step"] < MAX_STEPS
    assert "your dataloader is not resumable" in plain.output()
    # ... on other batches than the uninterrupted run: the comparison above can fail.
    assert differing(plain.final_weights(), reference.final_weights()) != []


def test_sigterm_to_an_srun_step_saves_exits_75_and_the_batch_scripts_requeue_resumes_bitwise_exactly(
    submit: Callable[..., Job], uninterrupted: Callable[[], Job], tmp_path: Path
) -> None:
    """docs/slurm.md's ``srun`` script: ``scancel --signal=TERM`` reaches the step (python under srun),
    the product saves at the step reached and exits 75 without requeuing (SIGTERM is not Lightning's
    requeue signal), srun returns that 75, the script requeues on it, and the next start resumes
    there and ends on the uninterrupted job's weights."""
    reference = uninterrupted()
    field = submit(tmp_path / "field", "--mode", "manifest", signal="USR1@60", script="train-srun.sbatch")
    reached = field.wait_reached()
    sh("scancel", "--signal=TERM", field.id)
    field.release_requeued()
    assert field.wait_finished() == "COMPLETED", field.output()[-3000:]
    assert reference.wait_finished() == "COMPLETED", reference.output()[-3000:]

    match = re.search(r"Preempted \(SIGTERM\): saved recoverable checkpoint \S+ at step (\d+)", field.output())
    assert match, field.output()[-3000:]
    step = int(match.group(1))
    assert reached <= step < MAX_STEPS
    assert "srun exited 75" in field.output()  # the requeue was the script's, on the product's status
    assert field.restarts() == 1
    assert [(a["restart"], a["start_step"]) for a in field.attempts()] == [(0, 0), (1, step)]
    assert differing(field.final_weights(), reference.final_weights()) == []


def test_node_failure_without_warning_is_requeued_by_slurm_and_resumes_bitwise_exactly_from_the_last_commit(
    submit: Callable[..., Job], uninterrupted: Callable[[], Job], tmp_path: Path, slurm_cluster: str
) -> None:
    """A node failure: the node's slurmd, the job step's slurmstepd and the training process are
    SIGKILLed (no signal reaches the job, nothing is saved then) and the node is marked DOWN. SLURM
    requeues the ``--requeue`` job by itself; once the node is back (``.ci/slurm``, ReturnToService=2)
    the job's next start resumes from the newest committed checkpoint (past step 0) and ends on the
    uninterrupted job's weights."""
    reference = uninterrupted()  # finished first: a node failure takes down every job on the only node
    assert reference.wait_finished() == "COMPLETED", reference.output()[-3000:]
    field = submit(tmp_path / "field", "--mode", "manifest")
    reached = field.wait_reached()
    time.sleep(0.5)  # a few steps past the last periodic commit: lost, then trained again on resume
    pid = field.attempts()[0]["pid"]
    stepd = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])  # its parent
    assert "slurmstepd" in Path(f"/proc/{stepd}/cmdline").read_text()
    config = sh("scontrol", "show", "config")
    slurmd_pidfile = re.search(r"SlurmdPidFile\s*=\s*(\S+)", config)
    assert slurmd_pidfile, "scontrol show config names no SlurmdPidFile"
    slurmd = int(Path(slurmd_pidfile.group(1)).read_text())

    for victim in (slurmd, stepd, pid):  # the node's daemons first: nobody reports the job's end
        os.kill(victim, signal.SIGKILL)
    wait_for(lambda: not _alive(pid), 10, "the training process to die")
    sh("scontrol", "update", f"NodeName={slurm_cluster}", "State=DOWN", "Reason=simulated-node-failure")
    try:
        requeued = field.wait_requeued()
        print("requeued after the node failure:", {k: requeued[k] for k in ("Reason", "EligibleTime", "Restarts")})
    finally:  # the node comes back whatever happened: the daemon restarts, the node resumes
        restart = subprocess.run(["bash", str(Path(__file__).parent.parent / ".ci" / "slurm")], timeout=120)
        assert restart.returncode == 0, "the node did not come back after the simulated failure"
    time.sleep(3)
    field.release_requeued()
    assert field.wait_finished() == "COMPLETED", field.output()[-3000:]

    attempts = field.attempts()
    assert [a["restart"] for a in attempts] == [0, 1]
    resumed = attempts[1]["start_step"]
    assert 0 < resumed <= reached + 1, f"resumed at {resumed}, killed at or after {reached}"
    assert "Preempted" not in field.output()  # nothing was saved at the kill: the resume is a commit's
    assert differing(field.final_weights(), reference.final_weights()) == []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
