"""Streamed training data as users build it with the streaming libraries, from local files only.

Each builder returns the train loader a user would write for the conformance job's classifier: the
same 64 labelled samples (``conformance_job.classification_tensors``), written to shards with the
library's own writer and read back through its own dataset (and loader, where it has one). Shards
are written once per run directory's parent, so a reference run and its interrupted twin read the
very same files.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset


def _distributed() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def written_once(where: Path, write: Callable[[Path], None]) -> Path:
    """``where``, written by ``write`` into a private folder and renamed into place (ranks race)."""
    if where.exists():
        return where
    scratch = where.with_name(f"{where.name}.tmp-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    write(scratch)
    try:
        os.rename(scratch, where)
    except OSError:  # another rank renamed its copy first: the same bytes
        shutil.rmtree(scratch, ignore_errors=True)
    return where


def collate_pairs(rows: list[dict[str, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
    """A list of ``{"x", "y"}`` rows as the ``(x, y)`` batch the classifier takes."""
    x = torch.stack([torch.as_tensor(row["x"], dtype=torch.float32) for row in rows])
    y = torch.as_tensor([int(row["y"]) for row in rows], dtype=torch.long)
    return x, y


# ---------------------------------------------------------------------------------------- Hugging Face
def hf_stream(base: TensorDataset, batch_size: int, workers: int, buffer_shuffle: bool) -> DataLoader:
    """``datasets``: an in-memory ``Dataset`` as an ``IterableDataset`` of 4 shards, split between
    the ranks with ``split_dataset_by_node``; with ``buffer_shuffle``, shuffled through a buffer."""
    import datasets
    from datasets.distributed import split_dataset_by_node

    x, y = base.tensors
    table = datasets.Dataset.from_dict({"x": x.tolist(), "y": y.tolist()})
    stream = table.to_iterable_dataset(num_shards=4)
    if buffer_shuffle:
        stream = stream.shuffle(seed=7, buffer_size=16)
    rank, world = _distributed()
    if world > 1:
        stream = split_dataset_by_node(stream, rank=rank, world_size=world)
    return DataLoader(stream, batch_size=batch_size, num_workers=workers, collate_fn=collate_pairs,
                      persistent_workers=workers > 0)  # fmt: skip


# ---------------------------------------------------------------------------------------- LitData
def _litdata_sample(pair: tuple[list[float], int]) -> dict[str, Any]:
    import numpy as np

    return {"x": np.asarray(pair[0], dtype=np.float32), "y": int(pair[1])}


def litdata_shards(base: TensorDataset, shards: Path) -> Path:
    """The samples as LitData chunks, written by ``litdata.optimize()`` (once)."""
    import litdata

    def write(out: Path) -> None:
        # optimize() stages chunks in one cache folder per machine (~/.cache): two runs writing at
        # once (pytest workers) mix their chunks. Each write gets its own.
        os.environ["DATA_OPTIMIZER_CACHE_FOLDER"] = str(out.with_name(out.name + "-cache"))
        os.environ["DATA_OPTIMIZER_DATA_CACHE_FOLDER"] = str(out.with_name(out.name + "-cache-data"))
        x, y = base.tensors
        pairs = list(zip(x.tolist(), y.tolist(), strict=True))
        # optimize() sets the process's start method to "spawn" (force=True) and leaves it so: every
        # later DataLoader of the process (a test worker's next tests) would start its workers as
        # fresh interpreters. The caller's method is put back.
        start_method = multiprocessing.get_start_method(allow_none=True)
        try:
            litdata.optimize(fn=_litdata_sample, inputs=pairs, output_dir=str(out), chunk_size=16, num_workers=1,
                             mode="overwrite")  # fmt: skip
        finally:
            multiprocessing.set_start_method(start_method, force=True)

    return written_once(shards / "litdata", write)


def litdata_stream(base: TensorDataset, shards: Path, batch_size: int, workers: int) -> Any:
    """LitData: ``optimize()`` into local chunks, read by ``StreamingDataset`` (shuffled, seeded)
    through its ``StreamingDataLoader``."""
    import litdata

    where = litdata_shards(base, shards)
    dataset = litdata.StreamingDataset(str(where), shuffle=True, seed=7)
    return litdata.StreamingDataLoader(dataset, batch_size=batch_size, num_workers=workers, collate_fn=collate_pairs)


# ---------------------------------------------------------------------------------------- WebDataset
def prepare_shards(kind: str, base: TensorDataset, shards: Path) -> None:
    """Write the shards a library stream reads before a run seeds and trains: writing them draws
    randomness (LitData's ``optimize`` starts workers), which only the run that writes them would see."""
    if kind == "litdata":
        litdata_shards(base, shards)
    elif kind == "webdataset":
        webdataset_shards(base, shards)


def webdataset_shards(base: TensorDataset, shards: Path) -> list[str]:
    """The samples as 4 tar shards of ``.x.pth``/``.y.cls`` files (once)."""

    def write(out: Path) -> None:
        x, y = base.tensors
        for shard in range(4):
            with tarfile.open(out / f"shard-{shard:04d}.tar", "w") as tar:
                for index in range(shard * 16, (shard + 1) * 16):
                    for suffix, data in (("x.pth", _tensor_bytes(x[index])), ("y.cls", str(int(y[index])).encode())):
                        info = tarfile.TarInfo(f"{index:06d}.{suffix}")
                        info.size, info.mtime = len(data), 0
                        tar.addfile(info, io.BytesIO(data))

    where = written_once(shards / "webdataset", write)
    return [str(where / f"shard-{shard:04d}.tar") for shard in range(4)]


def webdataset_stream(base: TensorDataset, shards: Path, batch_size: int, workers: int) -> DataLoader:
    """WebDataset: tar shards read by ``wds.WebDataset``, split between the ranks."""
    import webdataset as wds

    urls = webdataset_shards(base, shards)
    stream = (
        wds.WebDataset(urls, shardshuffle=False, nodesplitter=wds.split_by_node, empty_check=False)
        .decode()
        .to_tuple("x.pth", "y.cls")
    )
    return DataLoader(stream, batch_size=batch_size, num_workers=workers, persistent_workers=workers > 0)


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    buffer = io.BytesIO()
    torch.save(tensor.clone(), buffer)
    return buffer.getvalue()
