"""Two launcher agents on one machine (``torchrun --nnodes 2`` twice on a test box, ``Trainer(num_nodes=2)``)
train with ``ManifestCheckpoint`` at its defaults, as they do with plain Lightning.

Step snapshots live in a node-local folder (``/dev/shm``); two nodes on one host would share it, and
a replica there would be no second copy. Each node's folder is named for its node rank, and the log says
what a replica on the same host is worth (a crashed process, not a lost machine).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import textwrap
from pathlib import Path

import pytest
from conftest import python_program

from lightning_field.checkpoint.replica import nodes_on_one_host
from lightning_field.checkpoint.snapshot_dirs import snapshot_dir_for

SCRIPT = textwrap.dedent(
    """
    import sys
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.demos.boring_classes import BoringModel

    from lightning_field import ManifestCheckpoint

    root, kind = sys.argv[1], sys.argv[2]
    cls = ManifestCheckpoint if kind == "field" else ModelCheckpoint
    trainer = pl.Trainer(accelerator="cpu", devices=1, num_nodes=2, strategy="ddp", max_steps=4,
                         default_root_dir=root, logger=False, enable_progress_bar=False, limit_val_batches=0,
                         callbacks=[cls(dirpath=f"{root}/checkpoints", every_n_train_steps=2)])
    trainer.fit(BoringModel())
    print(f"node {trainer.node_rank} rank {trainer.global_rank} trained to step {trainer.global_step}")
    """
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _two_agents_on_this_host(script: Path, root: Path, kind: str) -> list[str]:
    port = _free_port()
    command = [python_program(), "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
               "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=one-host-{port}",
               str(script), str(root), kind]  # fmt: skip
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "PYTHONUNBUFFERED": "1"}
    agents = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True) for _ in range(2)]  # fmt: skip
    try:
        outputs = [agent.communicate(timeout=180)[0] for agent in agents]
    finally:
        for agent in agents:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()
    for agent, output in zip(agents, outputs, strict=True):
        assert agent.returncode == 0, output[-4000:]
    return outputs


@pytest.mark.slow
def test_two_nodes_on_one_host_train_at_the_defaults_as_with_plain_lightning_each_node_its_own_snapshots(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    plain = "\n".join(_two_agents_on_this_host(script, tmp_path / "plain", "plain"))
    assert plain.count("trained to step 4") == 2
    ours_root = tmp_path / "ours"
    folders = [snapshot_dir_for(ours_root / "checkpoints", None, node) for node in (0, 1)]
    try:
        ours = "\n".join(_two_agents_on_this_host(script, ours_root, "field"))
        assert ours.count("trained to step 4") == 2
        assert "several nodes share a host (nodes 0, 1 on" in ours
        assert "guards against a crashed process, not against the loss of the machine" in ours
        assert f"into {folders[0]} (" in ours  # node 0's own (each node's released once the fit ends saved)
    finally:
        for folder in folders:  # the default node-local parent (/dev/shm) outlives the test's folder
            shutil.rmtree(folder, ignore_errors=True)


def test_a_replica_on_the_same_host_is_named_for_what_it_guards_against() -> None:
    assert nodes_on_one_host([(0, "a"), (0, "a"), (1, "b")]) is None  # ranks of one node, two hosts
    said = nodes_on_one_host([(0, "box"), (1, "box"), (2, "other"), (3, "other")])
    assert said is not None and "nodes 0, 1 on box; nodes 2, 3 on other" in said


def test_each_node_of_a_run_keeps_its_snapshots_in_a_folder_named_for_it(tmp_path: Path) -> None:
    one_node = snapshot_dir_for(tmp_path / "ckpts", tmp_path / "shm")
    node_1 = snapshot_dir_for(tmp_path / "ckpts", tmp_path / "shm", node=1)
    assert node_1.parent == one_node.parent and node_1.name == f"{one_node.name}-node1"
