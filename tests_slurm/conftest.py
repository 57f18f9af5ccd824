"""The SLURM tier: real ``sbatch`` jobs on the one-node cluster that ``.ci/slurm`` starts on loopback.

Not part of ``pytest tests`` (its own folder, its own step in ``.ci/run``): it needs root and the
SLURM daemons. Run it with ``bash .ci/slurm && pytest -q -p no:cacheprovider tests_slurm``; where no
cluster answers, its fixture runs ``.ci/slurm`` and fails with its reason if that cannot start one.

The jobs are ``tests/jobs/slurm_job.py`` submitted with the batch script that ``docs/slurm.md``
shows (read from that page, so the documented script is the one these tests run).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "tests" / "jobs" / "slurm_job.py"
DOC = ROOT / "docs" / "slurm.md"
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"}
#: The venv's interpreter (or the one running pytest): what the batch script runs as $PYTHON.
PYTHON = str(Path(os.environ["VIRTUAL_ENV"]) / "bin" / "python") if "VIRTUAL_ENV" in os.environ else sys.executable


def sh(*argv: str, timeout: float = 30) -> str:
    """Run a SLURM command; its stdout, or the test fails with its stderr."""
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()}"
    return result.stdout


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def documented_batch_script(name: str) -> str:
    """The block of docs/slurm.md marked ``<!-- slurm-tier: NAME -->``, as a user copies it."""
    text = DOC.read_text()
    match = re.search(rf"<!-- slurm-tier: {re.escape(name)} -->\s*```bash\n(.*?)```", text, re.S)
    assert match, f"docs/slurm.md lost its {name} block (marked <!-- slurm-tier: {name} -->)"
    return match.group(1)


class Job:
    """One submitted batch job and the run directory its attempts share."""

    def __init__(self, job_id: str, root: Path) -> None:
        self.id = job_id
        self.root = root

    def fields(self) -> dict[str, str]:
        """``scontrol show job``'s fields (finished jobs stay listed for MinJobAge, 600 s)."""
        out = sh("scontrol", "show", "job", "--oneliner", self.id)
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def state(self) -> str:
        return self.fields()["JobState"]

    def restarts(self) -> int:
        return int(self.fields()["Restarts"])

    def output(self) -> str:
        log = self.root / "slurm.out"
        return log.read_text() if log.exists() else "(no output yet)"

    def wait_reached(self, restart: int = 0, timeout: float = 90) -> int:
        """Wait until the attempt is in its slow steps; the step it had reached."""
        marker = self.root / f"reached-{restart}"
        try:
            wait_for(marker.exists, timeout, f"job {self.id} attempt {restart} to reach its slow steps")
        except AssertionError as error:
            raise AssertionError(f"{error}; state {self.state()}; output:\n{self.output()[-3000:]}") from None
        return int(marker.read_text())

    def wait_requeued(self, timeout: float = 45) -> dict[str, str]:
        """Wait until SLURM has requeued the job (pending again, one restart counted); its fields."""

        def requeued() -> bool:
            fields = self.fields()
            return fields["JobState"] == "PENDING" and int(fields["Restarts"]) >= 1

        try:
            wait_for(requeued, timeout, f"job {self.id} to be requeued")
        except AssertionError as error:
            raise AssertionError(f"{error}; fields {self.fields()}; output:\n{self.output()[-3000:]}") from None
        return self.fields()

    def release_requeued(self, timeout: float = 45) -> None:
        """Once SLURM holds the requeued job back (pending, its begin time set ``cred_expire`` + 1 =
        121 s ahead, as slurmctld does to every requeued job), make it eligible now so the tier stays
        short. Not at once: slurmd revokes the killed attempt's credentials by the second, and a launch
        credential issued in that same second is refused ("Job credential revoked": the job ends FAILED)."""
        self.wait_requeued(timeout)
        time.sleep(2)
        sh("scontrol", "update", f"JobId={self.id}", "StartTime=now")

    def wait_finished(self, timeout: float = 120) -> str:
        try:
            wait_for(lambda: self.state() in FINAL_STATES, timeout, f"job {self.id} to finish")
        except AssertionError as error:
            raise AssertionError(f"{error}; fields {self.fields()}; output:\n{self.output()[-3000:]}") from None
        return self.state()

    def attempts(self) -> list[dict[str, int]]:
        lines = (self.root / "attempts.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]

    def final_weights(self) -> dict[str, torch.Tensor]:
        path = self.root / "final.pt"
        assert path.exists(), f"job {self.id} saved no final weights; output:\n{self.output()[-3000:]}"
        return torch.load(path, weights_only=True)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[str]:
    """The cluster's only node, idle; started by ``.ci/slurm`` where nothing answers yet."""
    if shutil.which("sinfo") is None or "idle" not in _node_states():
        result = subprocess.run(["bash", str(ROOT / ".ci" / "slurm")], capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            pytest.fail(f"the SLURM tier needs a cluster, and .ci/slurm could not start one: {result.stderr.strip()}")
    node = sh("sinfo", "-h", "-o", "%n").split()[0]
    yield node


def _node_states() -> str:
    result = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=30)
    return result.stdout if result.returncode == 0 else ""


@pytest.fixture(scope="session")
def batch_scripts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """docs/slurm.md's batch scripts, written out by name into one folder."""
    folder = tmp_path_factory.mktemp("sbatch")
    for name in ("train.sbatch", "train-srun.sbatch"):
        (folder / name).write_text(documented_batch_script(name))
    return folder


@pytest.fixture(scope="session")
def job_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """slurm_job.py, copied out of this repository as a user's script lives: outside it, a commit
    made here while a job waits in the queue (another checkout's work) changes no job's code identity."""
    path = tmp_path_factory.mktemp("user-code") / JOB.name
    shutil.copy(JOB, path)
    return path


@pytest.fixture(scope="session")
def submit(slurm_cluster: str, batch_scripts: Path, job_script: Path) -> Iterator[Callable[..., Job]]:
    """``submit(root, *job_args, signal=..., script=...)``: sbatch a documented script running slurm_job.py."""
    jobs: list[Job] = []

    def _submit(root: Path, *job_args: str, signal: str = "B:USR1@60", script: str = "train.sbatch") -> Job:
        root.mkdir(parents=True, exist_ok=True)
        out = sh(
            "sbatch",
            "--parsable",
            f"--signal={signal}",
            f"--output={root / 'slurm.out'}",
            f"--chdir={root}",
            f"--export=ALL,PYTHON={PYTHON}",
            str(batch_scripts / script),
            str(job_script),
            "--root",
            str(root),
            *job_args,
        )
        job = Job(out.strip().split(";")[0], root)
        jobs.append(job)
        return job

    yield _submit
    for job in jobs:  # nothing a failed test left queued or running keeps the node busy afterwards
        subprocess.run(["scancel", job.id], capture_output=True, timeout=30)


@pytest.fixture(scope="session")
def uninterrupted(submit: Callable[..., Job], tmp_path_factory: pytest.TempPathFactory) -> Callable[[], Job]:
    """The same job, submitted once per session at first use, never signalled: the control every
    interrupted run's final weights must equal bit for bit. Returned unfinished so it runs alongside."""
    job: list[Job] = []

    def _get() -> Job:
        if not job:
            job.append(submit(tmp_path_factory.mktemp("uninterrupted")))
        return job[0]

    return _get
