"""No thread of ours starts or ends while DataLoader workers fork: background hashing and commits
run on parked threads that live as long as the process (core/workers.py says why: on CPython 3.11 a
child forked while another thread ends can wait forever in ``PyOS_AfterFork_Child``)."""

from __future__ import annotations

import multiprocessing
import threading
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from torch.utils.data import DataLoader

from lightning_field import ManifestCheckpoint, read_events
from lightning_field.core.workers import HASHING, WRITING, ThreadPark

SAVING_THREADS = (HASHING.name, WRITING.name)


def ours() -> dict[int, str]:
    """The threads that hash and commit saves (a thread still starting, in ``threading._limbo``, has no
    ident yet: it counts once it runs)."""
    return {t.ident: t.name for t in threading.enumerate() if t.name in SAVING_THREADS and t.ident}


class ThreadCensus(Callback):
    """Our threads at every step's end and at every epoch's start, where the loader's workers fork."""

    def __init__(self) -> None:
        self.seen: list[dict[int, str]] = []
        self.at_fork: list[dict[int, str]] = []

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self.seen.append(ours())

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.at_fork.append(ours())


class WideModel(BoringModel):
    """Large enough (a 2 MiB weight) that its files are hashed beside their write."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(32, 16384)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        return self.layer(batch).sum()

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=1e-4)

    def train_dataloader(self) -> DataLoader:
        # Two workers forked at every epoch's start (not persistent), as most users' loaders are.
        return DataLoader(RandomDataset(32, 16), batch_size=4, num_workers=2, multiprocessing_context="fork")


@pytest.mark.parametrize("async_save", [False, True], ids=["in-line", "async"])
def test_no_thread_of_saves_and_snapshots_ends_across_the_loaders_forks(
    tmp_path: Path, async_save: bool
) -> None:
    before = ours()  # parked by earlier tests in this process, if any: they live on, as every one does
    census = ThreadCensus()
    checkpoint = ManifestCheckpoint(
        dirpath=tmp_path / "ckpts", every_n_train_steps=2, save_top_k=-1, async_save=async_save,
        snapshot_every_n_train_steps=1, snapshot_dir=tmp_path / "shm", snapshot_in_line=False,
    )  # fmt: skip
    trainer = pl.Trainer(
        default_root_dir=tmp_path, max_epochs=4, accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, callbacks=[census, checkpoint],
    )  # fmt: skip
    trainer.fit(WideModel())
    events = read_events(tmp_path)
    assert [e["step"] for e in events if e["event"] == "ckpt_committed"][:2] == [2, 4]
    assert len([e for e in events if e["event"] == "snapshot_committed"]) >= 8
    assert any(census.seen), "no background thread was used: the test does not exercise the hazard"
    started: dict[int, str] = dict(before)
    for step, threads in enumerate(census.seen, start=1):
        ended = set(started) - set(threads)
        assert not ended, f"at step {step} these threads had ended: {[started[i] for i in ended]}"
        started.update(threads)
    # A park starts a thread only where all of its threads are busy (a snapshot's commit hashing while
    # a persistent save hashes): a handful at most, each parked for the rest of the process.
    new = sorted(name for ident, name in started.items() if ident not in before)
    assert len(new) <= 4, new
    assert set(census.at_fork[-1]) <= set(started)  # the last epoch forked with all of them alive


def test_a_parked_thread_takes_the_next_task_instead_of_a_new_thread_starting() -> None:
    park = ThreadPark("lightning-field-test")
    assert [park.submit(pow, 2, n).result() for n in range(50)] == [2**n for n in range(50)]
    assert park.threads == 1 and not park.busy
    gate = threading.Event()
    slow = park.submit(gate.wait, 10)
    fast = park.submit(sum, [1, 2, 3])  # the first is busy: a second thread takes this one
    assert fast.result(timeout=10) == 6 and park.threads == 2 and park.busy
    gate.set()
    assert slow.result(timeout=10) is True
    deadline = time.monotonic() + 10
    while park.busy and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not park.busy and park.threads == 2


def test_an_exception_in_a_task_reaches_its_caller_and_the_thread_serves_the_next() -> None:
    park = ThreadPark("lightning-field-test")
    failed = park.submit(int, "not a number")
    with pytest.raises(ValueError, match="invalid literal"):
        failed.result(timeout=10)
    assert park.submit(len, "four").result(timeout=10) == 4 and park.threads == 1


def _in_child(park: ThreadPark, out: Any) -> None:
    out.put((park.submit(sum, [1, 2]).result(timeout=10), park.threads))


def test_a_forked_child_starts_its_own_parked_thread_even_when_the_fork_came_as_a_thread_parked() -> None:
    park = ThreadPark("lightning-field-test")
    assert park.submit(abs, -1).result() == 1  # the parent's thread, parked
    context = multiprocessing.get_context("fork")
    out = context.SimpleQueue()
    with park._lock:  # the fork comes while a thread of the park holds its lock (parking itself)
        child = context.Process(target=_in_child, args=(park, out))
        child.start()
    child.join(timeout=30)
    assert child.exitcode == 0 and out.get() == (3, 1)
