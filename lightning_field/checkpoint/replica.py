"""Step snapshots over several machines: each snapshot replicated to a partner node as part of its
commit (this module), and the resume that agrees on one step over every node's copies
(:mod:`~lightning_field.checkpoint.replica_resume`).

A snapshot lives in node-local memory (``/dev/shm``), which a lost machine takes with it. So, in a
run over several nodes, the commit of every snapshot also sends each rank's files to its partner:
the rank with the same local index on the next node (node *i* replicates to node *i + 1*, the last
to the first). Each node's directory then holds, under the snapshot's name, its own ranks' files
and its neighbour's, with the manifest of the whole snapshot; with two nodes, each holds all of it.
The manifest is published on every node at once (one atomic rename each) after every rank wrote
and every replica arrived and matched its sender's hash, so a node never lists half a snapshot.

What moves bytes runs on every rank of a host (gloo) group, every rank calling every collective.
"""

from __future__ import annotations

import logging
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lightning_field.checkpoint.commit import RankReport, SaveJob, build_manifest, write_rank_part, written_error
from lightning_field.checkpoint.stores import LocalStore, RankOutcome
from lightning_field.core.distributed import all_gather_objects, broadcast_object
from lightning_field.core.fsio import HashingWriter
from lightning_field.core.manifest import Manifest
from lightning_field.core.member_paths import member_name_problem
from lightning_field.core.signing import keys_from_environment

__all__ = [
    "NodeTopology",
    "commit_replicated",
    "exchange_tensors",
    "file_tensor",
    "host_name",
    "joined_errors",
    "node_key",
    "nodes_on_one_host",
    "shared_between_nodes",
    "shared_folder_problem",
    "write_checked",
]

log = logging.getLogger(__name__)


def host_name() -> str:
    return socket.gethostname()


def node_key(node_rank: int) -> tuple[str, int]:
    """What tells this rank's machine from the others: its host name and the launcher's node rank
    (two simulated nodes share a host name)."""
    return host_name(), int(node_rank)


def shared_folder_problem(seen: Sequence[tuple[int, str, int, int, str]]) -> str | None:
    """Why the snapshot folders cannot hold replicas, or None: two nodes see the very same folder
    (one host, one device and inode; a replica there would be no second copy at all). ``seen``: each
    rank's ``(node, host, st_dev, st_ino, path)`` of its folder."""
    first: dict[tuple[str, int, int], tuple[int, str]] = {}
    for node, host, device, inode, path in seen:
        other = first.setdefault((host, device, inode), (node, path))
        if other[0] != node:
            return (
                f"the snapshot directory {path} is one and the same directory on nodes {other[0]} and {node} (host"
                f" {host}): a replica there is no second copy. Give each node a node-local"
                " SnapshotConfig(directory=...) of its own."
            )
    return None


def nodes_on_one_host(nodes: Sequence[tuple[int, str]]) -> str | None:
    """What a replica is worth where several nodes run on one host (two launcher agents on a machine,
    as a test cluster runs them), or None: each node's ``(node rank, host)``, one per rank."""
    by_host: dict[str, set[int]] = {}
    for node, host in nodes:
        by_host.setdefault(host, set()).add(int(node))
    shared = {host: sorted(ranks) for host, ranks in by_host.items() if len(ranks) > 1}
    if not shared:
        return None
    which = "; ".join(f"nodes {', '.join(map(str, ranks))} on {host}" for host, ranks in sorted(shared.items()))
    return (
        f"several nodes share a host ({which}): each node keeps its step snapshots in a folder of its own, and"
        " a replica on a node of the same host guards against a crashed process, not against the loss of the"
        " machine. Persistent checkpoints still do."
    )


def shared_between_nodes(root: Path, node: int) -> tuple[str | None, str | None]:
    """Why this node's snapshot folder ``root`` cannot hold replicas (:func:`shared_folder_problem`), and
    what a replica guards against where nodes share a host (:func:`nodes_on_one_host`). Collective."""
    info = root.stat()
    seen = all_gather_objects((node, host_name(), info.st_dev, info.st_ino, str(root)))
    return shared_folder_problem(seen), nodes_on_one_host([(node, host) for node, host, *_ in seen])


@dataclass(frozen=True)
class NodeTopology:
    """Which ranks share a machine (and so a node-local directory), and who replicates to whom.

    ``nodes``: the global ranks on each machine, machines in node order, ranks ascending.
    """

    nodes: tuple[tuple[int, ...], ...]
    rank: int

    @classmethod
    def from_members(cls, members: Sequence[tuple[Any, int]], rank: int) -> NodeTopology:
        """From every rank's ``(node key, global rank)``, as :func:`all_gather_objects` returns them.

        Raises:
            ValueError: the nodes run different numbers of ranks (a partner is the rank of the same
                local index on the next node, which then may not exist).
        """
        by_node: dict[Any, list[int]] = {}
        for key, member in members:
            by_node.setdefault(key, []).append(int(member))
        nodes = tuple(tuple(sorted(ranks)) for _, ranks in sorted(by_node.items(), key=lambda kv: min(kv[1])))
        sizes = {len(ranks) for ranks in nodes}
        if len(sizes) > 1:
            shape = ", ".join(f"node {i}: ranks {list(r)}" for i, r in enumerate(nodes))
            raise ValueError(f"step snapshots need the same number of ranks on every node to pair them up; got {shape}")
        return cls(nodes, rank)

    @property
    def multi_node(self) -> bool:
        return len(self.nodes) > 1

    def node_of(self, rank: int) -> int:
        return next(i for i, ranks in enumerate(self.nodes) if rank in ranks)

    @property
    def node(self) -> int:
        return self.node_of(self.rank)

    def leader(self, node: int) -> int:
        """The rank that speaks for ``node``'s directory: verifies, publishes, prunes, receives."""
        return self.nodes[node][0]

    @property
    def is_leader(self) -> bool:
        return self.rank == self.leader(self.node)

    def partner(self, rank: int) -> int:
        """Where ``rank``'s snapshot files are replicated: the same local index on the next node."""
        node = self.node_of(rank)
        return self.nodes[(node + 1) % len(self.nodes)][self.nodes[node].index(rank)]

    def source(self, rank: int) -> int:
        """Whose files ``rank`` keeps a replica of: the rank it is the partner of."""
        node = self.node_of(rank)
        return self.nodes[(node - 1) % len(self.nodes)][self.nodes[node].index(rank)]


# ---------------------------------------------------------------------------------------- the commit
def commit_replicated(job: SaveJob, topology: NodeTopology, group: Any = None) -> str | None:
    """The commit protocol of :mod:`~lightning_field.checkpoint.commit`, with each rank's files also
    written on its partner's node and the manifest published on every node; the error that stopped
    it (the same on every rank), else None.

    1. Every rank writes its files into its node's hidden directory (hashing while writing).
    2. The receipts are gathered; every rank sends its files to its partner and receives its
       source's, written into the partner node's hidden directory and checked against the sender's hash.
    3. Rank 0 builds and signs the manifest and broadcasts it; every node's leader publishes it (the
       rename). A node that could not publish loses only its own copy; the save reports the error.

    Collective over ``group``: every rank calls it for the same save.
    """
    store = job.store
    if not isinstance(store, LocalStore):
        raise TypeError(f"replicated snapshots commit into a node-local LocalStore, not {type(store).__name__}")
    final = Path(job.final)
    token = broadcast_object(uuid.uuid4().hex[:8], group=group)
    # Under a sharding strategy DCP writes each rank's shards (and rank 0's metadata) into its own
    # node's hidden directory; they are that rank's files, replicated like any other.
    outcome, referenced = write_rank_part(job, token, group)
    gathered: list[RankReport] = all_gather_objects(
        (outcome, job.rank_missing, job.data_restore, job.stream_positions), group=group
    )
    outcomes = {o.rank: o for o, _, _, _ in gathered}
    # Rank 0 alone knows what DCP's metadata references: its verdict is every rank's, before the exchanges.
    error = broadcast_object(written_error(list(outcomes.values()), referenced), group=group)
    hidden = store.hidden_dir(final, token)
    if error is None:
        replicated = _replicate(hidden, outcomes, topology, group)
        error = joined_errors(e for e in all_gather_objects(replicated, group=group) if e)
    manifest: Manifest | None = None
    if error is None and job.is_global_zero:
        try:
            manifest = build_manifest(job, gathered)
            manifest.sign(keys_from_environment())
        except Exception as err:
            error = f"rank 0 (commit): {type(err).__name__}: {err}"
    error, manifest = broadcast_object((error, manifest), group=group)
    published = None
    if error is None and topology.is_leader:
        assert manifest is not None  # broadcast with the verdict
        try:
            store.publish(final, token, manifest)
        except Exception as err:
            published = f"node {topology.node} (rank {topology.rank}): publishing {final} failed: {err}"
    if error is None:
        error = joined_errors(e for e in all_gather_objects(published, group=group) if e)
    if error is not None and topology.is_leader:
        store.discard(final, token)  # what this node's ranks wrote and received; a published copy stays
    return error


def joined_errors(errors: Any) -> str | None:
    found = [e for e in errors if e]
    return "; ".join(found) if found else None


def _replicate(hidden: Path, outcomes: dict[int, RankOutcome], topology: NodeTopology, group: Any) -> str | None:
    """Send this rank's files to its partner and write its source's files into this node's hidden
    directory; the problem, else None. Every rank first says whether it can take part (a rank
    that could not read its own files must not leave its partner waiting on a receive)."""
    rank = topology.rank
    partner, source = topology.partner(rank), topology.source(rank)
    sends: list[torch.Tensor] = []
    problem = None
    try:
        sends = [file_tensor(hidden / r.file, r.size) for r in outcomes[rank].receipts]
    except OSError as err:
        problem = f"rank {rank}: reading its snapshot files to replicate them failed: {err}"
    if any(all_gather_objects(problem, group=group)):
        return problem
    expected = outcomes[source].receipts
    received = [torch.empty(r.size, dtype=torch.uint8) for r in expected]
    try:
        exchange_tensors([(t, partner) for t in sends], [(t, source) for t in received], group)
    except RuntimeError as err:
        return f"rank {rank}: replicating with ranks {partner}/{source} failed: {err}"
    for receipt, data in zip(expected, received, strict=True):
        written = write_checked(hidden, receipt.file, data, receipt.hash, f"rank {source}'s replica")
        if written is not None:
            return f"rank {rank}: {written}"
    return None


def file_tensor(path: Path, size: int) -> torch.Tensor:
    """The file's bytes as a tensor to send, mapped rather than copied where it has any."""
    if size == 0:
        return torch.empty(0, dtype=torch.uint8)
    if path.stat().st_size != size:
        raise OSError(f"{path} is {path.stat().st_size} bytes, its receipt says {size}")
    return torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8)


def exchange_tensors(
    sends: Sequence[tuple[torch.Tensor, int]], receives: Sequence[tuple[torch.Tensor, int]], group: Any
) -> None:
    """Post every receive and send at once, then wait for all of them: no order of pairs can
    deadlock. Messages between one pair are told apart by their position (the tag)."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("replication needs torch.distributed initialized")
    requests: list[Any] = []
    tags: dict[tuple[str, int], int] = {}
    for tensor, peer in receives:
        tag = tags[("r", peer)] = tags.get(("r", peer), -1) + 1
        if tensor.numel():
            requests.append(dist.irecv(tensor, src=peer, group=group, tag=tag))
    for tensor, peer in sends:
        tag = tags[("s", peer)] = tags.get(("s", peer), -1) + 1
        if tensor.numel():
            requests.append(dist.isend(tensor, dst=peer, group=group, tag=tag))
    for request in requests:
        if request is not None:  # None only where this rank is outside ``group``, which it never is here
            request.wait()


def write_checked(directory: Path, name: str, data: torch.Tensor, expected_hash: str, what: str) -> str | None:
    """Write ``data`` as ``directory/name`` and compare its hash; the problem (file removed), else None."""
    problem = member_name_problem(name)
    if problem is not None or "/" in name:
        return f"{what}: refused the file name {name!r} ({problem or 'a nested path'})"
    path = directory / name
    directory.mkdir(parents=True, exist_ok=True)
    writer = HashingWriter(path)
    try:
        if data.numel():
            writer.write(data.numpy().data)
        _, digest = writer.finish(sync=False)  # node-local memory: it need only outlive the process
    except OSError as err:
        writer.close()
        path.unlink(missing_ok=True)
        return f"{what}: writing {path} failed: {err}"
    if digest != expected_hash:
        path.unlink(missing_ok=True)
        return f"{what}: {name} arrived with hash {digest[:16]}…, sent with {expected_hash[:16]}…"
    return None
