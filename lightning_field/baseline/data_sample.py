"""What the data checks read: a few batches drawn beside a loader, each split into named inputs and labels.

A module of its own because every kind of check works on the same sample, and the two promises the
checks rest on are kept here, once: the user's loader (its position, the shuffle order training will
draw) is left as it was, and inputs and labels are told apart by one set of rules. Both are stated
for users in :mod:`lightning_field.baseline.data_checks`.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from lightning.pytorch.utilities.seed import isolate_rng
from torch.utils.data import DataLoader, IterableDataset

#: Dict keys read as labels when ``label_key`` is not given.
DEFAULT_LABEL_KEYS = ("labels", "label", "y", "target", "targets")

TensorsByName = dict[str, torch.Tensor]
#: ``(inputs, labels)`` of each sampled batch, in the order drawn (see :func:`split_batch`).
ParsedBatches = list[tuple[TensorsByName, TensorsByName]]


@dataclass
class DataSample:
    """Batches drawn from one loader, with each row's dataset index where the sampler tells it."""

    batches: list[Any]
    indices: list[list[int] | None]
    dataset_len: int | None

    def where(self, batch: int, row: int | None) -> str:
        """``sampled batch B, row R, dataset index I``: as much of a location as the sample knows."""
        if row is None:
            return f"sampled batch {batch}"
        index = self.indices[batch]
        at = f"sampled batch {batch}, row {row}"
        return f"{at}, dataset index {index[row]}" if index is not None and row < len(index) else at


def describe_tensor(name: str, is_label: bool) -> str:
    """``label 'y'`` or ``input '[0]'``: how a check names a tensor to the user."""
    return f"{'label' if is_label else 'input'} '{name}'"


def _as_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return torch.from_numpy(value)
    return None


def _flatten(obj: Any, name: str, out: TensorsByName) -> None:
    tensor = _as_tensor(obj)
    if tensor is not None:
        out[name] = tensor
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            _flatten(value, f"{name}.{key}" if name else str(key), out)
    elif isinstance(obj, Sequence) and not isinstance(obj, (str, bytes)):
        for i, value in enumerate(obj):
            _flatten(value, f"{name}[{i}]", out)


def split_batch(batch: Any, label_key: str | int | None = None) -> tuple[TensorsByName, TensorsByName]:
    """``(inputs, labels)``: a batch's tensors by name, split by the rules in
    :mod:`lightning_field.baseline.data_checks`' docstring.

    Raises ``ValueError`` when ``label_key`` names a key or position the batch does not have: a
    silent fallback would check the wrong tensor against the class count.
    """
    inputs: TensorsByName = {}
    labels: TensorsByName = {}
    tensor = _as_tensor(batch)
    if tensor is not None:
        inputs["input"] = tensor
    elif isinstance(batch, Mapping):
        if label_key is not None:
            if label_key not in batch:
                keys = sorted(map(str, batch))
                raise ValueError(f"check_data label_key={label_key!r} is not a key of the batch: {keys}")
            label_names = {label_key}
        else:
            label_names = {k for k in batch if k in DEFAULT_LABEL_KEYS}
        for key, value in batch.items():
            _flatten(value, str(key), labels if key in label_names else inputs)
    elif isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        if label_key is not None and not (isinstance(label_key, int) and -len(batch) <= label_key < len(batch)):
            raise ValueError(f"check_data label_key={label_key!r} is not a position in a {len(batch)}-element batch")
        label_pos = (label_key % len(batch)) if label_key is not None else (len(batch) - 1 if len(batch) >= 2 else None)
        for i, value in enumerate(batch):
            _flatten(value, f"[{i}]", labels if i == label_pos else inputs)
    return inputs, labels


def batch_size_of(tensors: Iterable[torch.Tensor]) -> int | None:
    """The first dimension of the first tensor that has one: the batch dimension by convention."""
    for t in tensors:
        if t.dim() >= 1:
            return int(t.shape[0])
    return None


def safe_len(obj: Any) -> int | None:
    """``len(obj)``, or None for objects without one (an iterable dataset, a sampler of unknown length)."""
    try:
        return len(obj)
    except TypeError:
        return None


@contextlib.contextmanager
def _rng_preserved(*generators: torch.Generator) -> Iterator[None]:
    """Restore torch (CPU), ``random``, NumPy (Lightning's ``isolate_rng``) and the given generators,
    which it does not know of: the draw must not shift training's."""
    gen_states = [g.get_state() for g in generators]
    with isolate_rng(include_cuda=False):
        try:
            yield
        finally:
            for g, state in zip(generators, gen_states, strict=True):
                g.set_state(state)


def draw_sample(loader: Iterable[Any], sample_batches: int) -> DataSample:
    """Up to ``sample_batches`` batches, without iterating (or otherwise touching) ``loader`` itself."""
    if not isinstance(loader, DataLoader):
        # A plain iterable (a list of batches, a generator): read it as given.
        batches = list(itertools.islice(iter(loader), sample_batches))
        return DataSample(batches, [None] * len(batches), None)
    dataset = loader.dataset
    is_iterable = isinstance(dataset, IterableDataset)
    dataset_len = None if is_iterable else safe_len(dataset)
    sampler = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
    owners = (sampler, getattr(sampler, "sampler", None), loader.sampler)
    generators = {id(g): g for g in (getattr(o, "generator", None) for o in owners) if isinstance(g, torch.Generator)}
    with _rng_preserved(*generators.values()):
        if is_iterable:
            fresh = DataLoader(
                dataset, batch_size=loader.batch_size, drop_last=loader.drop_last, collate_fn=loader.collate_fn
            )
            batches = list(itertools.islice(iter(fresh), sample_batches))
            return DataSample(batches, [None] * len(batches), None)
        if loader.batch_sampler is not None:
            # The user's batch sampler decides which rows form a batch (and so what class balance the
            # model sees, e.g. under a weighted sampler); iterating a sampler object does not move
            # the loader, and its RNG is restored.
            index_batches = [list(b) for b in itertools.islice(iter(loader.batch_sampler), sample_batches)]
            fresh = DataLoader(dataset, batch_sampler=index_batches, collate_fn=loader.collate_fn)
            return DataSample(list(fresh), list(index_batches), dataset_len)
        indices = list(itertools.islice(iter(loader.sampler), sample_batches))
        batches = [loader.collate_fn(dataset[i]) for i in indices]
        return DataSample(batches, [None] * len(batches), dataset_len)
