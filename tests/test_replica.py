"""Replicated step snapshots over several machines: who pairs with whom, which step the nodes agree
on, which files move where, and that a replica must arrive as it was sent. The protocol itself runs
over real gloo ranks (two simulated nodes of two ranks each) in ``jobs/replica_job.py``; a lost node
of a training run, resumed from its partner's copy, is a row of the conformance suite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import child_env, python_program, run_in_session

from lightning_field.checkpoint.replica import NodeTopology, shared_folder_problem, write_checked
from lightning_field.checkpoint.replica_resume import HeldSnapshot, Transfer, plan_restore
from lightning_field.core.hashing import hash_bytes
from lightning_field.core.manifest import rank_state_file

JOB = Path(__file__).parent / "jobs" / "replica_job.py"


def topology(nodes: int, per_node: int, rank: int = 0) -> NodeTopology:
    members = [((f"host-{r // per_node}", r // per_node), r) for r in range(nodes * per_node)]
    return NodeTopology.from_members(members, rank)


def test_each_rank_replicates_to_the_same_local_index_on_the_next_node_and_the_last_node_to_the_first() -> None:
    t = topology(3, 2)
    assert t.nodes == ((0, 1), (2, 3), (4, 5))
    assert [t.partner(r) for r in range(6)] == [2, 3, 4, 5, 0, 1]
    assert [t.source(r) for r in range(6)] == [4, 5, 0, 1, 2, 3]
    assert [t.leader(n) for n in range(3)] == [0, 2, 4]
    assert topology(3, 2, rank=2).is_leader and not topology(3, 2, rank=3).is_leader
    assert not topology(1, 4).multi_node and topology(2, 1).multi_node


def test_nodes_with_different_numbers_of_ranks_are_refused_naming_each_node() -> None:
    members = [(("a", 0), 0), (("a", 0), 1), (("b", 1), 2)]
    with pytest.raises(ValueError, match=r"node 0: ranks \[0, 1\], node 1: ranks \[2\]"):
        NodeTopology.from_members(members, 0)


FILES = frozenset({"state.pt", "rank-0.pt", "rank-1.pt", "rank-2.pt", "rank-3.pt"})  # names as plans see them


def held(name: str, step: int, intact: set[str], digest: str = "d", listed: frozenset[str] = FILES) -> HeldSnapshot:
    return HeldSnapshot(name, step, float(step), f"{digest}{step}", listed, frozenset(intact))


def test_a_replaced_node_receives_every_file_of_the_newest_snapshot_from_its_partners_copy() -> None:
    survivor = [held("s=6", 6, set(FILES)), held("s=5", 5, set(FILES))]  # its own files and its partner's
    plan = plan_restore([survivor, []], newer_than=4)
    assert plan is not None and (plan.name, plan.step, plan.holder) == ("s=6", 6, 0)
    assert plan.transfers == tuple(Transfer(f, 0, 1) for f in sorted(FILES)) and plan.from_replica
    assert {t.destination for t in plan.transfers} == {1}  # node 0 held all of it already


def test_a_persistent_checkpoint_of_the_same_step_or_newer_wins_over_every_snapshot() -> None:
    nodes = [[held("s=6", 6, set(FILES))], [held("s=6", 6, set(FILES))]]
    assert plan_restore(nodes, newer_than=6) is None
    plan = plan_restore(nodes, newer_than=5)
    assert plan is not None and not plan.from_replica and plan.transfers == ()  # both held all of it


def test_over_three_nodes_a_snapshot_held_in_parts_is_completed_from_whichever_node_holds_each_file() -> None:
    # Node 0 holds its ranks' files and node 2's (its source); node 1 holds its own and node 0's.
    node0 = held("s=8", 8, {"state.pt", "rank-0.pt", "rank-4.pt"}, listed=FILES | {"rank-4.pt"})
    node1 = held("s=8", 8, {"rank-2.pt", "state.pt", "rank-0.pt"}, listed=FILES | {"rank-4.pt"})
    plan = plan_restore([[node0], [node1], []], newer_than=-1)
    assert plan is None  # rank-1.pt and rank-3.pt are held nowhere: not restorable
    node1 = held("s=8", 8, {"rank-1.pt", "rank-2.pt", "rank-3.pt"}, listed=FILES | {"rank-4.pt"})
    plan = plan_restore([[node0], [node1], []], newer_than=-1)
    assert plan is not None
    assert {t for t in plan.transfers if t.destination == 1} == {Transfer("state.pt", 0, 1),
                                                                  Transfer("rank-0.pt", 0, 1),
                                                                  Transfer("rank-4.pt", 0, 1)}  # fmt: skip
    assert {(t.file, t.source) for t in plan.transfers if t.destination == 2} == {
        ("state.pt", 0), ("rank-0.pt", 0), ("rank-4.pt", 0), ("rank-1.pt", 1), ("rank-2.pt", 1), ("rank-3.pt", 1)
    }


def test_a_damaged_newest_snapshot_whose_file_is_intact_nowhere_falls_back_to_the_one_before() -> None:
    damaged = FILES - {"rank-1.pt"}  # each node's verification dropped its copy of rank-1.pt
    nodes = [[held("s=7", 7, damaged), held("s=6", 6, set(FILES))], [held("s=7", 7, damaged)]]
    plan = plan_restore(nodes, newer_than=4)
    assert plan is not None and plan.name == "s=6" and plan.transfers == tuple(Transfer(f, 0, 1) for f in sorted(FILES))


def test_copies_of_one_name_with_different_manifests_are_different_saves_and_never_mixed() -> None:
    half = {"state.pt", "rank-0.pt", "rank-1.pt"}
    nodes = [[held("s=7", 7, half, digest="a")], [held("s=7", 7, FILES - half, digest="b")]]
    assert plan_restore(nodes, newer_than=-1) is None


def test_one_folder_seen_by_two_nodes_is_refused_naming_both_but_two_ranks_of_one_node_share_theirs() -> None:
    assert shared_folder_problem([(0, "h", 1, 7, "/dev/shm/x"), (0, "h", 1, 7, "/dev/shm/x")]) is None
    assert shared_folder_problem([(0, "a", 1, 7, "/dev/shm/x"), (1, "b", 1, 7, "/dev/shm/x")]) is None  # two hosts
    problem = shared_folder_problem([(0, "h", 1, 7, "/shm/x"), (1, "h", 1, 8, "/shm/y"), (2, "h", 1, 7, "/shm/x")])
    assert problem is not None and "on nodes 0 and 2" in problem
    assert "node-local SnapshotConfig(directory=...)" in problem


def test_a_replica_that_arrives_with_other_bytes_than_were_sent_is_refused_and_removed(tmp_path: Path) -> None:
    data = torch.frombuffer(bytearray(b"the sender's bytes"), dtype=torch.uint8)
    assert write_checked(tmp_path, "rank-1.pt", data, hash_bytes(b"the sender's bytes"), "rank 1's replica") is None
    assert (tmp_path / "rank-1.pt").read_bytes() == b"the sender's bytes"
    problem = write_checked(tmp_path, "rank-2.pt", data, hash_bytes(b"other bytes"), "rank 2's replica")
    assert problem is not None and "rank 2's replica: rank-2.pt arrived with hash" in problem
    assert not (tmp_path / "rank-2.pt").exists()
    problem = write_checked(tmp_path, "../escape.pt", data, hash_bytes(b"the sender's bytes"), "rank 3's replica")
    assert problem is not None and "refused the file name" in problem and not (tmp_path.parent / "escape.pt").exists()


@pytest.mark.slow
def test_over_two_nodes_of_two_ranks_every_node_holds_a_complete_snapshot_and_a_lost_node_is_restored_bitwise(
    tmp_path: Path,
) -> None:
    command = [python_program(), "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4", str(JOB),
               str(tmp_path)]  # fmt: skip
    result = run_in_session(command, timeout=120, env=child_env())
    assert result.returncode == 0, result.stdout[-4000:]
    report = json.loads((tmp_path / "report.json").read_text())
    # The commit: each node published the whole snapshot (its ranks' files and the other node's).
    for node in ("node-0", "node-1"):
        assert report["committed"][node] == {"epoch=0-step=2": "OK", "epoch=0-step=3": "OK"}
    ranks = [rank_state_file(r) for r in range(4)]
    assert report["files"] == sorted(["manifest.json", *ranks, "state.pt"])
    # Node 1 lost (its directory deleted): the plan sends it everything, and its new copy is node 0's, byte for byte.
    assert report["plan"] == {"name": "epoch=0-step=3", "transfers_to_node_1": 5, "from_replica": True}
    assert report["restored"] == "OK" and report["bitwise_equal_to_node_0"]
    # A file a node must send but cannot read: the restore fails on every rank, instead of leaving receives waiting.
    assert report["unreadable_send"] == [True] * 4
    # A forged replica (another rank's bytes under a hash they do not have) fails the commit, on every rank.
    assert report["forged_commit_errors"] == 4 * ["arrived with hash"]
    assert report["forged_published"] is False
