"""Two simulated nodes of two gloo ranks each (``torchrun --nproc-per-node=4``; ranks 0-1 are node 0,
ranks 2-3 node 1, each node with a directory of its own): the replicated commit of two snapshots,
node 1's directory lost and restored from node 0's copies, and a replica damaged between its write
and its sending, which fails the commit on every rank. Rank 0 writes what it saw to ``report.json``."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lightning_field.checkpoint.commit import SaveJob
from lightning_field.checkpoint.replica import NodeTopology, commit_replicated
from lightning_field.checkpoint.replica_resume import inventory, plan_restore, restore_from_nodes
from lightning_field.checkpoint.stores import LocalStore, RankOutcome
from lightning_field.checkpoint.verify import verify_checkpoint
from lightning_field.core.distributed import all_gather_objects, exit_finished_process
from lightning_field.core.manifest import SHARED_STATE_FILE, Provenance, rank_state_file

PER_NODE = 2


class DamagedAfterWrite(LocalStore):
    """Rank 1's file changes on its way to the partner (after its receipt was taken)."""

    def write(self, final: Path, token: str, rank: int, files: dict[str, tuple[Any, list[str]]]) -> RankOutcome:
        outcome = super().write(final, token, rank, files)
        if rank == 1:
            path = self.hidden_dir(final, token) / rank_state_file(rank)
            data = bytearray(path.read_bytes())
            data[-10] ^= 0xFF
            path.write_bytes(bytes(data))
        return outcome


def save_job(root: Path, step: int, rank: int, store: LocalStore) -> SaveJob:
    torch.manual_seed(step * 10 + rank)
    files: dict[str, tuple[Any, list[str]]] = {rank_state_file(rank): ({"rng": torch.randn(8)}, ["rng"])}
    model = {"w": torch.full((256,), float(step))}
    if rank == 0:
        files[SHARED_STATE_FILE] = ({"state_dict": model, "global_step": step}, ["model"])
    return SaveJob(
        final=root / f"epoch=0-step={step}", store=store, rank=rank, is_global_zero=rank == 0, step=step, epoch=0,
        world_size=dist.get_world_size(), files=files, rank_missing=[], data_restore=[], stream_positions=[],
        shared_components=["model"] if rank == 0 else [], shared_missing=[], start=time.perf_counter(),
        provenance=Provenance(), model_state=model,
    )  # fmt: skip


def main(base: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    node = rank // PER_NODE
    topology = NodeTopology.from_members(all_gather_objects((("simulated", node), rank)), rank)
    roots = [base / f"node-{n}" for n in range(len(topology.nodes))]
    root, store = roots[node], LocalStore(durable=False)
    report: dict[str, Any] = {"committed": {}}
    for step in (2, 3):
        error = commit_replicated(save_job(root, step, rank, store), topology, None)
        assert error is None, error
    seen = None
    if topology.is_leader:
        seen = {p.name: "OK" if verify_checkpoint(p).recoverable else "BAD" for p in sorted(root.iterdir())
                if p.is_dir() and not p.name.startswith(".")}  # fmt: skip
    for n, found in enumerate(all_gather_objects(seen)[:: PER_NODE]):
        report["committed"][f"node-{n}"] = found
    report["files"] = sorted(p.name for p in (roots[1] / "epoch=0-step=3").iterdir())

    # Node 1 is lost: a machine that replaces it starts with nothing.
    dist.barrier()
    if rank == topology.leader(1):
        shutil.rmtree(root)
        root.mkdir(mode=0o700)
    dist.barrier()
    held = inventory(root, store) if topology.is_leader else None
    gathered = all_gather_objects(held)
    plan = plan_restore([gathered[topology.leader(n)] for n in range(len(topology.nodes))], newer_than=-1)
    assert plan is not None
    report["plan"] = {"name": plan.name, "transfers_to_node_1": sum(t.destination == 1 for t in plan.transfers),
                      "from_replica": plan.from_replica}  # fmt: skip
    problem = restore_from_nodes(root, plan, topology, None, store)
    report["restored"] = problem or "OK"
    checkpoint = [r / plan.name for r in roots]
    report["bitwise_equal_to_node_0"] = sorted(p.name for p in checkpoint[0].iterdir()) == sorted(
        p.name for p in checkpoint[1].iterdir()
    ) and all((checkpoint[0] / p.name).read_bytes() == p.read_bytes() for p in checkpoint[1].iterdir())

    # Node 1 lost again, and node 0 cannot read a file it must send: every rank says so, none hangs.
    dist.barrier()
    if rank == topology.leader(1):
        shutil.rmtree(root)
        root.mkdir(mode=0o700)
    dist.barrier()
    if rank == topology.leader(0):
        (checkpoint[0] / rank_state_file(3)).unlink()  # after the plan: as if lost between verify and send
    problem = restore_from_nodes(root, plan, topology, None, store)
    report["unreadable_send"] = all_gather_objects(bool(problem and "reading epoch=0-step=3 to send" in problem))

    error = commit_replicated(save_job(root, 4, rank, DamagedAfterWrite(durable=False)), topology, None)
    marks = all_gather_objects("arrived with hash" if error and "arrived with hash" in error else error)
    report["forged_commit_errors"] = marks
    report["forged_published"] = any((r / "epoch=0-step=4").exists() for r in roots)
    if rank == 0:
        (base / "report.json").write_text(json.dumps(report, indent=2))
    dist.barrier()
    exit_finished_process(0)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
