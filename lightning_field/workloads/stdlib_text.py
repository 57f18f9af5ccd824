"""The char-GPT workload's DataModule: fixed byte windows of the standard library's source.

Kept apart from the corpus (``workloads.stdlib_corpus``: which files, which split, which
fingerprint) and from the model (``workloads.char_gpt``): the windows and loaders are what a
``StatefulDataLoader`` saves its position in, and the DataModule is what a config names as
``data._target_``. See ``workloads.char_gpt`` for the recommended run and its measured figures.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_field.workloads.stdlib_corpus import Corpus, CorpusInfo, read_corpus


class ByteWindows(Dataset):
    """Map-style windows of ``block_size + 1`` bytes at fixed offsets: inputs and next-byte labels.

    Fixed offsets make the dataset a deterministic function of its construction, with a length, so a
    ``StatefulDataLoader`` can save and restore its position in it exactly. Items are dicts with
    ``input_ids`` so the checkpoint and throughput code count tokens.
    """

    def __init__(self, data: torch.Tensor, offsets: torch.Tensor, block_size: int) -> None:
        self.data = data
        self.offsets = offsets
        self.block_size = block_size

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        start = int(self.offsets[index])
        window = self.data[start : start + self.block_size + 1].long()
        return {"input_ids": window[:-1], "labels": window[1:]}


class StdlibTextDataModule(pl.LightningDataModule):
    """Byte windows of the Python standard library's source, split into train and held-out files.

    Args:
        block_size: context length in bytes (inputs are ``block_size``, labels shifted by one).
        batch_size: windows per training and validation batch.
        max_chars: at most this many bytes are read (whole files in path order, the last one cut at a
            newline). The default reads the whole library (~8.8 MB for Python 3.11).
        val_every_kth_file: every k-th selected file is held out for validation.
        samples_per_epoch: training windows per epoch. Their offsets are drawn once at setup from a
            ``torch.Generator`` seeded with ``seed``; each epoch visits them in a new shuffled order.
        val_windows: fixed validation windows, evenly spaced over the held-out text.
        num_workers: loader worker processes for training.
        seed: seeds the training offsets (not the shuffle, which follows the global RNG that
            ``seed_everything`` sets and the checkpoint restores).
        stdlib_dir: read this folder instead of the running interpreter's standard library.
    """

    def __init__(
        self,
        block_size: int = 128,
        batch_size: int = 32,
        max_chars: int = 16_000_000,
        val_every_kth_file: int = 10,
        samples_per_epoch: int = 64_000,
        val_windows: int = 256,
        num_workers: int = 0,
        seed: int = 0,
        stdlib_dir: str | None = None,
    ) -> None:
        super().__init__()
        for name, value, least in (
            ("block_size", block_size, 1),
            ("batch_size", batch_size, 1),
            ("max_chars", max_chars, 1),
            ("val_every_kth_file", val_every_kth_file, 2),
            ("samples_per_epoch", samples_per_epoch, 1),
            ("val_windows", val_windows, 1),
            ("num_workers", num_workers, 0),
        ):
            if value < least:
                raise ValueError(f"StdlibTextDataModule {name} must be >= {least}, got {value}")
        self.save_hyperparameters()
        self._corpus: Corpus | None = None
        self.train_set: ByteWindows | None = None
        self.val_set: ByteWindows | None = None

    @property
    def corpus(self) -> Corpus:
        """The text, read on first use (so constructing the module, e.g. by Hydra, reads nothing)."""
        if self._corpus is None:
            hp: Any = self.hparams  # an AttributeDict (save_hyperparameters), typed as a plain mapping
            self._corpus = read_corpus(hp.max_chars, hp.val_every_kth_file, hp.block_size + 1, hp.stdlib_dir)
        return self._corpus

    @property
    def corpus_info(self) -> CorpusInfo:
        return self.corpus.info

    def fingerprint(self) -> str:
        """The data identity the checkpoint manifest records and compares on resume.

        The SHA-256 covers every selected file's path, length and bytes in order, so another Python
        release's library (or an edited one) is a different corpus even at the same size.
        """
        info = self.corpus_info
        return (
            f"stdlib python {info.python_version}: {info.files} files, {info.bytes} bytes,"
            f" sha256 {info.sha256}, val every {info.val_every_kth_file}th file"
        )

    def setup(self, stage: str) -> None:
        if self.train_set is not None:
            return
        hp: Any = self.hparams  # an AttributeDict (save_hyperparameters), typed as a plain mapping
        corpus = self.corpus
        generator = torch.Generator().manual_seed(hp.seed)
        train_offsets = torch.randint(
            0, len(corpus.train) - hp.block_size, (hp.samples_per_epoch,), generator=generator, dtype=torch.int64
        )
        last_val_start = len(corpus.val) - hp.block_size - 1
        val_offsets = torch.linspace(0, last_val_start, hp.val_windows, dtype=torch.float64).long()
        self.train_set = ByteWindows(corpus.train, train_offsets, hp.block_size)
        self.val_set = ByteWindows(corpus.val, val_offsets, hp.block_size)

    def train_dataloader(self) -> StatefulDataLoader:
        # drop_last: every step sees the same number of tokens, so FLOPs per batch are constant.
        extra: dict[str, Any] = {"persistent_workers": False} if self.hparams["num_workers"] else {}
        return StatefulDataLoader(
            self.train_set,
            batch_size=self.hparams["batch_size"],
            shuffle=True,
            drop_last=True,
            num_workers=self.hparams["num_workers"],
            **extra,
        )

    def val_dataloader(self) -> DataLoader:
        assert self.val_set is not None, "setup() builds the validation windows before Lightning asks for them"
        return DataLoader(self.val_set, batch_size=self.hparams["batch_size"])
