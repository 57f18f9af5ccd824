"""A process's rank from its launcher's environment alone, with no torch import: the console
scripts that never join a process group (``field``, ``field-evidence``) read it too."""

from __future__ import annotations

import os
from collections.abc import Mapping

RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")
"""Where launchers put a process's rank, in the order Lightning's ``rank_zero_only`` reads them."""


def env_global_rank() -> int:
    """This process's global rank from the launcher's environment alone: before a process group (or
    the Trainer) exists, or in a process that never joins one.

    ``RANK`` (torchrun, this package's launchers) is the global rank. Without it the first of
    ``LOCAL_RANK``, ``SLURM_PROCID`` and ``JSM_NAMESPACE_RANK`` that is set counts, as Lightning reads
    them: its DDP launcher sets ``LOCAL_RANK`` in the processes it starts and nothing in rank 0's own,
    and ``LOCAL_RANK`` comes before ``SLURM_PROCID`` because one SLURM task can launch several local
    ranks. A node rank (``NODE_RANK`` / ``GROUP_RANK``) counts then: node 1's first process has
    ``LOCAL_RANK=0``. Its rank is offset by the node times the local world size (``LOCAL_WORLD_SIZE``,
    at least the local rank + 1), which is exact where that variable is set and never 0 off node 0.
    """
    values = {key: os.environ.get(key) for key in RANK_VARIABLES}
    if values["RANK"] is not None:
        return int(values["RANK"])
    local = next((int(value) for value in values.values() if value is not None), 0)
    node = int(os.environ.get("NODE_RANK") or os.environ.get("GROUP_RANK") or 0)
    if node == 0:
        return local
    local_world = max(int(os.environ.get("LOCAL_WORLD_SIZE") or 0), local + 1)
    return node * local_world + local


RESTART_VARIABLES = ("SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT")
"""Where launchers count a job's restarts: SLURM's requeues, torchrun's worker-group restarts."""


def restart_of(environ: Mapping[str, str]) -> str | None:
    """Why this process is a restart of a job that ran before (``SLURM_RESTART_COUNT=2``), else None.

    A restart that finds nothing to resume has usually lost its run directory (one made anew per
    attempt, as a timestamped Hydra run directory is), not its checkpoints: the caller says so.
    """
    for name in RESTART_VARIABLES:
        value = environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return f"{name}={value}"
    return None


def job_identity(environ: Mapping[str, str]) -> str | None:
    """The scheduler job this process runs in, kept across its restarts: a SLURM job (an array task is
    its own job) or a torchrun agent's run id; None where no launcher says.

    An attempt that is a restart (:func:`restart_of`) of the same job continues that job's run even
    where it found nothing to resume: its lost work is the run's restart loss, not a new run.
    """
    if environ.get("SLURM_ARRAY_JOB_ID") and environ.get("SLURM_ARRAY_TASK_ID"):
        return f"slurm:{environ['SLURM_ARRAY_JOB_ID']}_{environ['SLURM_ARRAY_TASK_ID']}"
    if environ.get("SLURM_JOB_ID"):
        return f"slurm:{environ['SLURM_JOB_ID']}"
    if environ.get("TORCHELASTIC_RUN_ID"):
        return f"torchelastic:{environ['TORCHELASTIC_RUN_ID']}"
    return None
