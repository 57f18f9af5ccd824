"""The char-GPT workload: real standard-library text read deterministically, a model that learns, and
checkpoints of it that are recovery points (an interrupted run resumes bit-exactly)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from conftest import assert_bitwise_equal, run_child
from lightning.pytorch.callbacks import Callback
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

from lightning_field import ManifestCheckpoint, latest_recoverable, read_manifest
from lightning_field.workloads.char_gpt import TINY_DATA, TINY_MODEL, CharGPT
from lightning_field.workloads.stdlib_corpus import (
    EXCLUDED_ANYWHERE,
    EXCLUDED_TOP_LEVEL,
    CorpusTooSmallError,
    stdlib_source_files,
)
from lightning_field.workloads.stdlib_text import StdlibTextDataModule

EXAMPLE = Path(__file__).parent.parent / "examples" / "existing_trainer.py"


def _trainer(root: Path, max_steps: int, callbacks: list[Callback], val_every: int | None = None) -> pl.Trainer:
    return pl.Trainer(
        default_root_dir=root,
        max_steps=max_steps,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        val_check_interval=val_every,
        limit_val_batches=2 if val_every else 0,
        callbacks=callbacks,
    )


class _LossTrace(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, idx: int) -> None:
        self.losses.append(float(outputs["loss"]))


class _CrashAtStep(Callback):
    """Stand-in for a crash: raise before the step after ``step`` (the save of ``step`` is committed)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, idx: int) -> None:
        if trainer.global_step == self.step:
            raise RuntimeError(f"simulated crash after step {self.step}")


def test_corpus_is_read_from_the_stdlib_deterministically_with_val_from_held_out_files() -> None:
    first, second = StdlibTextDataModule(**TINY_DATA), StdlibTextDataModule(**TINY_DATA)
    assert first.fingerprint() == second.fingerprint()
    a, b = first.corpus, second.corpus
    assert torch.equal(a.train, b.train) and torch.equal(a.val, b.val)
    assert a.val_paths and set(a.train_paths).isdisjoint(a.val_paths)
    info = a.info
    assert info.bytes == info.train_bytes + info.val_bytes <= TINY_DATA["max_chars"]
    assert info.files == len(a.train_paths) + len(a.val_paths)
    # Files in sorted-path order from the real library, none of them tests or vendored packages.
    candidates = [p.as_posix() for p in stdlib_source_files()]
    chosen = sorted(a.train_paths + a.val_paths)
    assert chosen == [p for p in candidates if p in set(chosen)]
    assert not any(p.split("/")[0] in EXCLUDED_TOP_LEVEL for p in candidates)
    assert not any(set(p.split("/")[:-1]) & EXCLUDED_ANYWHERE for p in candidates)
    assert 2.0 < info.unigram_entropy_nats < 5.55  # real text: well below uniform bytes (ln 256)

    first.setup("fit")
    second.setup("fit")
    assert torch.equal(first.train_set.offsets, second.train_set.offsets)
    item = first.train_set[3]
    assert item["input_ids"].shape == (TINY_DATA["block_size"],)
    assert torch.equal(item["input_ids"][1:], item["labels"][:-1])
    other_seed = StdlibTextDataModule(**{**TINY_DATA, "seed": 1})
    other_seed.setup("fit")
    assert not torch.equal(first.train_set.offsets, other_seed.train_set.offsets)
    assert other_seed.fingerprint() == first.fingerprint()  # same text; the windows are config


def test_fingerprint_changes_when_one_byte_of_the_library_changes(tmp_path: Path) -> None:
    def fingerprint(text: str) -> str:
        root = tmp_path / text[:3]
        for i in range(4):
            (root / "pkg").mkdir(parents=True, exist_ok=True)
            (root / "pkg" / f"mod{i}.py").write_text("x = 1\n" * 20 + text)
        (root / "test").mkdir()
        (root / "test" / "test_ignored.py").write_text("ignored\n" * 100)
        return StdlibTextDataModule(block_size=8, val_every_kth_file=2, stdlib_dir=str(root)).fingerprint()

    assert fingerprint("aaa\n") != fingerprint("aab\n")


def test_too_little_text_is_a_clear_error_naming_the_remedy(tmp_path: Path) -> None:
    with pytest.raises(CorpusTooSmallError, match=r"max_chars=100\b.*0 val bytes.*Raise max_chars"):
        StdlibTextDataModule(max_chars=100).setup("fit")
    with pytest.raises(CorpusTooSmallError, match=r"0 source file\(s\)"):
        StdlibTextDataModule(stdlib_dir=str(tmp_path)).setup("fit")
    with pytest.raises(ValueError, match="val_every_kth_file must be >= 2"):
        StdlibTextDataModule(val_every_kth_file=1)


@pytest.mark.slow
def test_tiny_model_loss_falls_within_a_few_dozen_steps(tmp_path: Path) -> None:
    pl.seed_everything(0, verbose=False)
    trace = _LossTrace()
    model = CharGPT(**TINY_MODEL)
    trainer = _trainer(tmp_path, 30, [trace], val_every=10)
    trainer.fit(model, datamodule=StdlibTextDataModule(**TINY_DATA))
    assert len(trace.losses) == 30
    assert trace.losses[0] > 5.0  # ~ln 256 at initialisation
    assert sum(trace.losses[-5:]) / 5 < trace.losses[0] - 1.5
    assert trainer.callback_metrics["val_loss"] < 4.0
    assert torch.isclose(
        trainer.callback_metrics["val_bpc"], trainer.callback_metrics["val_loss"] / torch.log(torch.tensor(2.0))
    )


def test_flops_per_batch_is_the_documented_formula_and_matches_counted_matmuls() -> None:
    model = CharGPT(**TINY_MODEL)
    assert model.flops_per_batch is None  # no batch seen yet: the batch size belongs to the data
    hp = model.hparams
    tokens = 4 * hp.block_size
    expected = (6 * model.matmul_parameters + 12 * hp.n_layer * hp.n_embd * hp.block_size) * tokens
    model._last_batch_tokens = tokens
    assert model.flops_per_batch == expected
    ids = torch.randint(0, 256, (4, hp.block_size))
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(ids).flatten(0, 1), ids.flatten()).backward()
    # The counter sees the matmuls (6·N·tokens) and may or may not see the attention kernel.
    assert 0.95 * 6 * model.matmul_parameters * tokens <= counter.get_total_flops() <= 1.05 * expected


@pytest.mark.parametrize(
    ("crash_after", "total"),
    [(12, 20), (52, 60)],  # 50 batches per epoch: mid-epoch, and resumed from the end of epoch 0
    ids=["mid_epoch", "epoch_end"],
)
@pytest.mark.slow
def test_interrupted_tiny_run_resumes_bit_exactly_from_a_recoverable_manifest_checkpoint(
    tmp_path: Path, crash_after: int, total: int
) -> None:
    def fit(root: Path, *extra: Callback, ckpt_path: str | None = None) -> tuple[CharGPT, pl.Trainer]:
        pl.seed_everything(0, verbose=False)
        checkpoint = ManifestCheckpoint(dirpath=root / "ckpts", every_n_train_steps=5, save_top_k=-1)
        model = CharGPT(**{**TINY_MODEL, "max_steps": total})
        trainer = _trainer(root, total, [checkpoint, *extra], val_every=5)
        trainer.fit(model, datamodule=StdlibTextDataModule(**TINY_DATA), ckpt_path=ckpt_path)
        return model, trainer

    expected, expected_trainer = fit(tmp_path / "uninterrupted")
    with pytest.raises(RuntimeError, match=f"simulated crash after step {crash_after}"):
        fit(tmp_path / "interrupted", _CrashAtStep(crash_after))
    # The exception was raised between steps: the step it reached is saved (a resume point, "failed-<step>").
    latest = latest_recoverable(tmp_path / "interrupted" / "ckpts")
    assert latest is not None and latest.name == f"failed-step={crash_after}"
    manifest = read_manifest(latest)
    assert manifest.recoverable, manifest.missing
    assert {"rng", "data_position"} <= set(manifest.components)
    assert manifest.provenance["data"]["fingerprint"] == StdlibTextDataModule(**TINY_DATA).fingerprint()

    resumed, resumed_trainer = fit(tmp_path / "interrupted", ckpt_path="last")
    assert resumed_trainer.global_step == expected_trainer.global_step == total
    assert_bitwise_equal(expected.state_dict(), resumed.state_dict(), "weights")
    assert_bitwise_equal(
        expected_trainer.optimizers[0].state_dict(), resumed_trainer.optimizers[0].state_dict(), "optimizer"
    )


@pytest.mark.slow
def test_example_script_tiny_run_leaves_a_recoverable_checkpoint_that_the_same_command_resumes(
    tmp_path: Path,
) -> None:
    root = tmp_path / "run"
    first = run_child([EXAMPLE, "--tiny", "--root", root], timeout=120)
    assert first.returncode == 0, first.stdout[-4000:]
    assert "Time to quality (val_loss <=" in first.stdout
    latest = latest_recoverable(root / "checkpoints")
    assert latest is not None and latest.name == f"epoch=0-step={TINY_MODEL['max_steps']}"
    manifest = read_manifest(latest)
    assert manifest.recoverable, manifest.missing
    assert manifest.provenance["data"]["fingerprint"].startswith("stdlib python")
    assert (root / "logs" / "version_0" / "metrics.csv").is_file()

    again = run_child([EXAMPLE, "--tiny", "--root", root], timeout=120)
    assert again.returncode == 0, again.stdout[-4000:]
    assert f"Restoring states from the checkpoint path at {latest}" in again.stdout
