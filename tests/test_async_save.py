"""Async saves: the step blocks only for the host snapshot; nothing is visible, resumable or pruned
before the background commit; a writer error is reported at once and the policy decides."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from conftest import make_trainer
from lightning.pytorch.callbacks import EMAWeightAveraging, ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import CSVLogger

from lightning_field import CheckpointSaveError, ManifestCheckpoint, latest_recoverable, read_events, verify_checkpoint
from lightning_field.checkpoint import committed_checkpoints
from lightning_field.checkpoint.async_save import DeferredCopies, HostSnapshot, Stager
from lightning_field.checkpoint.stores import LocalStore, RankOutcome
from lightning_field.core.manifest import SHARED_STATE_FILE
from lightning_field.workloads.demo import DemoDataModule, DemoRegressor


class GatedStore(LocalStore):
    """The real local commit, except that writing the save of ``step`` waits for ``gate``."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.gate = threading.Event()
        self.writing = threading.Event()

    def write(self, final: Path, token: str, rank: int, files: dict[str, Any]) -> RankOutcome:
        if final.name.endswith(f"step={self.step}"):
            self.writing.set()
            assert self.gate.wait(30), "the test never opened the gate"
        return super().write(final, token, rank, files)


class FailingStore(LocalStore):
    """The real local commit, except that the save of ``step`` fails like a full disk would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def write(self, final: Path, token: str, rank: int, files: dict[str, Any]) -> RankOutcome:
        if final.name.endswith(f"step={self.step}"):
            return RankOutcome(rank, [], "the disk is full or over quota (No space left on device)")
        return super().write(final, token, rank, files)


class WhileWriting(pl.Callback):
    """At the start of the batch after the save of ``step`` (now in the writer), look around."""

    def __init__(self, store: GatedStore, ckpts: Path) -> None:
        self.store, self.ckpts = store, ckpts
        self.seen: dict[str, Any] = {}

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step != self.store.step:
            return
        assert self.store.writing.wait(30)
        callback = trainer.checkpoint_callback
        self.seen = {
            "latest": latest_recoverable(self.ckpts),
            "names": sorted(p.name for p in self.ckpts.iterdir() if not p.name.startswith(".")),
            "last_committed": callback.last_committed,
        }
        self.store.gate.set()


def _async_trainer(root: Path, max_steps: int, store: LocalStore, **options: Any) -> pl.Trainer:
    # The real commit protocol, with a gate or a fault at one step.
    return make_trainer(root, max_steps, async_save=True, store=store, **options)


@pytest.mark.slow
def test_an_async_save_is_not_resolvable_advertised_or_pruning_before_its_commit(
    tmp_path: Path, quiet_lightning: None
) -> None:
    store = GatedStore(step=4)
    ckpts = tmp_path / "ckpts"
    probe = WhileWriting(store, ckpts)
    trainer = _async_trainer(tmp_path, 6, store, save_top_k=1, monitor="step", mode="max")
    trainer.callbacks.append(probe)
    trainer.fit(DemoRegressor(), datamodule=DemoDataModule(size=64))

    # Step 4 was being written while step 5 trained: only step 2 existed for anyone else, and top-1
    # retention had not removed it yet.
    assert probe.seen["latest"] == ckpts / "epoch=0-step=2"
    assert probe.seen["names"] == ["LAST", "SNAPSHOT_LINEAGE", "epoch=0-step=2", "epoch=0-step=2.ckpt"]
    assert probe.seen["last_committed"] == (str(ckpts / "epoch=0-step=2"), 2)
    # After training: the last save committed, and retention kept only it.
    assert [e.path.name for e in committed_checkpoints(ckpts)] == ["epoch=0-step=6"]
    assert verify_checkpoint(ckpts / "epoch=0-step=6").recoverable
    committed = [e for e in read_events(tmp_path) if e["event"] == "ckpt_committed"]
    assert [e["step"] for e in committed] == [2, 4, 6]
    assert all(e["payload"]["async"] and e["payload"]["blocking_s"] >= 0 for e in committed)


@pytest.mark.slow
def test_a_failed_async_save_is_reported_at_once_and_warn_keeps_training_and_the_older_checkpoints(
    tmp_path: Path, quiet_lightning: None
) -> None:
    trainer = _async_trainer(tmp_path, 8, FailingStore(step=4), save_top_k=1, monitor="step", mode="max")
    callback = trainer.checkpoint_callback
    callback.on_save_error = "warn"
    trainer.loggers = [CSVLogger(tmp_path, name="csv", version=0)]
    with pytest.warns(UserWarning, match=r"save failed: .*step=4 was not saved: rank 0: the disk is full"):
        trainer.fit(DemoRegressor(), datamodule=DemoDataModule(size=64))
    metrics = (tmp_path / "csv" / "version_0" / "metrics.csv").read_text().splitlines()
    assert metrics[0].split(",") == ["checkpoint/save_failures", "step"], metrics
    assert metrics[1] in ("1.0,4", "1.0,5", "1.0,6"), "reported by the next step end, or the next save at the latest"
    assert trainer.global_step == 8 and callback.save_failures == 1
    events = read_events(tmp_path)
    failed = [e for e in events if e["event"] == "ckpt_save_failed"]
    assert [(e["step"], e["payload"]["path"].rsplit("/", 1)[-1]) for e in failed] == [(4, "epoch=0-step=4")]
    assert [e["step"] for e in events if e["event"] == "ckpt_committed"] == [2, 6, 8]
    # Step 4 was to replace step 2 in the top 1; it failed, so step 2 is kept (outside top-k's books).
    assert [e.path.name for e in committed_checkpoints(tmp_path / "ckpts")] == ["epoch=0-step=8", "epoch=0-step=2"]


def test_a_failed_async_save_under_the_stop_policy_stops_training_with_the_cause(
    tmp_path: Path, quiet_lightning: None
) -> None:
    trainer = _async_trainer(tmp_path, 20, FailingStore(step=4))
    with pytest.raises(CheckpointSaveError, match=r"step=4 was not saved: rank 0: the disk is full.*epoch=0-step=2"):
        trainer.fit(DemoRegressor(), datamodule=DemoDataModule(size=64))
    # Stopped at the first batch end that saw the failure, at the latest when the next save began.
    assert trainer.global_step <= 6
    assert latest_recoverable(tmp_path / "ckpts") == tmp_path / "ckpts" / "epoch=0-step=2"


def test_host_snapshot_is_independent_of_the_live_state_and_reuses_its_buffers() -> None:
    snapshot = HostSnapshot()
    weight = torch.ones(1000)
    state = {"model": {"w": weight, "tied": weight}, "loops": [{"step": 3}], "name": "x"}
    first, deferred = snapshot.take(state)
    assert len(deferred) == 0, "nothing is deferred unless its storage is named"
    weight.add_(1)
    state["loops"][0]["step"] = 4
    assert torch.equal(first["model"]["w"], torch.ones(1000)) and first["loops"][0]["step"] == 3
    assert first["model"]["w"] is first["model"]["tied"], "a tensor saved twice stays one tensor"
    buffer = first["model"]["w"]
    second, _ = snapshot.take(state)
    assert second["model"]["w"] is buffer and torch.equal(buffer, torch.full((1000,), 2.0))
    assert snapshot.nbytes == 4000
    assert snapshot.pin_memory == torch.cuda.is_available()


def test_async_save_refuses_an_unknown_error_policy_at_construction_and_when_set_later(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"on_save_error must be one of \('stop', 'warn'\), got 'ignore'"):
        ManifestCheckpoint(dirpath=tmp_path, async_save=True, on_save_error="ignore")  # type: ignore[arg-type]
    checkpoint = ManifestCheckpoint(dirpath=tmp_path, async_save=True, on_save_error="warn")
    with pytest.raises(ValueError, match=r"on_save_error must be one of \('stop', 'warn'\), got 'later'"):
        checkpoint.on_save_error = "later"  # type: ignore[assignment]
    assert checkpoint.on_save_error == "warn"
    checkpoint.on_save_error = "stop"
    assert checkpoint.on_save_error == checkpoint.async_saves.on_save_error == "stop"


# ---------------------------------------------------------------------------------------------- deferred copies
class AdamBoring(BoringModel):
    """Lightning's BoringModel with AdamW (optimizer state to copy) and an epoch-stepped scheduler."""

    def __init__(self, write_in_place_at_step: int | None = None) -> None:
        super().__init__()
        self.write_in_place_at_step = write_in_place_at_step

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=0.01)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)]

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # A tracked in-place write outside optimizer.step(), right after a save.
        if self.trainer.global_step == self.write_in_place_at_step:
            with torch.no_grad():
                self.layer.weight.mul_(0.5)


class SlowCopies:
    """Each deferred copy starts only once the training thread waits for it (or after
    ``patience`` s): the widest window in which a write the gate misses would reach the snapshot."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, patience: float = 3.0) -> None:
        self.waited = threading.Event()
        self.started_before_waiting = 0
        run, wait = DeferredCopies.run, DeferredCopies.wait

        def slow_run(copies: DeferredCopies) -> str | None:
            if not self.waited.wait(patience):
                self.started_before_waiting += 1
            self.waited.clear()
            return run(copies)

        def signalling_wait(copies: DeferredCopies) -> None:
            if not copies.done:
                self.waited.set()
            wait(copies)

        monkeypatch.setattr(DeferredCopies, "run", slow_run)
        monkeypatch.setattr(DeferredCopies, "wait", signalling_wait)


def _ours_and_plain(root: Path, max_steps: int, *extra: pl.Callback, **trainer_options: Any) -> pl.Trainer:
    ours = ManifestCheckpoint(dirpath=root / "ours", every_n_train_steps=2, save_top_k=-1, async_save=True,
                              on_save_error="warn")  # fmt: skip
    plain = ModelCheckpoint(dirpath=root / "plain", every_n_train_steps=2, save_top_k=-1, filename="{step}")
    return pl.Trainer(
        default_root_dir=root, max_steps=max_steps, accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[*extra, ours, plain], **trainer_options,
    )  # fmt: skip


def _saved_tensors(checkpoint: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Every tensor that decides the continuation, by a readable name."""
    tensors = {f"state_dict.{k}": v for k, v in checkpoint["state_dict"].items()}
    tensors |= {f"current_model_state.{k}": v for k, v in checkpoint.get("current_model_state", {}).items()}
    for i, opt in enumerate(checkpoint["optimizer_states"]):
        for param, state in opt["state"].items():
            tensors |= {f"optimizer.{i}.{param}.{k}": torch.as_tensor(v) for k, v in state.items()}
    return tensors


def _assert_same_as_plain(root: Path, steps: list[int]) -> None:
    for step in steps:
        ours = torch.load(root / "ours" / f"epoch=0-step={step}" / SHARED_STATE_FILE, weights_only=False)
        plain = torch.load(root / "plain" / f"step={step}.ckpt", weights_only=False)
        a, b = _saved_tensors(ours), _saved_tensors(plain)
        assert a.keys() == b.keys(), f"step {step}: {sorted(a.keys() ^ b.keys())}"
        differing = [k for k in a if not torch.equal(a[k], b[k])]
        assert not differing, f"step {step}: the async snapshot differs from plain Lightning's save in {differing}"


def test_async_checkpoints_hold_exactly_what_plain_lightning_saves_at_the_same_steps_despite_weight_swaps(
    tmp_path: Path, quiet_lightning: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # EMAWeightAveraging swaps the weights through .data at every validation start, right after a
    # save at the same batch end: only the copy gate (not the write counter) keeps it out.
    slow = SlowCopies(monkeypatch)
    trainer = _ours_and_plain(tmp_path, 8, EMAWeightAveraging(), val_check_interval=2, limit_val_batches=1)
    trainer.fit(AdamBoring())
    assert slow.started_before_waiting == 0, "every copy was held until the training thread needed it"
    assert trainer.checkpoint_callback.save_failures == 0
    _assert_same_as_plain(tmp_path, [2, 4, 6, 8])


@pytest.mark.slow
def test_an_async_copy_overlaps_the_next_forward_and_backward_and_the_update_waits_for_it(
    tmp_path: Path, quiet_lightning: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    backward_done = threading.Event()
    overlapped: list[bool] = []
    run = DeferredCopies.run

    def run_after_backward(copies: DeferredCopies) -> str | None:
        # Had the step waited before its closure, backward could never run while this waits.
        overlapped.append(backward_done.wait(10))
        return run(copies)

    class MarksBackward(pl.Callback):
        def on_after_backward(self, trainer: pl.Trainer, pl_module: Any) -> None:
            backward_done.set()

        def on_train_batch_end(self, *args: Any) -> None:
            backward_done.clear()

    monkeypatch.setattr(DeferredCopies, "run", run_after_backward)
    trainer = _ours_and_plain(tmp_path, 6, MarksBackward(), limit_val_batches=0)
    trainer.fit(AdamBoring())
    assert overlapped[:2] == [True, True], overlapped  # the saves at steps 2 and 4 (6 is the last step)
    _assert_same_as_plain(tmp_path, [2, 4, 6])
    waited = [e["payload"]["blocking_s"] for e in read_events(tmp_path) if e["event"] == "ckpt_committed"]
    assert len(waited) == 3


def test_a_write_in_place_before_the_copy_fails_that_save_and_later_saves_copy_everything_first(
    tmp_path: Path, quiet_lightning: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    SlowCopies(monkeypatch)
    trainer = _ours_and_plain(tmp_path, 8, limit_val_batches=0)
    callback = trainer.checkpoint_callback
    written = r"step=2 was not saved: rank 0: state\.pt: state_dict/layer\.weight was written in place"
    with pytest.warns(UserWarning, match=written):
        trainer.fit(AdamBoring(write_in_place_at_step=2))
    assert callback.save_failures == 1 and callback.copies_everything_first
    assert [e.path.name for e in committed_checkpoints(tmp_path / "ours")] == [
        "epoch=0-step=8", "epoch=0-step=6", "epoch=0-step=4"
    ]  # fmt: skip
    _assert_same_as_plain(tmp_path, [4, 6, 8])


def test_deferred_copies_detect_a_tracked_write_and_let_go_of_the_live_tensors() -> None:
    snapshot = HostSnapshot()
    weight, moment = torch.ones(1000), torch.zeros(1000)
    state = {"model": {"w": weight}, "optimizer": {"exp_avg": moment}, "other": torch.ones(3)}
    deferrable = {weight.untyped_storage().data_ptr(), moment.untyped_storage().data_ptr()}
    copied, deferred = snapshot.take(state, deferrable)
    assert len(deferred) == 2 and deferred.nbytes == 8000
    state["other"].add_(1)  # copied before take returned
    assert torch.equal(copied["other"], torch.ones(3))
    moment.add_(1)  # before its copy: the snapshot would mix two steps
    assert deferred.run() is not None and "optimizer/exp_avg was written in place" in deferred.error
    assert deferred.done and len(deferred) == 0

    copied, deferred = snapshot.take(state, deferrable)
    assert deferred.run() is None
    weight.add_(1)  # after the copy: the snapshot keeps the saved value
    assert torch.equal(copied["model"]["w"], torch.ones(1000))


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_fit_sets_the_checkpoint_up_once_and_leaves_the_users_module_as_plain_lightning_does(
    tmp_path: Path, async_save: bool
) -> None:
    """The async copy gate joins the Trainer's callbacks during ``setup``; joining them must not call
    the checkpoint's ``setup`` twice, which patched the module's ``train_dataloader`` twice and left
    one patch behind after ``fit``."""
    setups: list[str] = []

    class CountingCheckpoint(ManifestCheckpoint):
        def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
            setups.append(stage)
            super().setup(trainer, pl_module, stage)

    def fit(callback: pl.Callback, root: Path) -> dict[str, Any]:
        module = BoringModel()
        before = dict(vars(module))
        pl.Trainer(
            default_root_dir=root, max_steps=4, callbacks=[callback], logger=False, enable_progress_bar=False,
            enable_model_summary=False, limit_val_batches=0,
        ).fit(module)  # fmt: skip
        return {key: value for key, value in vars(module).items() if key not in before and not key.startswith("_")}

    plain = fit(ModelCheckpoint(dirpath=tmp_path / "plain", every_n_train_steps=2), tmp_path / "plain-run")
    ours = fit(
        CountingCheckpoint(dirpath=tmp_path / "ours", every_n_train_steps=2, async_save=async_save), tmp_path / "run"
    )
    assert ours.keys() == plain.keys(), "attributes the fit left on the module that plain Lightning does not leave"
    assert setups == ["fit"]


class CloningStager:
    """A stager of a user's own: every tensor cloned before the save returns, nothing deferred."""

    def __init__(self) -> None:
        self.takes = 0
        self.released = False

    def take(self, obj: Any, deferrable: Any = None, label: Any = None) -> tuple[Any, DeferredCopies]:
        self.takes += 1
        copies = DeferredCopies()  # empty: its run() only marks it done
        return torch.utils._pytree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, obj), copies

    @property
    def nbytes(self) -> int:
        return 0

    def release(self) -> None:
        self.released = True


def test_a_stager_of_ones_own_makes_every_async_copy_and_the_checkpoints_equal_plain_lightnings(
    tmp_path: Path, quiet_lightning: None
) -> None:
    stager = CloningStager()

    class OwnStaging(ManifestCheckpoint):
        def make_stager(self) -> Stager:
            return stager

    ours = OwnStaging(dirpath=tmp_path / "ours", every_n_train_steps=2, save_top_k=-1, async_save=True)
    plain = ModelCheckpoint(dirpath=tmp_path / "plain", every_n_train_steps=2, save_top_k=-1, filename="{step}")
    trainer = pl.Trainer(default_root_dir=tmp_path, max_steps=6, accelerator="cpu", logger=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[ours, plain])  # fmt: skip
    trainer.fit(AdamBoring())
    assert isinstance(stager, Stager) and stager.takes == 3 and stager.released
    assert ours.save_failures == 0
    _assert_same_as_plain(tmp_path, [2, 4, 6])
