"""Replicated step snapshots (issue 28): what the replica adds to a snapshot's commit, and what a
lost node's recovery from it costs, against the same state without replication, in one run.

Two simulated nodes of one gloo rank each (``torchrun --standalone --nproc-per-node=2``, each rank a
node with a folder of its own in /dev/shm), for each state size:

1. **Commit.** The same save (rank 0: the shared state of SIZE MB and its rank file; rank 1: its
   rank file) committed ``--rounds`` times with the plain commit into one folder (what a single
   machine does), then with the replicated commit (each node's files also written on the other).
   Figure: the median wall time of the commit, and the replicated one ÷ the plain one.
2. **Recovery.** Node 1's folder deleted (a replaced machine starts empty); the agreement (each
   node's inventory, verified file by file), the plan and the restore of a complete copy on node 1
   from node 0's, timed; against loading the same checkpoint from a durable local folder (read and
   hash every byte), as a resume from a persistent checkpoint on local disk does.

    python benchmarks/replica_recovery.py [--sizes 10 256] [--rounds 5]

Prints a Markdown table on rank 0.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lightning_field.checkpoint.commit import SaveJob, commit_save
from lightning_field.checkpoint.replica import NodeTopology, commit_replicated
from lightning_field.checkpoint.replica_resume import inventory, plan_restore, restore_from_nodes
from lightning_field.checkpoint.stores import LocalStore
from lightning_field.checkpoint.verify import verify_checkpoint
from lightning_field.core.distributed import all_gather_objects, exit_finished_process
from lightning_field.core.manifest import SHARED_STATE_FILE, Provenance, rank_state_file


def job(root: Path, name: str, rank: int, model: dict[str, torch.Tensor], store: LocalStore) -> SaveJob:
    files: dict[str, tuple[Any, list[str]]] = {rank_state_file(rank): ({"rng": torch.get_rng_state()}, ["rng"])}
    if rank == 0:
        files[SHARED_STATE_FILE] = ({"state_dict": model}, ["model"])
    return SaveJob(
        final=root / name, store=store, rank=rank, is_global_zero=rank == 0, step=1, epoch=0,
        world_size=dist.get_world_size(), files=files, rank_missing=[], data_restore=[], stream_positions=[],
        shared_components=["model"] if rank == 0 else [], shared_missing=[], start=time.perf_counter(),
        provenance=Provenance(), model_state=model,
    )  # fmt: skip


def timed(fn: Any) -> float:
    dist.barrier()
    start = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - start


def measure(base: Path, size: int, rounds: int, topology: NodeTopology) -> tuple[float, float, float, float]:
    """(plain commit, replicated commit, recovery, persistent load) in seconds for a state of ``size`` MB."""
    rank = topology.rank
    model = {"w": torch.randn(size * (1 << 20) // 4)}
    shared = base / f"shared-{size}"
    nodes = [base / f"node{n}-{size}" for n in range(2)]
    durable = base / f"durable-{size}"
    for folder in (shared, *nodes, durable):
        folder.mkdir(parents=True, exist_ok=True)
    memory = LocalStore(durable=False)
    plain, replicated = [], []
    for i in range(rounds + 1):  # the first round warms up (first touch of fresh memory is slow in a VM)
        p = timed(lambda: commit_save(job(shared, f"plain-{i}", rank, model, memory)))  # noqa: B023 - called at once
        r = timed(lambda: commit_replicated(job(nodes[rank], f"r-{i}", rank, model, memory), topology))  # noqa: B023
        if i:
            plain.append(p)
            replicated.append(r)
            # As retention does: the memory of an older snapshot is reused, not new memory touched.
            if topology.is_leader:
                shutil.rmtree(nodes[rank] / f"r-{i - 1}")
            if rank == 0:
                shutil.rmtree(shared / f"plain-{i - 1}")
        dist.barrier()
    # Recovery: node 1 replaced by an empty machine.
    if rank == 1:
        shutil.rmtree(nodes[1])
        nodes[1].mkdir()
    here = nodes[rank]

    def recover() -> None:
        held = inventory(here, memory) if topology.is_leader else None
        plan = plan_restore(all_gather_objects(held), newer_than=-1)
        assert plan is not None
        assert restore_from_nodes(here, plan, topology, None, memory) is None

    recovery = timed(recover)
    commit_save(job(durable, "persistent", rank, model, LocalStore(durable=True)))
    os.sync()

    def load_persistent() -> None:
        assert verify_checkpoint(durable / "persistent").recoverable
        torch.load(durable / "persistent" / SHARED_STATE_FILE, weights_only=True)

    persistent = timed(load_persistent)
    if rank == 0:
        for folder in (shared, *nodes, durable):
            shutil.rmtree(folder, ignore_errors=True)
    dist.barrier()
    return statistics.median(plain), statistics.median(replicated), recovery, persistent


def worker(base: Path, sizes: list[int], rounds: int) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    topology = NodeTopology.from_members(all_gather_objects((("simulated", rank), rank)), rank)
    rows = [(size, *measure(base, size, rounds, topology)) for size in sizes]
    if rank == 0:
        print("| state | plain commit (one folder) | replicated commit (2 nodes) | ÷ plain |"
              " recovery of a lost node from the replica | load from a durable local folder |")  # fmt: skip
        print("|---|---|---|---|---|---|")
        for size, p, r, rec, per in rows:
            print(f"| {size} MB | {1000 * p:.1f} ms | {1000 * r:.1f} ms | {r / p:.2f} | {1000 * rec:.1f} ms"
                  f" | {1000 * per:.1f} ms |")  # fmt: skip
        sys.stdout.flush()
    exit_finished_process(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 256], help="state sizes in MB")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--worker", type=Path)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.sizes, args.rounds)
        return
    parent = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(dir=parent) as base:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", __file__,
                   "--worker", base, "--rounds", str(args.rounds), "--sizes", *map(str, args.sizes)]  # fmt: skip
        subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


if __name__ == "__main__":
    main()
