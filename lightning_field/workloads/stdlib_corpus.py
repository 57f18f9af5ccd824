"""The char-GPT workload's corpus: the Python standard library's own source, read and fingerprinted.

A module of its own because what is read (a deterministic sorted selection of the library, with
test suites, vendored packages and generated tables left out), how it is split (by file, so
validation is code the model has never seen) and what identifies it (file count, bytes, SHA-256,
Python version) are the data's identity, independent of how windows are cut from it
(``workloads.stdlib_text``) and of the model (``workloads.char_gpt``).
"""

from __future__ import annotations

import hashlib
import math
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

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
