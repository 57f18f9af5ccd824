"""The commit protocol's pieces: hashing while writing, atomic publication, hidden leftovers, retention."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import blake3
import pytest
import torch

from lightning_field import Checkpointer
from lightning_field.checkpoint import commit, committed_checkpoints, latest_recoverable, read_last_pointer
from lightning_field.checkpoint.manifest_checkpoint import ManifestCheckpoint
from lightning_field.checkpoint.stores.base import save_durably, write_rank_files
from lightning_field.checkpoint.stores.local import clean_leftovers, publish
from lightning_field.core.fsio import HashingWriter, atomic_write_bytes, exchange_or_replace_dir
from lightning_field.core.hashing import hash_file
from lightning_field.core.manifest import FORMAT, FileEntry, Manifest, ManifestError, read_manifest


def test_hash_computed_while_writing_equals_a_second_read_of_the_file(tmp_path: Path) -> None:
    state = {"w": torch.randn(1000, 100), "step": 3}
    size, digest = save_durably(state, tmp_path / "s.pt")
    data = (tmp_path / "s.pt").read_bytes()
    assert size == len(data) and digest == blake3.blake3(data).hexdigest() == hash_file(tmp_path / "s.pt")[1]
    assert torch.equal(torch.load(tmp_path / "s.pt")["w"], state["w"])


def test_hashing_writer_refuses_to_overwrite_an_existing_file(tmp_path: Path) -> None:
    (tmp_path / "x").write_bytes(b"old")
    with pytest.raises(FileExistsError):
        HashingWriter(tmp_path / "x")
    assert (tmp_path / "x").read_bytes() == b"old"


def test_atomic_write_replaces_content_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    atomic_write_bytes(tmp_path / "LAST", b"a\n")
    atomic_write_bytes(tmp_path / "LAST", b"b\n")
    assert (tmp_path / "LAST").read_bytes() == b"b\n" and os.listdir(tmp_path) == ["LAST"]


def test_publishing_over_an_existing_checkpoint_swaps_it_atomically(tmp_path: Path) -> None:
    old, new = tmp_path / "ckpt", tmp_path / ".tmp-ckpt"
    old.mkdir()
    (old / "f").write_text("old")
    new.mkdir()
    (new / "f").write_text("new")
    leftover = exchange_or_replace_dir(new, old)
    assert (old / "f").read_text() == "new"
    assert leftover is not None and (leftover / "f").read_text() == "old"


def _fake_checkpoint(root: Path, name: str, step: int, recoverable: bool = True) -> Path:
    directory = root / name
    directory.mkdir(parents=True)
    size, digest = save_durably({"step": step}, directory / "state.pt")
    Manifest(
        name=name,
        step=step,
        epoch=0,
        world_size=1,
        files={"state.pt": FileEntry(size, digest, 0, ["model"])},
        components={"model": [0]},
        recoverable=recoverable,
        missing=[] if recoverable else ["data_position"],
    ).write(directory)
    return directory


def test_resolver_ignores_hidden_in_flight_directories_and_prefers_the_newest_step(tmp_path: Path) -> None:
    _fake_checkpoint(tmp_path, "a", 5)
    _fake_checkpoint(tmp_path, "b", 10)
    _fake_checkpoint(tmp_path, ".tmp-c-1234", 15)  # a save that never committed
    _fake_checkpoint(tmp_path, "d", 20, recoverable=False)
    assert [e.path.name for e in committed_checkpoints(tmp_path)] == ["d", "b", "a"]
    assert latest_recoverable(tmp_path) == tmp_path / "b"
    assert clean_leftovers(tmp_path) == [tmp_path / ".tmp-c-1234"]


def test_publish_writes_manifest_last_and_points_last_at_the_new_checkpoint(tmp_path: Path) -> None:
    tmp = tmp_path / ".tmp-x-1"
    outcome = write_rank_files(tmp, 0, {"state.pt": ({"a": 1}, ["model"])})
    assert outcome.error is None and not (tmp / "manifest.json").exists()
    manifest = Manifest("x", 1, 0, 1, commit.manifest_files([outcome]), {"model": [0]}, True, [])
    publish(tmp, tmp_path / "x", manifest)
    assert read_manifest(tmp_path / "x").format == FORMAT
    assert read_last_pointer(tmp_path) == tmp_path / "x" and not tmp.exists()


def test_a_rank_write_error_is_returned_not_raised_so_every_rank_reaches_the_exchange(tmp_path: Path) -> None:
    outcome = write_rank_files(tmp_path / ".tmp-y", 1, {"state.pt": (lambda: None, ["model"])})
    assert outcome.error is not None and outcome.rank == 1 and outcome.receipts == []


def test_manifest_of_an_unknown_format_is_rejected_by_name(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text('{"format": "other/9"}')
    with pytest.raises(ManifestError, match="unsupported checkpoint format 'other/9'"):
        read_manifest(tmp_path)


def test_retention_never_deletes_the_only_recoverable_checkpoint(tmp_path: Path) -> None:
    only = _fake_checkpoint(tmp_path, "good", 5)
    _fake_checkpoint(tmp_path, "newer-but-incomplete", 10, recoverable=False)
    callback = ManifestCheckpoint(dirpath=tmp_path)
    assert callback.protection_reason(str(only)) == "it is the only recoverable checkpoint"
    _fake_checkpoint(tmp_path, "another-good", 15)
    assert callback.protection_reason(str(only)) is None


def test_top_k_with_save_last_keeps_only_the_newest_checkpoint(tmp_path: Path) -> None:
    from conftest import make_trainer

    from lightning_field.workloads.demo import DemoDataModule, DemoRegressor

    trainer = make_trainer(tmp_path, 6, every_n_train_steps=1, save_top_k=1, save_last=True)
    trainer.fit(DemoRegressor(), datamodule=DemoDataModule(size=64))
    assert [e.path.name for e in committed_checkpoints(tmp_path / "ckpts")] == ["epoch=0-step=6"]
    assert read_last_pointer(tmp_path / "ckpts") == tmp_path / "ckpts" / "epoch=0-step=6"


def test_our_saves_skip_the_zip_crc_and_a_users_torch_save_in_another_thread_keeps_it(tmp_path: Path) -> None:
    import threading
    import zipfile

    state = {"w": torch.randn(64, 1024, 16), "step": 3}
    done = threading.Event()

    def ours() -> None:
        for i in range(5):
            save_durably(state, tmp_path / f"ours-{i}.pt")
        done.set()

    saver = threading.Thread(target=ours)
    saver.start()
    users = 0
    # The user's own saves, concurrently with ours; never past the saver's end (a saver that died
    # would otherwise leave this loop filling the disk).
    while (saver.is_alive() and not done.is_set()) or users == 0:
        torch.save({"x": torch.arange(10_000)}, tmp_path / f"user-{users}.pt")
        assert torch.serialization.get_crc32_options()  # the process-wide flag is never touched
        users += 1
    saver.join()
    assert done.is_set(), "our saver thread died (its exception is printed above)"
    for i in range(users):
        with zipfile.ZipFile(tmp_path / f"user-{i}.pt") as user_file:
            assert user_file.testzip() is None and all(info.CRC for info in user_file.infolist())
    for i in range(5):
        with zipfile.ZipFile(tmp_path / f"ours-{i}.pt") as our_file:
            assert all(info.CRC == 0 for info in our_file.infolist())  # no CRC computed
        assert torch.equal(torch.load(tmp_path / f"ours-{i}.pt")["w"], state["w"])  # a plain torch.load


def test_both_shipped_stores_are_checkpoint_stores_and_anything_else_is_refused_by_name(tmp_path: Path) -> None:
    from lightning_field import ManifestCheckpoint
    from lightning_field.checkpoint.stores import CheckpointStore, LocalStore, ObjectStore

    assert isinstance(LocalStore(), CheckpointStore) and isinstance(ObjectStore(), CheckpointStore)
    assert LocalStore.writes_in_place and not ObjectStore.writes_in_place
    given = LocalStore()
    assert ManifestCheckpoint(dirpath=tmp_path, store=given)._store is given
    with pytest.raises(TypeError, match=r"store must implement .*CheckpointStore .* got dict"):
        ManifestCheckpoint(dirpath=tmp_path, store={})


TWO_RANKS_FAILING_ALONE = """
import sys
from pathlib import Path
import torch
import torch.distributed as dist
from lightning_field import Checkpointer
from lightning_field.checkpoint.commit import SaveJob, commit_save
from lightning_field.checkpoint.stores import LocalStore
from lightning_field.core.manifest import rank_state_file

dist.init_process_group("gloo")
rank, root = dist.get_rank(), Path(sys.argv[1])
said = open(root / f"said-rank{rank}.txt", "w")  # a file per rank: two ranks' prints into one pipe interleave

class Failing(LocalStore):
    def __init__(self, how):
        super().__init__()
        self.how = how

    def prepare(self, final):
        if self.how == "prepare":
            raise OSError(28, "No space left on device")
        return super().prepare(final)

    def staging(self, final, token):
        if self.how == "staging" and rank == 1:
            raise OSError(28, "No space left on device")
        return super().staging(final, token)

for how in ("prepare", "staging"):  # rank 0's preparation; one rank's staging of a sharded (DCP) save
    job = SaveJob(
        final=root / how / "step=1", store=Failing(how), rank=rank, is_global_zero=rank == 0, step=1, epoch=0,
        world_size=2, files={rank_state_file(rank): ({"rng": {}}, ["rng"])}, rank_missing=[], data_restore=[],
        stream_positions=[], shared_components=[], shared_missing=[], start=0.0,
        shards={"state_dict": {"w": torch.ones(4)}} if how == "staging" else None,
    )
    print(f"{how} rank {rank}: {commit_save(job)}", file=said, flush=True)

# A restore where rank 0's directory holds a checkpoint and rank 1's none (a node whose disk was lost).
try:
    Checkpointer(root / "restore" / f"rank{rank}").restore({"model": torch.nn.Linear(2, 2)}, missing_ok=True)
    print(f"restore rank {rank}: restored", file=said, flush=True)
except Exception as err:
    print(f"restore rank {rank}: {type(err).__name__}: {err}", file=said, flush=True)
dist.destroy_process_group()
"""


@pytest.mark.slow  # two processes under torchrun
def test_a_failure_on_one_rank_before_a_collective_is_every_ranks_error_and_no_rank_waits(tmp_path: Path) -> None:
    # Rank 0's preparation of the hidden directory, one rank's staging of a sharded save, and a restore
    # whose ranks resolve different checkpoints: no rank may leave the others in a collective it skips.
    Checkpointer(tmp_path / "ckpts" / "restore" / "rank0").save({"model": torch.nn.Linear(2, 2)}, step=1)
    script = tmp_path / "two_ranks.py"
    script.write_text(TWO_RANKS_FAILING_ALONE)
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script),
         str(tmp_path / "ckpts")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    text = "".join((tmp_path / "ckpts" / f"said-rank{rank}.txt").read_text() for rank in (0, 1))
    lines = text.splitlines()
    for how, expected in {
        "prepare": "rank 0 (prepare)",
        "staging": "rank 1: staging the distributed checkpoint failed",
    }.items():
        said = [line for line in lines if line.startswith(f"{how} rank ")]
        assert len(said) == 2 and all(expected in line and "No space left" in line for line in said), lines
        assert not committed_checkpoints(tmp_path / "ckpts" / how)
    refused = [line for line in lines if line.startswith("restore rank ")]
    assert len(refused) == 2, lines
    assert all("CheckpointError: the ranks resolved different checkpoints" in line for line in refused), lines
    assert "rank 1: None" in text and "rank0" in text  # each rank's pick named
