"""Plain DataLoaders become resumable without a code change, and a run whose checkpoints cannot
resume exactly never starts over silently: it stops and says why, or resumes inexactly on request
and says so in every later manifest."""

from __future__ import annotations

import warnings
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_field import ManifestCheckpoint, verify_checkpoint
from lightning_field.checkpoint.manifest_checkpoint import NoRecoverableCheckpointError
from lightning_field.checkpoint.resolver import committed_checkpoints
from lightning_field.checkpoint.resume_last import resolve_last
from lightning_field.core.errors import ResumeMismatchError
from lightning_field.state.loaders import adopt_loader


def _collate(batch: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(batch) * 2


def test_a_plain_dataloader_is_recreated_as_a_stateful_one_with_every_setting_kept() -> None:
    generator = torch.Generator().manual_seed(7)
    plain = DataLoader(RandomDataset(4, 40), batch_size=5, shuffle=True, num_workers=2, collate_fn=_collate,
                       drop_last=True, generator=generator, persistent_workers=True, prefetch_factor=3)
    adoption = adopt_loader(plain)
    loader = adoption.loader
    assert adoption.adopted and adoption.resumable and isinstance(loader, StatefulDataLoader)
    assert (loader.batch_size, loader.num_workers, loader.drop_last, loader.prefetch_factor) == (5, 2, True, 3)
    assert loader.collate_fn is _collate and loader.generator is generator and loader.persistent_workers
    assert loader.sampler.generator is generator  # the user's generator still draws the shuffle
    assert loader.dataset is plain.dataset and callable(loader.state_dict)


def test_loaders_whose_position_cannot_be_restored_are_left_alone_with_the_reason() -> None:
    class OwnLoader(DataLoader):
        def __init__(self, n: int) -> None:
            super().__init__(RandomDataset(2, n), batch_size=2)

    class Shuffled(BatchSampler):  # a stateless custom batch sampler
        pass

    subclass = adopt_loader(OwnLoader(8))
    assert not subclass.adopted and "OwnLoader is not a plain DataLoader" in (subclass.reason or "")
    batches = Shuffled(SequentialSampler(range(8)), 2, False)
    custom = adopt_loader(DataLoader(RandomDataset(2, 8), batch_sampler=batches))
    assert not custom.adopted and "batch sampler Shuffled has no state_dict" in (custom.reason or "")
    already = adopt_loader(StatefulDataLoader(RandomDataset(2, 8)))
    assert not already.adopted and already.resumable


class _FixedData(Dataset):
    def __init__(self) -> None:
        self.data = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data[i]


class _UserLoader(DataLoader):
    """A DataLoader subclass with its own constructor: it cannot be re-created, so not adopted."""

    def __init__(self) -> None:
        super().__init__(_FixedData(), batch_size=8)


class _BoringWithOwnLoader(BoringModel):
    def train_dataloader(self) -> DataLoader:
        return _UserLoader()


def _trainer(root: Path, max_steps: int, **checkpoint: object) -> pl.Trainer:
    callback = ManifestCheckpoint(dirpath=root / "ckpts", every_n_train_steps=2, save_top_k=-1, **checkpoint)
    return pl.Trainer(default_root_dir=root, max_steps=max_steps, accelerator="cpu", logger=False,
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                      callbacks=[callback])


def test_unresumable_checkpoints_are_announced_once_at_the_first_save_naming_the_loader(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match="NOT recoverable") as caught:
        _trainer(tmp_path, 6).fit(_BoringWithOwnLoader())
    loud = [w for w in caught if "NOT recoverable" in str(w.message)]
    assert len(loud) == 1 and "_UserLoader is not a plain DataLoader" in str(loud[0].message)
    manifests = [e.manifest for e in committed_checkpoints(tmp_path / "ckpts")]
    assert len(manifests) == 3 and not any(m.recoverable for m in manifests if m is not None)


def test_resuming_last_from_only_unrecoverable_checkpoints_stops_lists_them_and_loses_nothing(tmp_path: Path) -> None:
    _trainer(tmp_path, 6).fit(_BoringWithOwnLoader())
    before = sorted(p.name for p in (tmp_path / "ckpts").iterdir())
    with pytest.raises(NoRecoverableCheckpointError) as refused:
        _trainer(tmp_path, 10).fit(_BoringWithOwnLoader(), ckpt_path="last")
    message = str(refused.value)
    assert "none recoverable" in message and "silently start over" in message
    assert "epoch=0-step=6: data_position" in message and "ResumeConfig(inexact=True)" in message
    assert sorted(p.name for p in (tmp_path / "ckpts").iterdir()) == before


def test_the_opt_in_resumes_the_newest_unrecoverable_checkpoint_and_marks_the_continuation_inexact(
    tmp_path: Path,
) -> None:
    _trainer(tmp_path, 6).fit(_BoringWithOwnLoader())
    trainer = _trainer(tmp_path, 10, resume_inexact=True)
    model = _BoringWithOwnLoader()
    with pytest.warns(UserWarning, match="this continuation is not exact"):
        trainer.fit(model, ckpt_path="last")
    assert trainer.global_step == 10
    newest = committed_checkpoints(tmp_path / "ckpts")[0]
    assert newest.manifest is not None and newest.manifest.step == 10
    inexact = newest.manifest.provenance["inexact_resume"]
    assert inexact["checkpoint"].endswith("epoch=0-step=6") and inexact["missing"]


def test_the_resolution_of_last_names_the_unrecoverable_pick_and_what_it_lacks_only_where_it_is_allowed(
    tmp_path: Path,
) -> None:
    _trainer(tmp_path, 6).fit(_BoringWithOwnLoader())
    with pytest.warns(UserWarning, match="NOT recoverable"):
        resolution = resolve_last(tmp_path / "ckpts", allow_inexact=True)
    assert resolution.path is not None and resolution.path.endswith("epoch=0-step=6")
    assert resolution.tier == "persistent" and resolution.inexact is not None
    assert resolution.inexact.checkpoint == resolution.path and "data_position" in resolution.inexact.missing[0]
    with pytest.raises(NoRecoverableCheckpointError):
        resolve_last(tmp_path / "ckpts")  # not allowed: refused, as the callback refuses it


def test_the_opt_in_resumes_an_explicit_unrecoverable_checkpoint_as_plain_lightning_resumes_it_marked_inexact(
    tmp_path: Path,
) -> None:
    _trainer(tmp_path, 6).fit(_BoringWithOwnLoader())
    given = committed_checkpoints(tmp_path / "ckpts")[0].path
    with pytest.raises(ResumeMismatchError, match="is not recoverable"):  # without the opt-in: refused by name
        _trainer(tmp_path / "refused", 10).fit(_BoringWithOwnLoader(), ckpt_path=str(given))
    plain = pl.Trainer(max_steps=10, default_root_dir=tmp_path / "plain", logger=False, enable_progress_bar=False,
                       enable_model_summary=False, limit_val_batches=0)  # fmt: skip
    plain.fit(_BoringWithOwnLoader(), ckpt_path=str(given / "state.pt"))  # Lightning resumes the same state file
    trainer = _trainer(tmp_path, 10, resume_inexact=True)
    with pytest.warns(UserWarning, match=r"as ResumeConfig\(inexact=True\) allows: this continuation is not exact"):
        trainer.fit(_BoringWithOwnLoader(), ckpt_path=str(given))
    assert trainer.global_step == plain.global_step == 10
    newest = committed_checkpoints(tmp_path / "ckpts")[0]
    assert newest.manifest is not None and newest.manifest.provenance["inexact_resume"]["checkpoint"] == str(given)


def test_a_first_attempt_with_ckpt_path_last_says_there_is_nothing_yet_without_lightnings_wrong_hint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = BoringModel()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = _trainer(tmp_path, 4)
        trainer.fit(model, ckpt_path="last")
    assert not [w for w in caught if "save_last=True" in str(w.message)]
    # The silencing lasted only until setup: no filter is left behind for later runs.
    assert not [f for f in warnings.filters if f[1] is not None and "no last checkpoint" in f[1].pattern]
    # BoringModel's own plain loader was adopted: its checkpoints are recoverable.
    latest = committed_checkpoints(tmp_path / "ckpts")[0].path
    assert verify_checkpoint(latest).recoverable
