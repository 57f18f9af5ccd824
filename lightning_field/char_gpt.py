"""The main example workload: a byte-level GPT trained on the Python standard library's own source.

Why this corpus: every machine that runs this package has it, so the workload is real text (not
random numbers) and still needs no download, account or network. The files are read at run time
from ``sysconfig.get_paths()["stdlib"]``, a deterministic sorted selection with test suites, vendored
packages and generated tables left out, and fingerprinted (file count, bytes, SHA-256, Python
version) so a checkpoint written on a different corpus is refused on resume.

Why bytes: a vocabulary of 256 UTF-8 byte values couples the model to no tokenizer and to no data
statistic, so the model can be built before the data is read and a checkpoint never depends on a
vocabulary file. For the (almost entirely ASCII) standard library a byte is a character, so
``val_bpc`` is bits per character.

Recommended run: the defaults of both classes and ``RECOMMENDED_TARGET_VAL_LOSS`` = 1.5 nats per
byte (2.16 bits), reproduced by ``python examples/existing_trainer.py --seed S`` (``S`` = 0, 1, 2):

    data   block_size=128, batch_size=32, the whole library (Python 3.11.7: 447 files, 8.78 MB;
           403 files train, 44 held out), validation on 256 fixed windows every 25 steps
    model  4 layers, 4 heads, 128 wide: 0.84 M parameters, 5.74 MFLOP per trained token;
           AdamW lr 2e-3, betas (0.9, 0.95), weight decay 0.1, 100 warm-up steps, cosine to
           max_steps=1000, no dropout (a run sees half an epoch: no window twice)

Measured on 2 CPU cores (torch 2.13, ``torch.set_num_threads(2)``, machine otherwise idle):
4.3-4.7 optimizer steps/s (~18 k tokens/s, ~105 GFLOP/s by ``flops_per_token``); validation every
25 steps adds ~10% to the wall time. The byte stream's unigram entropy is 3.14 nats (4.53 bits) per byte: the best any
model that ignores context can do, so the target is less than half of it.

    seed   steps to val_loss <= 1.5   s of training   s wall (with validation)   val_loss at 1000
    0      775                        179             197                        1.406
    1      750                        162             179                        1.402
    2      800                        179             199                        1.415

    val_loss by step (seed 1): 100: 2.45, 200: 2.20, 300: 2.00, 400: 1.83, 500: 1.70, 600: 1.61,
    700: 1.53, 800: 1.47, 900: 1.43, 1000: 1.40

Steps to target are exact for this Python's library (the run is deterministic); the seconds scale
with the machine. The target is crossed at 75-80% of the schedule, leaving ~0.1 nats of margin at
the end, so it is reached on every seed and still needs most of the run.

``TINY_DATA`` and ``TINY_MODEL`` (1 layer, 32 wide, 22 k parameters, 32-byte context, 200 kB of text,
dropout 0.1) are for tests and smoke runs: ~100 steps/s on the same 2 cores, val_loss 4.4 at step 5,
<= ``TINY_TARGET_VAL_LOSS`` = 3.5 by step 10 and ~3.3 at step 40 on seeds 0, 1, 2 (the tiny corpus's
unigram entropy is 3.11 nats: this model is a smoke test, not a language model). ``python
examples/existing_trainer.py --tiny`` takes ~6 s, almost all of it start-up.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset
from torchdata.stateful_dataloader import StatefulDataLoader
from torchmetrics import MeanMetric

# ---------------------------------------------------------------------------------------------- corpus

#: Top-level stdlib folders that are not the library's own written code: installed third-party
#: packages, test suites, the IDE, the 2to3 tool, demos, bundled wheels, generated documentation
#: text and generated codec tables (``encodings`` is mostly ``0x00 -> NULL`` mapping tables).
EXCLUDED_TOP_LEVEL = frozenset(
    {
        "site-packages",
        "dist-packages",
        "test",
        "idlelib",
        "lib2to3",
        "turtledemo",
        "ensurepip",
        "pydoc_data",
        "encodings",
        "lib-dynload",
        "__phello__",
    }
)
#: Folders excluded wherever they appear (``unittest/test``, ``tkinter/test``, ``ctypes/test``...).
EXCLUDED_ANYWHERE = frozenset({"test", "tests", "idle_test", "__pycache__"})


def stdlib_dir() -> Path:
    """Where this interpreter's standard library lives."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_source_files(root: str | Path | None = None) -> list[Path]:
    """The corpus candidates: ``*.py`` under ``root`` (default: the stdlib), relative, sorted by path.

    Sorting by POSIX path makes the selection independent of the file system's listing order.
    Machine-specific generated files (``_sysconfigdata_*``, ``config-*``) are excluded so the same
    Python release gives the same corpus on every machine.
    """
    base = Path(root) if root is not None else stdlib_dir()
    selected = []
    # os.walk with pruning, not rglob: site-packages under the stdlib can hold far more files than it.
    for folder, subfolders, names in os.walk(base):
        rel_folder = Path(folder).relative_to(base)
        at_top = rel_folder == Path(".")
        subfolders[:] = [
            d
            for d in subfolders
            if d not in EXCLUDED_ANYWHERE and not (at_top and (d in EXCLUDED_TOP_LEVEL or d.startswith("config-")))
        ]
        for name in names:
            if name.endswith(".py") and not name.startswith("_sysconfigdata") and (Path(folder) / name).is_file():
                selected.append(rel_folder / name)
    return sorted(selected, key=lambda p: p.as_posix())


class CorpusTooSmallError(ValueError):
    """The standard library (or ``max_chars``) gives too little text for the requested windows."""


@dataclass(frozen=True)
class CorpusInfo:
    """What was read, for the manifest's data fingerprint and for reports.

    ``unigram_entropy_nats`` is the entropy of the training bytes' frequency table: the loss of the
    best model that ignores context. A trained model's ``val_loss`` means something only well below it.
    """

    python_version: str
    stdlib_dir: str
    files: int
    train_files: int
    val_files: int
    bytes: int
    train_bytes: int
    val_bytes: int
    sha256: str
    val_every_kth_file: int
    truncated_file: str | None
    unigram_entropy_nats: float

    @property
    def unigram_entropy_bits(self) -> float:
        return self.unigram_entropy_nats / math.log(2)

    def describe(self) -> str:
        return (
            f"Python {self.python_version} stdlib ({self.stdlib_dir}): {self.files} files, {self.bytes:,} bytes"
            f" ({self.train_files} files / {self.train_bytes:,} bytes train, {self.val_files} files /"
            f" {self.val_bytes:,} bytes val: every {self.val_every_kth_file}th file), sha256 {self.sha256[:16]}...,"
            f" unigram entropy {self.unigram_entropy_nats:.3f} nats ({self.unigram_entropy_bits:.3f} bits) per byte"
        )


@dataclass(frozen=True)
class Corpus:
    info: CorpusInfo
    train: torch.Tensor  # uint8, the training files concatenated
    val: torch.Tensor  # uint8, the held-out files concatenated
    train_paths: tuple[str, ...]
    val_paths: tuple[str, ...]


def _entropy_nats(data: torch.Tensor) -> float:
    counts = torch.bincount(data.long(), minlength=256).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())


def read_corpus(
    max_chars: int, val_every_kth_file: int, min_split_bytes: int, root: str | Path | None = None
) -> Corpus:
    """Read whole files in path order until ``max_chars`` bytes, and split them by file.

    The file that crosses the cap is cut at its last newline before it, so the total stays within
    ``max_chars`` and no line is cut in half. Every ``val_every_kth_file``-th file goes to validation:
    validation is code the model has never seen, not other windows of the same files. Raises
    :class:`CorpusTooSmallError` when either split has fewer than ``min_split_bytes`` bytes.
    """
    base = Path(root) if root is not None else stdlib_dir()
    chunks: list[tuple[str, bytes]] = []
    total = 0
    truncated = None
    for rel in stdlib_source_files(base):
        if total == max_chars:
            break
        data = (base / rel).read_bytes()
        if total + len(data) > max_chars:
            room = max_chars - total
            data = data[: data.rfind(b"\n", 0, room) + 1 or room]
            truncated = rel.as_posix()
        if data:  # empty files (bare __init__.py) add nothing and would skew the split
            chunks.append((rel.as_posix(), data))
            total += len(data)
        if truncated is not None:
            break
    digest = hashlib.sha256()
    for name, data in chunks:
        digest.update(name.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    train_chunks = [c for i, c in enumerate(chunks) if i % val_every_kth_file != val_every_kth_file - 1]
    val_chunks = [c for i, c in enumerate(chunks) if i % val_every_kth_file == val_every_kth_file - 1]
    train_bytes = b"".join(d for _, d in train_chunks)
    val_bytes = b"".join(d for _, d in val_chunks)
    if len(train_bytes) < min_split_bytes or len(val_bytes) < min_split_bytes:
        raise CorpusTooSmallError(
            f"Too little text for the char-GPT corpus: {len(chunks)} source file(s), {total:,} bytes read from {base}"
            f" with max_chars={max_chars:,}; the split (every {val_every_kth_file}th file to validation) gives"
            f" {len(train_bytes):,} train and {len(val_bytes):,} val bytes, and each needs at least"
            f" {min_split_bytes:,} (one window of block_size+1 bytes). Raise max_chars, lower block_size or"
            " val_every_kth_file, or point stdlib_dir at a fuller standard library."
        )
    train = torch.frombuffer(bytearray(train_bytes), dtype=torch.uint8)
    val = torch.frombuffer(bytearray(val_bytes), dtype=torch.uint8)
    info = CorpusInfo(
        python_version=".".join(map(str, sys.version_info[:3])),
        stdlib_dir=str(base),
        files=len(chunks),
        train_files=len(train_chunks),
        val_files=len(val_chunks),
        bytes=total,
        train_bytes=len(train_bytes),
        val_bytes=len(val_bytes),
        sha256=digest.hexdigest(),
        val_every_kth_file=val_every_kth_file,
        truncated_file=truncated,
        unigram_entropy_nats=_entropy_nats(train),
    )
    return Corpus(info, train, val, tuple(n for n, _ in train_chunks), tuple(n for n, _ in val_chunks))


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
            hp = self.hparams
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
        hp = self.hparams
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
        extra: dict[str, Any] = {"persistent_workers": False} if self.hparams.num_workers else {}
        return StatefulDataLoader(
            self.train_set,
            batch_size=self.hparams.batch_size,
            shuffle=True,
            drop_last=True,
            num_workers=self.hparams.num_workers,
            **extra,
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)


# ---------------------------------------------------------------------------------------------- model


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.n_head = n_head
        self.dropout = dropout
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.resid_dropout(self.proj(y.transpose(1, 2).reshape(b, t, c)))


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def warmup_cosine(step: int, warmup_steps: int, max_steps: int, min_ratio: float) -> float:
    """LR multiplier: linear warm-up to 1, cosine decay to ``min_ratio`` at ``max_steps``, then flat."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class CharGPT(pl.LightningModule):
    """A small decoder-only transformer over bytes (nanoGPT's layout), trained with AdamW.

    Token and position embeddings, ``n_layer`` pre-norm blocks of causal self-attention
    (``scaled_dot_product_attention``) and a GELU MLP, a final LayerNorm, and an output layer tied to
    the token embedding. Weight decay applies to matrices only (not biases, norms). The learning rate
    warms up linearly for ``warmup_steps`` and follows a cosine to ``min_lr_ratio * lr`` at
    ``max_steps``, stepped every optimizer step.

    Logs ``train_loss`` per step, and per validation ``val_loss`` (mean next-byte cross-entropy in
    nats, token-weighted, a torchmetrics ``MeanMetric``, so it is exact across batches and ranks) and
    ``val_bpc`` (the same in bits per byte = per character for ASCII text).
    """

    def __init__(
        self,
        vocab_size: int = 256,
        block_size: int = 128,
        n_layer: int = 4,
        n_head: int = 4,
        n_embd: int = 128,
        dropout: float = 0.0,
        lr: float = 2e-3,
        weight_decay: float = 0.1,
        warmup_steps: int = 100,
        max_steps: int = 1000,
        betas: tuple[float, float] = (0.9, 0.95),
        min_lr_ratio: float = 0.1,
    ) -> None:
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"CharGPT n_embd ({n_embd}) must be a multiple of n_head ({n_head})")
        self.save_hyperparameters()
        self.betas = (float(betas[0]), float(betas[1]))  # Hydra passes a ListConfig
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: fewer parameters, and better at this size
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                # GPT-2: residual projections scaled by depth so the residual stream's variance stays put.
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))
        self.val_nll = MeanMetric()
        self._last_batch_tokens: int | None = None

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    # ------------------------------------------------------------------ size and cost
    @property
    def matmul_parameters(self) -> int:
        """``N`` of the ``6·N`` rule: every parameter but the position table, which is only looked up.
        The tied token table counts once, for the output layer's multiply; biases and norm gains
        (~1% here) are kept in, as the rule usually counts them."""
        return sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()

    @property
    def flops_per_token(self) -> float:
        """Training FLOPs per token: ``6·N + 12·n_layer·n_embd·block_size``.

        ``6·N`` is forward (2 FLOPs per multiply-add) plus backward (twice the forward) over the
        ``N = matmul_parameters`` weights; the second term is the attention scores and their use
        (``QKᵀ`` and ``A·V``: 2·2·T·d forward per layer and token, times 3 with backward), counted
        over the full ``T×T`` square as in the PaLM paper's MFU accounting, although causal masking
        could skip half. Layer norms, softmax, GELU and the optimizer update (~10 FLOPs per parameter
        per step) are left out: element-wise work, a few percent at most at these sizes.
        """
        hp = self.hparams
        return 6.0 * self.matmul_parameters + 12.0 * hp.n_layer * hp.n_embd * hp.block_size

    @property
    def flops_per_batch(self) -> float | None:
        """``flops_per_token`` times the tokens of the latest training batch (None before the first):
        the batch size belongs to the data module, so the model learns it from the data it gets."""
        if self._last_batch_tokens is None:
            return None
        return self.flops_per_token * self._last_batch_tokens

    # ------------------------------------------------------------------ forward and steps
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Next-byte logits, shape ``(batch, time, vocab_size)``."""
        t = input_ids.shape[1]
        if t > self.hparams.block_size:
            raise ValueError(f"CharGPT got a sequence of {t} tokens; block_size is {self.hparams.block_size}")
        pos = torch.arange(t, device=input_ids.device)
        x = self.drop(self.wte(input_ids) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))

    def _loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = self(batch["input_ids"])
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch["labels"].reshape(-1))

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self._last_batch_tokens = int(batch["input_ids"].numel())
        loss = self._loss(batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.val_nll.update(self._loss(batch), weight=batch["labels"].numel())

    def on_validation_epoch_end(self) -> None:
        nll = self.val_nll.compute()  # synchronised across ranks by torchmetrics
        self.val_nll.reset()
        self.log("val_loss", nll, prog_bar=True)
        self.log("val_bpc", nll / math.log(2))

    def configure_optimizers(self) -> Any:
        hp = self.hparams
        params = {name: p for name, p in self.named_parameters() if p.requires_grad}
        decay = [p for p in params.values() if p.dim() >= 2]
        no_decay = [p for p in params.values() if p.dim() < 2]
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": hp.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=hp.lr,
            betas=self.betas,
        )
        schedule = functools.partial(
            warmup_cosine, warmup_steps=hp.warmup_steps, max_steps=hp.max_steps, min_ratio=hp.min_lr_ratio
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


# ---------------------------------------------------------------------------------------------- presets

#: A configuration that trains ~20 steps in a few seconds on a CPU, for tests and smoke runs. Dropout
#: is on so that a resume test also covers the model's RNG stream.
TINY_DATA: dict[str, Any] = {
    "block_size": 32,
    "batch_size": 8,
    "max_chars": 200_000,
    "val_every_kth_file": 5,
    "samples_per_epoch": 400,
    "val_windows": 32,
}
TINY_MODEL: dict[str, Any] = {
    "block_size": 32,
    "n_layer": 1,
    "n_head": 2,
    "n_embd": 32,
    "dropout": 0.1,
    "lr": 1e-2,
    "warmup_steps": 5,
    "max_steps": 40,
}

#: Target ``val_loss`` (nats per byte) for the default configuration. See the module docstring.
RECOMMENDED_TARGET_VAL_LOSS = 1.5
#: What the tiny configuration reaches within ~10-20 steps (from ln 256 = 5.55 at initialisation).
TINY_TARGET_VAL_LOSS = 3.5
