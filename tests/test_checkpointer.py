"""The checkpoint core without Lightning: ``Checkpointer`` commits, resolves, verifies, retains and
restores a plain PyTorch loop, and the resolver's verification is the load's (no file hashed twice)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import make_trainer
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.demos.boring_classes import BoringModel
from torch import nn

from lightning_field import Checkpointer, verify_checkpoint
from lightning_field.checkpoint import CheckpointCorruptError, NothingToRestoreError, capture
from lightning_field.checkpoint.stores import LocalStore
from lightning_field.core.manifest import (
    MANIFEST_NAME,
    RANK_COMPONENTS,
    SHARED_STATE_FILE,
    read_manifest,
    write_drill_record,
)
from lightning_field.core.storage import Location, same_location

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from memory_store import MemoryStore

TOTAL_STEPS = 8


def make_loop() -> tuple[nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(0)
    # Dropout draws from the global RNG every step: a continuation is exact only if it is restored.
    model = nn.Sequential(nn.Linear(6, 16), nn.Dropout(0.3), nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    return model, optimizer, scheduler


def train(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, steps: range) -> None:
    for step in steps:
        batch = torch.arange(6 * 4, dtype=torch.float32).reshape(4, 6) / (step + 1)
        loss = model(batch).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()


def uninterrupted() -> dict[str, torch.Tensor]:
    model, optimizer, scheduler = make_loop()
    train(model, optimizer, scheduler, range(TOTAL_STEPS))
    return model.state_dict()


def states_of(loop: tuple[Any, ...]) -> dict[str, Any]:
    return dict(zip(["model", "optimizer", "scheduler"], loop, strict=True))


def bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def interrupted_with(save: Callable[[dict[str, Any], int], None], restore: Callable[[dict[str, Any]], None]) -> Any:
    """Train half, save, scramble the process's RNG (a new process would start elsewhere), restore
    into fresh objects, train the rest."""
    loop = make_loop()
    train(*loop, range(TOTAL_STEPS // 2))
    save(states_of(loop), TOTAL_STEPS // 2)
    torch.manual_seed(12345)
    fresh = make_loop()
    torch.manual_seed(999)
    restore(states_of(fresh))
    train(*fresh, range(TOTAL_STEPS // 2, TOTAL_STEPS))
    return fresh[0].state_dict()


def test_a_plain_loop_restored_by_the_checkpointer_continues_bitwise_where_torch_save_of_its_state_dicts_does_not(
    tmp_path: Path,
) -> None:
    expected = uninterrupted()
    checkpointer = Checkpointer(tmp_path / "ckpts")
    ours = interrupted_with(
        lambda states, step: checkpointer.save(states, step=step),
        lambda states: checkpointer.restore(states),
    )
    plain_file = tmp_path / "plain.pt"
    plain = interrupted_with(
        lambda states, step: torch.save({k: v.state_dict() for k, v in states.items()}, plain_file),
        lambda states: [v.load_state_dict(torch.load(plain_file)[k]) for k, v in states.items()],
    )
    assert bitwise_equal(ours, expected)
    assert not bitwise_equal(plain, expected)  # the comparison can fail: the RNG was not restored
    manifest = read_manifest(tmp_path / "ckpts" / f"step={TOTAL_STEPS // 2}")
    assert manifest.recoverable and set(manifest.components) == {"model", "optimizer", "scheduler", "rng"}


def test_restore_refuses_to_start_over_silently_and_names_what_a_checkpoint_lacks(tmp_path: Path) -> None:
    checkpointer = Checkpointer(tmp_path / "ckpts")
    model, optimizer, _ = make_loop()
    with pytest.raises(NothingToRestoreError, match="no recoverable checkpoint"):
        checkpointer.restore({"model": model})
    assert checkpointer.restore({"model": model}, missing_ok=True) is None
    checkpointer.save({"model": model}, step=1)
    with pytest.raises(ValueError, match="holds no optimizer"):
        checkpointer.restore({"model": model, "optimizer": optimizer})


def test_retention_keeps_the_newest_and_never_removes_the_only_recoverable_checkpoint(tmp_path: Path) -> None:
    checkpointer = Checkpointer(tmp_path / "ckpts", keep=2)
    model, _, _ = make_loop()
    for step in (1, 2, 3, 4):
        checkpointer.save({"model": model}, step=step)
    assert [e.manifest.step for e in checkpointer.committed() if e.manifest] == [4, 3]
    alone = Checkpointer(tmp_path / "alone")
    only = alone.save({"model": model}, step=1)
    assert alone.remove(only) == "it is the only recoverable checkpoint"
    assert alone.remove(tmp_path / "ckpts" / "step=4") is not None  # not in its dirpath: never removed
    assert [e.path for e in alone.committed()] == [only] and (tmp_path / "ckpts" / "step=4").is_dir()
    with pytest.raises(ValueError, match="keep must be >= 1"):
        Checkpointer(tmp_path, keep=0)


def record_drill(checkpoint: Location, outcome: str) -> None:
    """A restore drill's record beside ``checkpoint``'s manifest, as RestoreDrill writes it."""
    record = {"created_unix": read_manifest(checkpoint).created_unix, "outcome": outcome, "passed": outcome == "passed"}
    write_drill_record(checkpoint, record, outcome == "passed")


def test_retention_keeps_the_newest_drill_passed_checkpoint_until_a_newer_one_passes_and_every_failed_one(
    tmp_path: Path,
) -> None:
    checkpointer = Checkpointer(tmp_path / "ckpts")
    model, _, _ = make_loop()
    saved = {step: checkpointer.save({"model": model}, step=step) for step in (1, 2, 3, 4)}
    record_drill(saved[1], "passed")
    record_drill(saved[2], "mismatch")
    record_drill(saved[3], "error")  # says nothing about the checkpoint, for or against
    assert checkpointer.protection_reason(saved[1]) == (
        "it is the newest checkpoint whose restore drill passed (kept until a newer one passes)"
    )
    assert "restore drill found a mismatch" in (checkpointer.protection_reason(saved[2]) or "")
    assert checkpointer.protection_reason(saved[3]) is None and checkpointer.protection_reason(saved[4]) is None
    record_drill(saved[4], "passed")
    assert checkpointer.protection_reason(saved[1]) is None
    # The sweep after a newer pass: what ModelCheckpoint still retains stays; the rest of the older passes goes.
    assert checkpointer.remove_superseded_drilled(retained=lambda path: same_location(path, saved[1])) == []
    assert checkpointer.remove_superseded_drilled(retained=lambda path: False) == [saved[1]]
    assert checkpointer.remove(saved[2]) is not None and checkpointer.remove(saved[4]) is not None
    assert [e.manifest.step for e in checkpointer.committed() if e.manifest] == [4, 3, 2]


def test_a_drills_private_copy_goes_back_in_its_checkpoints_place_only_where_that_name_is_free(tmp_path: Path) -> None:
    store = LocalStore()
    checkpointer = Checkpointer(tmp_path / "ckpts")
    model, _, _ = make_loop()
    checkpoint = Path(checkpointer.save({"model": model}, step=1))
    copy = store.linked_copy(checkpoint, ".tmp-drill-step=1-abc")
    assert not store.restore_linked_copy(copy, checkpoint)  # the checkpoint is there: nothing changes
    assert copy.is_dir() and checkpoint.is_dir()
    store.remove(checkpoint)  # as retention does
    assert store.restore_linked_copy(copy, checkpoint) and not copy.exists()
    assert [e.path for e in checkpointer.committed()] == [checkpoint] and verify_checkpoint(checkpoint).intact
    assert not store.restore_linked_copy(copy, checkpoint)  # the copy is gone
    with pytest.raises(ValueError, match="not a private copy"):
        store.restore_linked_copy(checkpoint, tmp_path / "elsewhere")  # only a hidden sibling is ever renamed


def test_restore_skips_a_corrupt_newest_checkpoint_for_the_older_intact_one(tmp_path: Path) -> None:
    checkpointer = Checkpointer(tmp_path / "ckpts")
    model, _, _ = make_loop()
    checkpointer.save({"model": model}, step=1)
    newest = checkpointer.save({"model": model}, step=2)
    shared = Path(newest) / SHARED_STATE_FILE
    data = bytearray(shared.read_bytes())
    data[-10] ^= 0xFF
    shared.write_bytes(bytes(data))
    restored = checkpointer.restore({"model": model})
    assert restored is not None and restored.step == 1


def test_a_users_own_store_serves_every_save_read_and_restore_of_a_checkpointer() -> None:
    store = MemoryStore()
    checkpointer = Checkpointer("users/ckpts", store=store)  # type: ignore[arg-type]
    model, optimizer, scheduler = make_loop()
    checkpointer.save(states_of((model, optimizer, scheduler)), step=3)
    assert list(store.objects) == ["users/ckpts/step=3"]
    fresh = make_loop()
    restored = checkpointer.restore(states_of(fresh))
    assert restored is not None and restored.step == 3
    assert bitwise_equal(fresh[0].state_dict(), model.state_dict())
    assert checkpointer.verify(restored.path).intact


def counted_digests(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    hashed: Counter[str] = Counter()
    real = LocalStore.digest

    def digest(self: LocalStore, checkpoint: Path, name: str, *args: Any) -> str:
        hashed[name] += 1
        return real(self, checkpoint, name, *args)

    monkeypatch.setattr(LocalStore, "digest", digest)
    return hashed


def test_a_restore_hashes_each_file_once_because_the_resolvers_verification_is_handed_to_the_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpointer = Checkpointer(tmp_path / "ckpts")
    model, optimizer, scheduler = make_loop()
    checkpointer.save(states_of((model, optimizer, scheduler)), step=1)
    hashed = counted_digests(monkeypatch)
    assert checkpointer.restore(states_of(make_loop())) is not None
    assert hashed == {SHARED_STATE_FILE: 1, "rank-00000.pt": 1}
    # A second Checkpointer has made no verification: its load hashes what it loads.
    hashed.clear()
    Checkpointer(tmp_path / "ckpts").restore(states_of(make_loop()), checkpoint=tmp_path / "ckpts" / "step=1")
    assert hashed == {SHARED_STATE_FILE: 1, "rank-00000.pt": 1}


def test_a_file_rewritten_between_resolution_and_load_is_hashed_again_and_refused(tmp_path: Path) -> None:
    checkpointer = Checkpointer(tmp_path / "ckpts")
    model, _, _ = make_loop()
    path = checkpointer.save({"model": model}, step=1)
    assert checkpointer.latest_recoverable() == path
    assert checkpointer.verified(path) is not None
    shared = Path(path) / SHARED_STATE_FILE
    data = bytearray(shared.read_bytes())
    data[-10] ^= 0xFF  # same size: only the hash can tell
    shared.write_bytes(bytes(data))
    with pytest.raises(CheckpointCorruptError, match="content hash"):
        checkpointer.restore({"model": model}, checkpoint=path)


def test_a_checkpoint_published_again_under_a_verified_name_restores_what_it_holds_now(tmp_path: Path) -> None:
    checkpointer = Checkpointer(tmp_path / "ckpts")
    model, _, _ = make_loop()
    path = checkpointer.save({"model": model}, step=5)
    assert checkpointer.latest_recoverable() == path and checkpointer.verified(path) is not None
    with torch.no_grad():
        model[0].weight.add_(1.0)
    assert checkpointer.save({"model": model}, step=5) == path  # the same name, new bytes and manifest
    fresh, _, _ = make_loop()
    checkpointer.restore({"model": fresh}, checkpoint=path)
    assert bitwise_equal(fresh.state_dict(), model.state_dict())


def test_a_lightning_resume_from_last_hashes_each_file_of_the_checkpoint_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)  # BoringModel draws its dataset: the same seed, the same data
    make_trainer(tmp_path, max_steps=4).fit(BoringModel())
    hashed = counted_digests(monkeypatch)
    resumed = make_trainer(tmp_path, max_steps=6)
    torch.manual_seed(0)
    resumed.fit(BoringModel(), ckpt_path="last")
    assert resumed.global_step == 6
    assert hashed == {SHARED_STATE_FILE: 1, "rank-00000.pt": 1}


def test_a_lightning_resume_from_last_lists_each_manifest_once_and_the_load_reads_its_own_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    make_trainer(tmp_path, max_steps=4).fit(BoringModel())
    reads: Counter[str] = Counter()
    real = LocalStore.read

    def read(self: LocalStore, checkpoint: Path, name: str) -> bytes | None:
        if name == MANIFEST_NAME:
            reads[Path(checkpoint).name] += 1
        return real(self, checkpoint, name)

    class FirstBatch(Callback):
        seen: Counter[str] | None = None

        def on_train_batch_start(self, *args: Any) -> None:
            self.seen = self.seen if self.seen is not None else Counter(reads)

    monkeypatch.setattr(LocalStore, "read", read)
    resumed, first_batch = make_trainer(tmp_path, max_steps=5), FirstBatch()
    resumed.callbacks.append(first_batch)
    torch.manual_seed(0)
    resumed.fit(BoringModel(), ckpt_path="last")
    assert resumed.global_step == 5
    # Each listed once by the resolver; the picked one read again by the load, which verifies what it loads
    # against what its manifest says now (the resolution's hashes are reused only where that agrees).
    assert first_batch.seen == {"epoch=0-step=2": 1, "epoch=0-step=4": 2}


def test_a_manifests_components_and_missing_lists_follow_the_one_registry_of_components(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class StreamCursor(capture.Component):  # a component this Lightning checkpoint never holds
        name = "stream_cursor"

        def present(self, checkpoint: dict[str, Any], trainer: Any) -> bool:
            return "stream_cursor" in checkpoint

        def required(self, trainer: Any) -> bool:
            return True

    def manifest_of(root: Path) -> Any:
        torch.manual_seed(0)
        make_trainer(root, max_steps=2).fit(BoringModel())
        return read_manifest(root / "ckpts" / "epoch=0-step=2")

    plain = manifest_of(tmp_path / "plain")
    assert set(plain.components) <= {c.name for c in capture.COMPONENTS}
    expected = {"model", "optimizer", "lr_schedulers", "loops", "callbacks", "rng", "data_position"}
    assert expected <= set(plain.components)
    assert plain.recoverable and plain.missing == []
    monkeypatch.setattr(capture, "COMPONENTS", (*capture.COMPONENTS, StreamCursor()))
    extended = manifest_of(tmp_path / "extended")
    assert extended.missing == ["stream_cursor"] and not extended.recoverable


def test_the_plain_loop_example_run_twice_ends_bitwise_where_one_uninterrupted_run_ends(tmp_path: Path) -> None:
    from plain_loop import train  # examples/ is on the path (above)

    assert train(str(tmp_path / "twice"), 12)[0] == 0
    started, twice = train(str(tmp_path / "twice"), 23)
    assert started == 12  # it continued: it did not start over
    assert bitwise_equal(twice, train(str(tmp_path / "once"), 23)[1])
    assert [e.manifest.step for e in Checkpointer(tmp_path / "twice").committed() if e.manifest] == [23, 20]


def test_the_registrys_per_rank_components_are_what_the_lightning_free_commit_writes_to_rank_files() -> None:
    assert tuple(c.name for c in capture.COMPONENTS if c.per_rank) == RANK_COMPONENTS


WITHOUT_LIGHTNING = textwrap.dedent(
    """
    import importlib.abc, sys

    class NoLightning(importlib.abc.MetaPathFinder):  # as if Lightning were not installed
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in ("lightning", "pytorch_lightning"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoLightning())
    sys.path.insert(0, sys.argv[1])
    import torch
    from plain_loop import train

    train(sys.argv[2] + "/twice", 12)
    started, twice = train(sys.argv[2] + "/twice", 23)
    _, once = train(sys.argv[2] + "/once", 23)
    same = twice.keys() == once.keys() and all(torch.equal(twice[k], once[k]) for k in twice)
    print("started", started, "bitwise", same)
    lightning = [m for m in sys.modules if m.partition(".")[0] in ("lightning", "pytorch_lightning")]
    print("lightning modules", sorted(lightning))
    """
)


@pytest.mark.slow  # a fresh interpreter: the suite's own has Lightning imported already
def test_the_checkpoint_core_saves_and_restores_a_plain_loop_bitwise_where_lightning_cannot_be_imported(
    tmp_path: Path,
) -> None:
    examples = Path(__file__).resolve().parents[1] / "examples"
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_LIGHTNING, str(examples), str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "started 12 bitwise True" in result.stdout, result.stdout
    assert "lightning modules []" in result.stdout, result.stdout
