"""Seek, not replay: how long a streamed loader takes to deliver its first batch after a resume at
sample 10 and at sample 1,000,000, for each way of streaming the conformance suite covers.

Each stream holds 1,100,000 samples whose value is their index, so a resume can be checked as it is
timed: the first batch after a resume at sample N must be ``N, N+1, ...``. The state at sample
1,000,000 is the state at sample 10 with its position moved (as ``scale_benchmark.py`` does for
map-style data): the loader is built, loaded with the state and asked for one batch, in a fresh
process-free loader (``num_workers=0``), 5 rounds alternating the two positions; medians.

* ``own, seeks``: an ``IterableDataset`` with ``state_dict``/``load_state_dict`` that opens the
  saved shard at the saved row (docs/streamed-data.md), in a ``StatefulDataLoader``;
* ``own, no state (replay)``: the same stream without the pair: torchdata re-reads and drops every
  sample before the position (what a resume would cost if it were not refused);
* ``Hugging Face datasets``: ``Dataset.to_iterable_dataset(num_shards=4)``, its own state;
* ``LitData``: ``optimize()`` into local chunks, ``StreamingDataset``, ``StreamingDataLoader``.

Usage::

    python benchmarks/stream_seek.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

SAMPLES = 1_100_000
SHARD = 10_000
FAR = 1_000_000
BATCH = 10


class SeekingShards(IterableDataset):
    """Shards of ``SHARD`` consecutive indices; the position is (shard, row) and loading it seeks."""

    def __init__(self) -> None:
        self.shard, self.row = 0, 0

    def __iter__(self) -> Iterator[int]:
        while self.shard * SHARD < SAMPLES:
            rows = np.arange(self.shard * SHARD, min((self.shard + 1) * SHARD, SAMPLES))  # "opening" the shard
            while self.row < len(rows):
                self.row += 1
                yield int(rows[self.row - 1])
            self.shard, self.row = self.shard + 1, 0

    def state_dict(self) -> dict[str, int]:
        return {"shard": self.shard, "row": self.row}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.shard, self.row = state["shard"], state["row"]


class ReplayedShards(SeekingShards):
    """The same stream without a state of its own: torchdata can only replay it."""

    state_dict = None  # type: ignore[assignment]  # no position of its own
    load_state_dict = None  # type: ignore[assignment]


Case = tuple[Callable[[], Any], Callable[[dict[str, Any], int], dict[str, Any]]]


def _own_moved(state: dict[str, Any], position: int) -> dict[str, Any]:
    state = copy.deepcopy(state)
    state["dataset_state"] = {"shard": position // SHARD, "row": position % SHARD}
    state["_num_yielded"] = state["_sampler_iter_yielded"] = position // BATCH
    state["_sampler_iter_state"] = {"samples_yielded": position}
    return state


def _replay_moved(state: dict[str, Any], position: int) -> dict[str, Any]:
    state = copy.deepcopy(state)
    state["_num_yielded"] = state["_sampler_iter_yielded"] = position // BATCH
    state["_sampler_iter_state"] = {"samples_yielded": position}
    return state


def _hf_case() -> Case:
    import datasets

    table = datasets.Dataset.from_dict({"i": np.arange(SAMPLES)})
    per_shard = SAMPLES // 4

    def build() -> Any:
        stream = table.to_iterable_dataset(num_shards=4)
        return StatefulDataLoader(stream, batch_size=BATCH, collate_fn=lambda rows: [r["i"] for r in rows])

    def moved(state: dict[str, Any], position: int) -> dict[str, Any]:
        state = copy.deepcopy(state)
        outer = state["dataset_state"]["examples_iterable"]
        shard, row = divmod(position, per_shard)
        chunk_start = row - row % 1000  # the rebatching iterable resumes from its chunk's start
        kind = "ArrowExamplesIterable"
        outer["previous_state"] = {"shard_idx": shard, "shard_example_idx": chunk_start, "type": kind}
        outer["examples_iterable"] = {"shard_idx": shard, "shard_example_idx": chunk_start + 1000, "type": kind}
        outer["batch_idx"], outer["num_chunks_since_previous_state"] = row % 1000, row % 1000
        state["_num_yielded"] = state["_sampler_iter_yielded"] = position // BATCH
        return state

    return build, moved


def _litdata_sample(index: int) -> int:
    return index


def _litdata_case(folder: str) -> Case:
    import litdata

    os.environ["DATA_OPTIMIZER_CACHE_FOLDER"] = folder + "-cache"  # not the machine's shared one
    os.environ["DATA_OPTIMIZER_DATA_CACHE_FOLDER"] = folder + "-cache-data"
    litdata.optimize(fn=_litdata_sample, inputs=list(range(SAMPLES)), output_dir=folder, chunk_bytes="8MB",
                     num_workers=2, mode="overwrite")  # fmt: skip

    def build() -> Any:
        return litdata.StreamingDataLoader(litdata.StreamingDataset(folder, shuffle=False), batch_size=BATCH)

    def moved(state: dict[str, Any], position: int) -> dict[str, Any]:
        state = copy.deepcopy(state)
        state["num_samples_yielded"] = [position] if isinstance(state["num_samples_yielded"], list) else position
        state["dataset"]["num_samples_yielded"] = position
        return state

    return build, moved


def _first_batch(loader: Any) -> list[int]:
    batch = next(iter(loader))
    return [int(v) for v in (batch.tolist() if isinstance(batch, torch.Tensor) else batch)]


def measure(name: str, case: Case, rounds: int) -> dict[str, Any]:
    build, moved = case
    loader = build()
    iterator = iter(loader)
    next(iterator)  # one batch: the state at sample 10
    at10 = loader.state_dict()
    states = {10: moved(at10, 10), FAR: moved(at10, FAR)}
    times: dict[int, list[float]] = {10: [], FAR: []}
    for round_ in range(rounds):
        for position in (10, FAR) if round_ % 2 == 0 else (FAR, 10):
            start = time.perf_counter()
            resumed = build()
            resumed.load_state_dict(states[position])
            batch = _first_batch(resumed)
            times[position].append(time.perf_counter() - start)
            assert batch == list(range(position, position + BATCH)), f"{name} resumed at {position} read {batch}"
    t10, tfar = statistics.median(times[10]), statistics.median(times[FAR])
    return {"name": name, "t10": t10, "tfar": tfar, "ratio": tfar / t10}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; {SAMPLES:,} samples; resume at sample 10 and {FAR:,}")
    with tempfile.TemporaryDirectory() as folder:
        cases: dict[str, Case] = {
            "own IterableDataset, seeks": (lambda: StatefulDataLoader(SeekingShards(), batch_size=BATCH), _own_moved),
            "own IterableDataset, no state (replay)": (
                lambda: StatefulDataLoader(ReplayedShards(), batch_size=BATCH), _replay_moved),
            "Hugging Face datasets, to_iterable_dataset(num_shards=4)": _hf_case(),
            "LitData StreamingDataset": _litdata_case(os.path.join(folder, "litdata")),
        }
        print("| stream | resume at 10 (s) | resume at 1,000,000 (s) | ratio |")
        print("|---|---|---|---|")
        for name, case in cases.items():
            row = measure(name, case, args.rounds)
            print(f"| {name} | {row['t10']:.4f} | {row['tfar']:.4f} | {row['ratio']:.2f} |", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
