"""One answer to "which rank am I" before a process group exists: the variables every launcher sets, read in
Lightning's order, with a node rank counted where only a local rank is known."""

from __future__ import annotations

import pytest

from lightning_field.core.distributed import global_rank
from lightning_field.core.launcher_env import RANK_VARIABLES, env_global_rank
from lightning_field.integrations.wandb_identity import env_global_zero

LAUNCH_VARIABLES = (*RANK_VARIABLES, "NODE_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE")


@pytest.mark.parametrize(
    ("env", "rank"),
    [
        ({}, 0),
        ({"RANK": "3", "LOCAL_RANK": "1", "NODE_RANK": "1"}, 3),  # RANK is global: nothing else counts
        ({"RANK": "0", "LOCAL_RANK": "1"}, 0),
        ({"LOCAL_RANK": "1"}, 1),  # a process Lightning's DDP launcher started
        ({"LOCAL_RANK": "2", "SLURM_PROCID": "0"}, 2),  # one SLURM task launching several local ranks
        ({"SLURM_PROCID": "5"}, 5),
        ({"JSM_NAMESPACE_RANK": "4"}, 4),
        ({"LOCAL_RANK": "0", "NODE_RANK": "1"}, 1),  # node 1's first process
        ({"LOCAL_RANK": "1", "NODE_RANK": "2", "LOCAL_WORLD_SIZE": "4"}, 9),
        ({"LOCAL_RANK": "0", "GROUP_RANK": "1", "LOCAL_WORLD_SIZE": "8"}, 8),
        ({"NODE_RANK": "1"}, 1),
    ],
)
def test_the_global_rank_comes_from_the_launchers_environment(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], rank: int
) -> None:
    for key in LAUNCH_VARIABLES:
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert env_global_rank() == rank
    assert global_rank() == rank  # no process group in this test process
    assert env_global_zero() is (rank == 0)
