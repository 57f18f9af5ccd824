"""The resume of replicated step snapshots (:mod:`~lightning_field.checkpoint.replica`): the nodes
agree on one step before anything is loaded.

Each node's first rank verifies what its directory holds, file by file; the inventories are
exchanged, and the newest snapshot whose files all exist somewhere, intact, is chosen when it is
newer than the newest recoverable persistent checkpoint. Each node then receives the files it
lacks from a node holding them (a node that replaced a lost one receives everything), checks each
against the manifest, and publishes a complete copy; every rank loads its own node's copy. A node
lost with its partner (or every node) leaves the persistent checkpoints, as before.

What decides is a pure function of the gathered inventories (:func:`plan_restore`, tested as such);
what moves bytes runs on every rank of a host (gloo) group.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from lightning_field.checkpoint.replica import (
    NodeTopology,
    exchange_tensors,
    file_tensor,
    joined_errors,
    write_checked,
)
from lightning_field.checkpoint.resume_last import NoRecoverableCheckpointError
from lightning_field.checkpoint.stores import CheckpointStore, read_manifest
from lightning_field.checkpoint.stores.local import temp_dir_for
from lightning_field.checkpoint.verify import verify_against
from lightning_field.core.distributed import all_gather_objects, broadcast_object
from lightning_field.core.fsio import atomic_write_bytes, exchange_or_replace_dir
from lightning_field.core.hashing import new_hasher
from lightning_field.core.manifest import MANIFEST_NAME, Manifest, ManifestError, manifest_from_bytes
from lightning_field.core.member_paths import UnsafeMemberError

__all__ = [
    "HeldSnapshot",
    "RestorePlan",
    "Transfer",
    "agree_across_nodes",
    "inventory",
    "plan_restore",
    "restore_from_nodes",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeldSnapshot:
    """One committed snapshot as one node's directory holds it (its leader verified it)."""

    name: str
    step: int
    created_unix: float
    digest: str  # of the manifest's signed content: the same save on every node
    listed: frozenset[str]  # every file the manifest names
    intact: frozenset[str]  # those this node holds and whose bytes match the manifest


def inventory(root: Path, store: CheckpointStore, log_skips: bool = True) -> list[HeldSnapshot]:
    """What ``root`` holds, verified file by file: a partial copy (a node that was sent only its
    neighbour's files) lists the files it has; a file that is damaged is not held; a snapshot
    whose manifest is unreadable, unrecoverable, or whose signature fails is skipped."""
    warn = log.warning if log_skips else log.debug
    held: list[HeldSnapshot] = []
    for listed_path in store.checkpoints(root):
        checkpoint = Path(listed_path)  # a LocalStore lists Paths
        try:
            manifest = read_manifest(checkpoint, store=store)
        except ManifestError as err:
            warn("Skipping snapshot %s: %s", checkpoint, err)
            continue
        if not manifest.recoverable:
            continue
        signature = verify_against(manifest, store, checkpoint, files=[])
        if signature.problems:
            warn("Skipping snapshot %s: %s", checkpoint, "; ".join(signature.problems))
            continue
        intact = []
        for name in sorted(manifest.files):
            try:
                present = store.size(checkpoint, name) is not None
            except UnsafeMemberError as err:
                warn("Snapshot %s: %s", checkpoint, err)
                continue
            if not present:
                continue
            report = verify_against(manifest, store, checkpoint, files=[name])
            if report.problems:
                warn("Snapshot %s: %s", checkpoint, "; ".join(report.problems))
                continue
            intact.append(name)
        digest = new_hasher()
        digest.update(manifest.signed_content())
        listed, holding = frozenset(manifest.files), frozenset(intact)
        created = manifest.created_unix
        held.append(HeldSnapshot(checkpoint.name, manifest.step, created, digest.hexdigest(), listed, holding))
    return held


@dataclass(frozen=True)
class Transfer:
    file: str
    source: int  # node
    destination: int  # node


@dataclass(frozen=True)
class RestorePlan:
    """The snapshot every node will load, and the files each node must first receive."""

    name: str
    step: int
    digest: str
    holder: int  # the first node holding any of it: its leader sends the manifest
    transfers: tuple[Transfer, ...]

    @property
    def from_replica(self) -> bool:
        """Some node needs files from another node's copy (a replica, or a neighbour's own files)."""
        return bool(self.transfers)


def plan_restore(inventories: Sequence[Sequence[HeldSnapshot]], newer_than: int) -> RestorePlan | None:
    """The newest snapshot whose every file is held, intact, by some node, if its step is newer
    than ``newer_than`` (the newest recoverable persistent checkpoint's; a tie goes to that one);
    and which node sends which file to whom. ``inventories[n]`` is node ``n``'s.

    A pure function of what every rank gathered: every rank reaches the same plan."""
    copies: dict[tuple[str, str], list[tuple[int, HeldSnapshot]]] = {}
    for node, held in enumerate(inventories):
        for snapshot in held:
            copies.setdefault((snapshot.name, snapshot.digest), []).append((node, snapshot))
    best: tuple[tuple[int, float], RestorePlan] | None = None
    for (name, digest), holders in copies.items():
        listed = holders[0][1].listed
        if any(h.listed != listed for _, h in holders):
            continue  # the same manifest digest names the same files: a disagreement is a forgery
        if set().union(*(h.intact for _, h in holders)) != listed:
            continue  # some file is intact nowhere
        step, created = holders[0][1].step, holders[0][1].created_unix
        if step <= newer_than:
            continue
        owners = {f: min(n for n, h in holders if f in h.intact) for f in listed}
        transfers = tuple(
            Transfer(f, owners[f], node)
            for node, held in enumerate(inventories)
            for f in sorted(listed - next((h.intact for n, h in holders if n == node), frozenset()))
        )
        plan = RestorePlan(name, step, digest, holders[0][0], transfers)
        if best is None or (step, created) > best[0]:
            best = ((step, created), plan)
    return best[1] if best is not None else None


def restore_from_nodes(
    root: Path,
    plan: RestorePlan,
    topology: NodeTopology,
    group: Any,
    store: CheckpointStore,
) -> str | None:
    """Make ``root/plan.name`` a complete, verified copy on every node (collective over ``group``);
    the problem, the same on every rank, else None.

    The holder's leader broadcasts the manifest's bytes; each node's leader receives the files its
    node lacks from a node that holds them, checks each against the manifest, writes them with
    links to what it already holds into a hidden directory, and renames it into place."""
    leader = topology.leader(plan.holder)
    raw = None
    if topology.rank == leader:
        raw = store.read(root / plan.name, MANIFEST_NAME)
    raw = broadcast_object(raw, src=leader, group=group)
    problem = None
    try:
        manifest = manifest_from_bytes(raw, root / plan.name / MANIFEST_NAME, None, root / plan.name)
    except ManifestError as err:
        problem = f"the manifest of {plan.name} sent by rank {leader}: {err}"
    if any(all_gather_objects(problem, group=group)):
        return problem or "another rank could not read the manifest sent"
    sends: list[tuple[torch.Tensor, int]] = []
    if topology.is_leader:
        sends, problem = _files_to_send(root, plan, manifest, topology)
    # Every node first says whether it can send: a receive posted for a send that never comes would wait forever.
    problems = all_gather_objects(problem, group=group)
    if any(problems):
        return joined_errors(problems)
    if topology.is_leader:
        problem = _receive_and_publish(root, plan, manifest, raw, topology, group, sends)
    return joined_errors(e for e in all_gather_objects(problem, group=group) if e)


def _files_to_send(
    root: Path, plan: RestorePlan, manifest: Manifest, topology: NodeTopology
) -> tuple[list[tuple[torch.Tensor, int]], str | None]:
    """This leader's files that other nodes lack, each with the leader it goes to; or the problem."""
    here, node = root / plan.name, topology.node
    try:
        return [
            (file_tensor(here / t.file, manifest.files[t.file].size), topology.leader(t.destination))
            for t in plan.transfers
            if t.source == node
        ], None
    except OSError as err:
        return [], f"node {node}: reading {plan.name} to send it failed: {err}"


def _receive_and_publish(
    root: Path,
    plan: RestorePlan,
    manifest: Manifest,
    raw: bytes,
    topology: NodeTopology,
    group: Any,
    sends: list[tuple[torch.Tensor, int]],
) -> str | None:
    """This leader's part of the restore: send what others lack, receive what its node lacks, check
    each file against the manifest, and publish the node's complete copy."""
    node = topology.node
    mine = [t for t in plan.transfers if t.destination == node]
    receives = [(torch.empty(manifest.files[t.file].size, dtype=torch.uint8), topology.leader(t.source)) for t in mine]
    try:
        exchange_tensors(sends, receives, group)
    except RuntimeError as err:
        return f"node {node}: receiving {plan.name} failed: {err}"
    if not mine:
        return None
    here = root / plan.name
    assembled = temp_dir_for(root, plan.name, f"restore-{uuid.uuid4().hex[:8]}")
    try:
        assembled.mkdir(parents=True)
        for transfer, (data, _) in zip(mine, receives, strict=True):
            written = write_checked(
                assembled, transfer.file, data, manifest.files[transfer.file].hash, f"node {transfer.source}'s copy"
            )
            if written is not None:
                return f"node {node}: {written}"
        received = {t.file for t in mine}
        for name in sorted(set(manifest.files) - received):
            os.link(here / name, assembled / name)  # held and verified here already: no byte copied
        atomic_write_bytes(assembled / MANIFEST_NAME, raw, durable=False)
        replaced = exchange_or_replace_dir(assembled, here)
        if replaced is not None:
            shutil.rmtree(replaced, ignore_errors=True)
    except OSError as err:
        return f"node {node}: assembling {here} failed: {err}"
    finally:
        shutil.rmtree(assembled, ignore_errors=True)  # gone already once renamed into place
    return None


def agree_across_nodes(
    root: Path,
    store: CheckpointStore,
    topology: NodeTopology,
    group: Any,
    persistent: Callable[[], str | None],
    persistent_store: Callable[[str], CheckpointStore],
    prepare: Callable[[Path], str | None],
    log_skips: bool,
    same_run: Callable[[Path], bool] = lambda root: True,
) -> tuple[str | None, str | None]:
    """``ckpt_path="last"`` over every node's snapshot folder ``root`` and the persistent checkpoints
    (``persistent()`` resolves those, on every rank; ``persistent_store`` reads one): what this
    rank loads, and from which tier ("snapshot" where every node held it, "replica" where a node
    received files; None for a persistent checkpoint or none at all). ``prepare`` creates a node's
    private folder (a problem, else None); ``same_run`` tells whether a node's folder holds this
    run's snapshots, not a deleted run's (another run's count as none). Collective over ``group``.

    Raises:
        NoRecoverableCheckpointError: from ``persistent()``, when no snapshot is newer either.
        RuntimeError: the ranks found different persistent checkpoints.
    """
    refused: NoRecoverableCheckpointError | None = None
    try:
        chosen = persistent()
    except NoRecoverableCheckpointError as err:
        chosen, refused = None, err
    step = read_manifest(chosen, store=persistent_store(chosen)).step if chosen else -1
    steps = sorted(set(all_gather_objects(step, group=group)))
    if len(steps) > 1:
        raise RuntimeError(
            f"ranks found different persistent checkpoints to resume from (steps {steps}) beside"
            f" {root}: pass an explicit ckpt_path."
        )
    held = None
    if topology.is_leader:
        held = inventory(root, store, log_skips=log_skips) if root.is_dir() and same_run(root) else []
    gathered = all_gather_objects(held, group=group)
    plan = plan_restore([gathered[topology.leader(n)] for n in range(len(topology.nodes))], newer_than=step)
    if plan is None:
        if refused is not None:
            raise refused
        return chosen, None
    prepared = prepare(root) if topology.is_leader else None  # a replaced node has no folder yet
    problem = next((p for p in all_gather_objects(prepared, group=group) if p), None)
    problem = problem or restore_from_nodes(root, plan, topology, group, store)
    if problem is not None:
        rank_zero_warn(
            f"lightning_field: the snapshot {plan.name} (step {plan.step}) could not be restored across the nodes"
            f" ({problem}); resuming from the persistent checkpoints instead."
        )
        if refused is not None:
            raise refused
        return chosen, None
    lacking = sorted({t.destination for t in plan.transfers})
    how = f"node(s) {lacking} received what they lacked from other nodes" if lacking else "held by every node"
    rank_zero_info(
        f"lightning_field: resuming from the snapshot {plan.name} (step {plan.step}; {how}), newer than"
        " every recoverable persistent checkpoint."
    )
    return str(root / plan.name), "replica" if plan.from_replica else "snapshot"
