"""Invisible when nothing fails: a run with our callbacks computes bit for bit the run without them.

A user who swaps ``ModelCheckpoint`` for ``ManifestCheckpoint`` at its defaults, or adds the whole
bundle, must get the weights, optimizer state, logged metrics and data order they had. Each test runs
the same seeded script with plain Lightning's ``ModelCheckpoint`` and with ours, in the same test, and
compares: a capture that drew from a random stream or reordered one shows up here as a difference.
The script is a user's, not ours: a dropout network (every step draws from the global generator), a
shuffled plain ``DataLoader``, validation twice an epoch (its loader draws a seed too) and SGD.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from torch import nn
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

from lightning_field import CheckpointCadence, ManifestCheckpoint, StragglerMonitor, TimeToQuality
from lightning_field.state.samplers import PlainOrderRandomSampler


class DropoutRegressor(pl.LightningModule):
    """What a user writes: dropout in training, a shuffled plain loader, logged train and val loss."""

    def __init__(self, workers: int = 0, lr: float = 0.01) -> None:
        super().__init__()
        self.workers, self.lr = workers, lr
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 1))
        self.seen: list[float] = []  # the data order, as the step saw it

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        self.seen.append(float(x.sum()))
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 5, 0.5)}

    def _data(self, seed: int, n: int) -> TensorDataset:
        x = torch.randn(n, 8, generator=torch.Generator().manual_seed(seed))
        return TensorDataset(x, x.sum(1, keepdim=True))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self._data(0, 64), batch_size=8, shuffle=True, num_workers=self.workers)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self._data(1, 32), batch_size=8)


class LoggedValues(Callback):
    """Every value logged, at every step and validation, as the loggers receive them."""

    def __init__(self) -> None:
        self.values: list[tuple[int, str, float]] = []

    def _record(self, trainer: pl.Trainer) -> None:
        self.values += [(trainer.global_step, k, float(v)) for k, v in sorted(trainer.callback_metrics.items())]

    def on_train_batch_end(self, trainer: pl.Trainer, *_: Any) -> None:
        self._record(trainer)

    def on_validation_end(self, trainer: pl.Trainer, *_: Any) -> None:
        self._record(trainer)


def _fit(root: Path, checkpoint: Callback, workers: int = 0, bundle: bool = False) -> dict[str, Any]:
    pl.seed_everything(7, verbose=False)
    model = DropoutRegressor(workers)
    logged = LoggedValues()
    callbacks: list[Callback] = [checkpoint, logged]
    if bundle:
        callbacks += [
            TimeToQuality(monitor="val_loss", target=0.01, deadline_hours=1, price_per_device_hour=2.5),
            CheckpointCadence(mtbf_hours=6),
            StragglerMonitor(report_interval_s=0.01),
        ]
    trainer = pl.Trainer(
        max_epochs=4, val_check_interval=0.5, callbacks=callbacks, default_root_dir=root, logger=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(model)
    return {
        "weights": {k: v.clone() for k, v in model.state_dict().items()},
        "optimizer": trainer.optimizers[0].state_dict(),
        "data_order": model.seen,
        "logged": logged.values,
        "rng": torch.get_rng_state(),
    }


def _assert_same_run(ours: dict[str, Any], plain: dict[str, Any]) -> None:
    assert ours["data_order"] == plain["data_order"], "the data order changed"
    assert ours["logged"] == plain["logged"], "the logged values changed"
    for name, tensor in plain["weights"].items():
        assert torch.equal(ours["weights"][name], tensor), f"{name} differs from plain Lightning's"
    for index, state in plain["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(ours["optimizer"]["state"][index][key], value), f"optimizer state {index}.{key} differs"
    assert torch.equal(ours["rng"], plain["rng"]), "the global generator ended elsewhere: something drew from it"


@pytest.mark.parametrize("workers", [0, 2])
def test_manifest_checkpoint_at_its_defaults_computes_the_run_model_checkpoint_computes(
    tmp_path: Path, workers: int
) -> None:
    plain = _fit(tmp_path / "plain", ModelCheckpoint(dirpath=tmp_path / "plain" / "ckpts"), workers)
    ours = _fit(tmp_path / "ours", ManifestCheckpoint(dirpath=tmp_path / "ours" / "ckpts"), workers)
    _assert_same_run(ours, plain)


def test_the_whole_bundle_computes_the_run_plain_lightning_computes(tmp_path: Path) -> None:
    plain = _fit(tmp_path / "plain", ModelCheckpoint(dirpath=tmp_path / "plain" / "ckpts"))
    checkpoint = ManifestCheckpoint(dirpath=tmp_path / "ours" / "ckpts", every_n_train_steps=4)
    ours = _fit(tmp_path / "ours", checkpoint, bundle=True)
    _assert_same_run(ours, plain)


def test_a_killed_run_resumed_across_a_validation_continues_as_the_plain_run(tmp_path: Path) -> None:
    """A checkpoint at a step that validation follows holds the streams from before that validation:
    the resume runs it again (plain Lightning counts it as done), so the continuation is the plain run's."""

    class StopAfter(Callback):
        def on_validation_start(self, trainer: pl.Trainer, *_: Any) -> None:
            if trainer.global_step == 12:  # step 12 saved, and the validation that follows it lost
                raise KeyboardInterrupt

    plain = _fit(tmp_path / "plain", ModelCheckpoint(dirpath=tmp_path / "plain" / "ckpts"))
    root = tmp_path / "ours"
    pl.seed_everything(7, verbose=False)
    interrupted = pl.Trainer(
        max_epochs=4, val_check_interval=0.5, default_root_dir=root, logger=False, enable_progress_bar=False,
        callbacks=[ManifestCheckpoint(dirpath=root / "ckpts", every_n_train_steps=12, save_on_exception=False,
                                      snapshot_every_n_train_steps=None), StopAfter()],
        enable_model_summary=False,
    )  # fmt: skip
    with pytest.raises(SystemExit):  # Lightning's way out of a KeyboardInterrupt
        interrupted.fit(DropoutRegressor())
    assert interrupted.global_step == 12
    saved = sorted(p.name for p in (root / "ckpts").iterdir() if p.name.startswith("epoch="))
    # Step 12 is epoch 1's 4th batch: val_check_interval=0.5 validates there.
    assert saved == ["epoch=1-step=12", "epoch=1-step=12.ckpt"], saved

    resumed = _fit_resumed(root)
    for name, tensor in plain["weights"].items():
        assert torch.equal(resumed["weights"][name], tensor), f"{name}: the resume left the plain run's trajectory"
    assert resumed["data_order"] == plain["data_order"][12:]
    assert torch.equal(resumed["rng"], plain["rng"])


def _fit_resumed(root: Path) -> dict[str, Any]:
    pl.seed_everything(1234, verbose=False)  # another seed: everything must come from the checkpoint
    model = DropoutRegressor()
    checkpoint = ManifestCheckpoint(dirpath=root / "ckpts", every_n_train_steps=12, snapshot_every_n_train_steps=None)
    trainer = pl.Trainer(
        max_epochs=4, val_check_interval=0.5, default_root_dir=root, logger=False, enable_progress_bar=False,
        callbacks=[checkpoint], enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(model, ckpt_path="last")
    return {"weights": model.state_dict(), "data_order": model.seen, "rng": torch.get_rng_state()}


def _orders(make: Callable[[], Any], epochs: int) -> tuple[list[list[int]], torch.Tensor]:
    torch.manual_seed(3)
    sampler = make()
    orders = [list(sampler) for _ in range(epochs)]
    return orders, torch.get_rng_state()


@pytest.mark.parametrize("replacement, num_samples", [(False, None), (False, 23), (True, None), (True, 70)])
def test_the_adopted_sampler_draws_torchs_order_from_the_same_draws(replacement: bool, num_samples: int | None) -> None:
    data = range(10)
    theirs = _orders(lambda: RandomSampler(data, replacement, num_samples), 3)
    ours = _orders(lambda: PlainOrderRandomSampler(data, replacement, num_samples), 3)
    assert ours[0] == theirs[0]
    assert torch.equal(ours[1], theirs[1])


def test_the_adopted_sampler_resumes_mid_epoch_and_draws_the_next_epoch_as_torch_does() -> None:
    torch.manual_seed(5)
    uninterrupted = PlainOrderRandomSampler(range(12))
    first = iter(uninterrupted)
    head = [next(first) for _ in range(5)]
    state, rng = first.state_dict(), torch.get_rng_state()
    rest, following = list(first), list(uninterrupted)

    torch.manual_seed(99)  # a restarted process
    resumed = iter(PlainOrderRandomSampler(range(12)))
    resumed.load_state_dict(pickle.loads(pickle.dumps(state)))
    torch.set_rng_state(rng)  # as the checkpoint restores the streams
    assert head + list(resumed) == head + rest
    assert list(PlainOrderRandomSampler(range(12))) == following  # the next epoch draws its seed as torch's


def test_a_sampler_position_without_a_seed_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="position of 3 indices names no seed"):
        iter(PlainOrderRandomSampler(range(4))).load_state_dict({"yielded": 3})


def test_the_callback_pickles_so_ddp_spawn_can_send_it(tmp_path: Path) -> None:
    checkpoint = ManifestCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=2)
    copy = pickle.loads(pickle.dumps(checkpoint))
    assert copy.dirpath == checkpoint.dirpath and copy.every_n_train_steps == 2
    trainer = pl.Trainer(max_steps=2, default_root_dir=tmp_path, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[copy], limit_val_batches=0)  # fmt: skip
    trainer.fit(BoringModel())
    assert copy.last_committed is not None and copy.last_committed[1] == 2


# The conformance column "uninterrupted, ours against plain Lightning": a row's run with no kill, with
# ManifestCheckpoint at the row's settings and with ModelCheckpoint (tests/conformance.py). The whole
# column is in docs/conformance.md; these rows are its kinds: one process, loader workers, DDP, a
# Hugging Face stream and a stream of the user's own with workers, bf16, a mid-epoch validation, and
# FSDP2 on two torchrun nodes with a snapshot (DCP shards, replicated) at every step.
UNINTERRUPTED_ROWS = ["plain-loader", "plain-loader-2-workers", "ddp-plain-loader", "hf-iterable-dataset",
                      "stream-2-workers", "bf16-mixed", "val-check-interval-half",
                      "fsdp2-snapshots-node-lost"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", UNINTERRUPTED_ROWS)
def test_a_conformance_rows_uninterrupted_run_is_plain_lightnings_bit_for_bit(
    name: str, tmp_path: Path, shared_shards: Path
) -> None:
    from conformance import uninterrupted_against_plain

    differences = uninterrupted_against_plain(name, tmp_path, shared_shards)
    assert not differences, "\n".join(differences[:5])


def test_the_tuners_suggestions_are_plain_lightnings(tmp_path: Path) -> None:
    from lightning.pytorch.tuner import Tuner

    def suggested(checkpoint: Callback) -> tuple[float | None, torch.Tensor]:
        pl.seed_everything(7, verbose=False)
        model = DropoutRegressor()
        trainer = pl.Trainer(max_epochs=2, callbacks=[checkpoint], default_root_dir=tmp_path, logger=False,
                             enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
        finder = Tuner(trainer).lr_find(model, num_training=12, min_lr=1e-4, max_lr=1.0)
        assert finder is not None
        return finder.suggestion(), torch.tensor(finder.results["loss"])

    plain = suggested(ModelCheckpoint(dirpath=tmp_path / "plain"))
    ours = suggested(ManifestCheckpoint(dirpath=tmp_path / "ours"))
    assert ours[0] == plain[0] and torch.equal(ours[1], plain[1])


@pytest.mark.parametrize(
    "state, named",
    [({"yielded": -1}, "0 to 4 indices"), ({"yielded": 9}, "0 to 4 indices"), ({"yielded": "2"}, "0 to 4"),
     ({"yielded": 1, "seed": 2**70}, "64-bit integer"), ({"yielded": 1, "seed": "7"}, "64-bit integer"),
     ({"yielded": 1, "generator": [1, 2]}, "byte tensor")],
)  # fmt: skip
def test_a_malformed_sampler_position_read_back_from_a_checkpoint_is_refused_by_name(
    state: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        iter(PlainOrderRandomSampler(range(4))).load_state_dict(state)
