"""Store conformance: the same specification for every store, the two that ship (a local folder; an
object store, on a real S3 API and on fsspec's memory filesystem) and a user's own
(examples/memory_store.py), and then a Trainer that writes and resumes through a user's store."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
import torch
from conftest import TESTS_DIR, assert_bitwise_equal, make_trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_field import latest_recoverable, verify_checkpoint
from lightning_field.checkpoint.checkpointer import Checkpointer
from lightning_field.checkpoint.commit import manifest_files
from lightning_field.checkpoint.resolver import committed_checkpoints
from lightning_field.checkpoint.stores import (
    CheckpointStore,
    LocalStore,
    ObjectStore,
    is_checkpoint,
    location_exists,
    read_manifest,
    store_for,
)
from lightning_field.core.manifest import MANIFEST_NAME, SHARED_STATE_FILE, Manifest
from lightning_field.core.storage import join

sys.path.insert(0, str(TESTS_DIR.parent / "examples"))
from memory_store import MemoryStore
from sqlite_store import SqliteStore

BACKENDS = ["local", "s3", "fsspec-memory", "users-own", "users-key-value"]


@pytest.fixture(params=BACKENDS)
def store_and_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[CheckpointStore, Any]]:
    if request.param == "local":
        yield store_for(tmp_path / "ckpts"), tmp_path / "ckpts"
    elif request.param == "s3":
        bucket, options = request.getfixturevalue("s3_bucket")
        url = f"{bucket}/ckpts"
        store = store_for(url, options)
        assert isinstance(store, ObjectStore)
        yield store, url
    elif request.param == "fsspec-memory":
        root = f"/field-{uuid.uuid4().hex}"  # fsspec's memory paths are rooted: memory:///...
        url = f"memory://{root}/ckpts"
        yield store_for(url), url
        fsspec.filesystem("memory").rm(root, recursive=True)
    elif request.param == "users-own":
        yield MemoryStore(), "users/ckpts"  # type: ignore[misc]
    else:
        yield SqliteStore(str(tmp_path / "checkpoints.db")), "runs/a/ckpts"  # type: ignore[misc]


def _save(store: CheckpointStore, dirpath: Any, name: str, step: int, publish: bool = True) -> tuple[Any, dict]:
    """One rank-0 save through the protocol, as the commit drives it: prepare, write, publish."""
    final = join(dirpath, name)
    state = {"weights": torch.arange(step + 4, dtype=torch.float32), "step": step}
    store.prepare(final)
    outcome = store.write(final, "tok", 0, {SHARED_STATE_FILE: (state, ["weights"])})
    assert outcome.error is None, outcome.error
    if publish:
        manifest = Manifest(name=name, step=step, epoch=0, world_size=1, files=manifest_files([outcome]),
                            components={"weights": [0]}, recoverable=True, missing=[])  # fmt: skip
        store.publish(final, "tok", manifest)
    return final, state


def test_a_published_save_is_listed_and_reads_back_the_bytes_its_receipts_hashed(store_and_dir: Any) -> None:
    store, dirpath = store_and_dir
    final, state = _save(store, dirpath, "epoch=0-step=2", 2)
    assert [str(c) for c in store.checkpoints(dirpath)] == [str(final)]
    manifest = read_manifest(final, store=store)
    assert manifest.step == 2 and is_checkpoint(final, store=store)
    entry = manifest.files[SHARED_STATE_FILE]
    assert store.size(final, SHARED_STATE_FILE) == entry.size
    assert store.digest(final, SHARED_STATE_FILE, lambda n: None, manifest.hash_algorithm) == entry.hash
    with store.local_copy(final, [SHARED_STATE_FILE]) as local:
        loaded = torch.load(local / SHARED_STATE_FILE, weights_only=True)
    assert_bitwise_equal(state, loaded, "state")
    assert verify_checkpoint(final, store=store).intact
    assert str(latest_recoverable(dirpath, store=store)) == str(final)


def test_nothing_is_a_checkpoint_before_its_publish_and_a_discard_leaves_none(store_and_dir: Any) -> None:
    store, dirpath = store_and_dir
    final, _ = _save(store, dirpath, "epoch=0-step=4", 4, publish=False)
    assert store.checkpoints(dirpath) == [] and not is_checkpoint(final, store=store)
    assert committed_checkpoints(dirpath, store=store) == []
    store.discard(final, "tok")
    store.clean_leftovers(dirpath)  # what an interrupted save leaves: not listed, then removed
    assert store.checkpoints(dirpath) == [] and store.read(final, MANIFEST_NAME) is None


def test_missing_files_read_as_none_and_an_absent_dirpath_lists_nothing(store_and_dir: Any) -> None:
    store, dirpath = store_and_dir
    assert store.checkpoints(join(dirpath, "never-written")) == []
    final, _ = _save(store, dirpath, "epoch=0-step=2", 2)
    assert store.read(final, "no-such-file.json") is None and store.size(final, "no-such-file.pt") is None
    assert store.describe(final, SHARED_STATE_FILE).endswith(SHARED_STATE_FILE)


def test_a_document_put_beside_the_manifest_replaces_the_last_one(store_and_dir: Any) -> None:
    store, dirpath = store_and_dir
    final, _ = _save(store, dirpath, "epoch=0-step=2", 2)
    store.put(final, "note.json", b'{"n": 1}')
    store.put(final, "note.json", b'{"n": 2}')
    assert store.read(final, "note.json") == b'{"n": 2}'
    assert read_manifest(final, store=store).step == 2  # the manifest is untouched


def test_a_save_over_a_checkpoint_of_the_same_name_replaces_it_whole(store_and_dir: Any) -> None:
    store, dirpath = store_and_dir
    _save(store, dirpath, "last", 2)
    final, _ = _save(store, dirpath, "last", 6)
    assert [str(c) for c in store.checkpoints(dirpath)] == [str(final)]
    assert read_manifest(final, store=store).step == 6 and verify_checkpoint(final, store=store).intact


def test_removal_unlists_a_checkpoint_and_the_older_one_becomes_the_latest(store_and_dir: Any) -> None:
    store, dirpath = store_and_dir
    older, _ = _save(store, dirpath, "epoch=0-step=2", 2)
    newer, _ = _save(store, dirpath, "epoch=0-step=4", 4)
    assert [e.manifest.step for e in committed_checkpoints(dirpath, store=store) if e.manifest] == [4, 2]
    store.remove(newer)
    assert [str(c) for c in store.checkpoints(dirpath)] == [str(older)]
    assert store.read(newer, MANIFEST_NAME) is None
    assert str(latest_recoverable(dirpath, store=store)) == str(older)


def test_a_changed_payload_is_named_by_verification_and_skipped_for_the_older_save(store_and_dir: Any) -> None:
    store, dirpath = store_and_dir
    older, _ = _save(store, dirpath, "epoch=0-step=2", 2)
    newer, _ = _save(store, dirpath, "epoch=0-step=4", 4)
    with store.local_copy(newer, [SHARED_STATE_FILE]) as local:
        data = bytearray((local / SHARED_STATE_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the hash can tell
    store.put(newer, SHARED_STATE_FILE, bytes(data))
    report = verify_checkpoint(newer, store=store)
    assert not report.intact and len(report.problems) == 1
    assert store.describe(newer, SHARED_STATE_FILE) in report.problems[0] and "content hash" in report.problems[0]
    assert str(latest_recoverable(dirpath, store=store)) == str(older)


def test_store_for_picks_one_store_per_kind_of_location_and_keeps_a_given_reader(tmp_path: Path) -> None:
    assert isinstance(store_for(tmp_path), LocalStore) and isinstance(store_for(f"file://{tmp_path}"), LocalStore)
    assert isinstance(store_for("s3://bucket/ckpts", {"anon": True}), ObjectStore)
    assert store_for("s3://bucket/ckpts", {"anon": True}).storage_options["anon"] is True  # type: ignore[attr-defined]
    given = MemoryStore()
    assert store_for(tmp_path, given=given) is given  # type: ignore[arg-type]

    class WritesOnly(LocalStore):
        checkpoints = None  # type: ignore[assignment]  # an earlier version's store: the writing half

    assert isinstance(store_for(tmp_path, given=WritesOnly()), LocalStore)


# ------------------------------------------------------------------ a Trainer through a user's store
@pytest.mark.slow
@pytest.mark.parametrize("users_store", ["memory", "sqlite"])
def test_a_trainer_saves_into_and_resumes_from_a_users_store_exactly_as_from_a_local_folder(
    tmp_path: Path, quiet_lightning: None, users_store: str
) -> None:
    """The same fit (4 steps, resumed from step 2 to 4) with plain local checkpoints and with the
    user's store: every write and every read goes through the store, and both end bitwise alike."""
    def fit(root: Path, store: Any, dirpath: Any, max_steps: int, ckpt_path: Any = None) -> BoringModel:
        torch.manual_seed(0)
        model = BoringModel()
        trainer = make_trainer(root, max_steps, dirpath=dirpath, store=store)
        trainer.fit(model, ckpt_path=ckpt_path)
        return model

    local_dir = tmp_path / "local" / "ckpts"
    fit(tmp_path / "local", None, local_dir, 2)
    plain = fit(tmp_path / "local", None, local_dir, 4, ckpt_path=local_dir / "epoch=0-step=2")

    users = MemoryStore() if users_store == "memory" else SqliteStore(str(tmp_path / "checkpoints.db"))
    dirpath = tmp_path / "users" / "ckpts"  # a name the store keys by: nothing is written there
    fit(tmp_path / "users", users, dirpath, 2)
    assert [Path(c).name for c in users.checkpoints(dirpath)] == ["epoch=0-step=2"]
    assert not dirpath.exists() or not any(dirpath.iterdir()), "the user's store was bypassed"
    with pytest.raises(ValueError, match=r'ckpt_path="last" found .*epoch=0-step=2 in the store given'):
        fit(tmp_path / "users", users, dirpath, 4, ckpt_path="last")  # Lightning would start over: refused
    resumed = fit(tmp_path / "users", users, dirpath, 4, ckpt_path=latest_recoverable(dirpath, store=users))
    assert sorted(Path(c).name for c in users.checkpoints(dirpath)) == ["epoch=0-step=2", "epoch=0-step=4"]
    assert_bitwise_equal(plain.state_dict(), resumed.state_dict(), "weights after the resume")
    step4 = join(dirpath, "epoch=0-step=4")
    assert read_manifest(step4, store=users).step == 4 and verify_checkpoint(step4, store=users).intact  # type: ignore[arg-type]


def test_a_checkpointer_saves_restores_and_retains_through_every_store(store_and_dir: Any) -> None:
    store, dirpath = store_and_dir
    checkpointer = Checkpointer(dirpath, store=store, keep=1)
    assert not location_exists(dirpath, store=store)
    model = torch.nn.Linear(3, 2)
    checkpointer.save({"model": model}, step=1)
    with torch.no_grad():
        model.weight.add_(1.0)
    newest = checkpointer.save({"model": model}, step=2)
    assert [str(e.path) for e in checkpointer.committed()] == [str(newest)]  # keep=1 removed step 1
    assert location_exists(dirpath, store=store) and not location_exists(join(dirpath, "never"), store=store)
    fresh = torch.nn.Linear(3, 2)
    restored = checkpointer.restore({"model": fresh})
    assert restored is not None and restored.step == 2
    assert_bitwise_equal(model.state_dict(), fresh.state_dict(), "model")
