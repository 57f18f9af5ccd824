"""The raw tensor file that step snapshots are written in (``checkpoint/tensor_file*.py``): it reads
back exactly what ``torch.save`` would have, on a real Lightning checkpoint; a state it cannot carry
falls back to ``torch.save``; a reused file holds exactly the new bytes; and a malformed file, whoever
wrote it, is refused naming it without anything in it being run."""

from __future__ import annotations

import json
import random
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import make_trainer
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_field.checkpoint.safe_load import torch_load_untrusted
from lightning_field.checkpoint.snapshots import snapshot_dir_for
from lightning_field.checkpoint.stores.snapshot import SnapshotStore
from lightning_field.checkpoint.tensor_file import MAGIC, TensorFileError, write_tensor_file
from lightning_field.checkpoint.tensor_file_reader import is_tensor_file, read_tensor_file
from lightning_field.compat import lightning as internals
from lightning_field.core.hashing import hash_file
from lightning_field.core.manifest import SHARED_STATE_FILE, rank_state_file


def assert_same(expected: Any, got: Any, path: str = "state") -> None:
    """Equal values of the very same types, tensors bitwise with their dtypes and shapes."""
    assert type(got) is type(expected), f"{path}: {type(got).__name__} != {type(expected).__name__}"
    if isinstance(expected, torch.Tensor):
        assert got.dtype == expected.dtype and got.shape == expected.shape and torch.equal(got, expected), path
    elif isinstance(expected, np.ndarray):
        assert got.dtype == expected.dtype and np.array_equal(got, expected), path
    elif isinstance(expected, dict):
        assert list(got) == list(expected), f"{path}: keys {list(got)} != {list(expected)}"
        for key in expected:
            assert_same(expected[key], got[key], f"{path}.{key}")
    elif isinstance(expected, (list, tuple)):
        assert len(got) == len(expected), path
        for index, (a, b) in enumerate(zip(expected, got, strict=True)):
            assert_same(a, b, f"{path}[{index}]")
    elif isinstance(expected, float) and expected != expected:
        assert got != got, path
    else:
        assert got == expected, f"{path}: {got!r} != {expected!r}"


def trained_checkpoint(root: Path) -> dict[str, Any]:
    """Lightning's own dump of a BoringModel trained a few steps under AdamW, with the RNG streams."""
    model = BoringModel()
    model.configure_optimizers = lambda: torch.optim.AdamW(model.parameters(), lr=0.1)  # type: ignore[method-assign]
    trainer = make_trainer(root, 3)
    trainer.fit(model)
    checkpoint = internals.dump_checkpoint(trainer, False)
    checkpoint["rng"] = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    return checkpoint


def test_a_lightning_checkpoint_reads_back_as_torch_load_reads_its_torch_save(tmp_path: Path) -> None:
    checkpoint = trained_checkpoint(tmp_path / "run")
    checkpoint["odd"] = (float("nan"), float("-inf"), b"\x00\xff", torch.bfloat16, torch.Size([2, 3]), np.int64(7))
    checkpoint["empty"] = {"none": torch.zeros(0, 4), "scalar": torch.tensor(3.5, dtype=torch.float64)}
    written = write_tensor_file(checkpoint, tmp_path / "raw", durable=False)
    torch.save(checkpoint, tmp_path / "pickled")
    assert written is not None and is_tensor_file(tmp_path / "raw") and not is_tensor_file(tmp_path / "pickled")
    assert written == hash_file(tmp_path / "raw")  # the hash taken while writing is the file's
    assert_same(torch.load(tmp_path / "pickled", weights_only=False), read_tensor_file(tmp_path / "raw"))
    # The loader every resume goes through tells the two apart by their first bytes.
    assert_same(read_tensor_file(tmp_path / "raw"), torch_load_untrusted(tmp_path / "raw", "cpu"))
    assert (tmp_path / "raw").read_bytes()[: len(MAGIC)] == MAGIC


def test_a_tensor_held_twice_is_written_once_and_read_back_as_one(tmp_path: Path) -> None:
    weight = torch.randn(256, 256)
    size, _ = write_tensor_file({"encoder": weight, "decoder": weight}, tmp_path / "tied", durable=False) or (0, "")
    assert size < 1.5 * weight.numel() * 4
    back = read_tensor_file(tmp_path / "tied")
    assert back["encoder"] is back["decoder"] and torch.equal(back["encoder"], weight)


def test_a_tensor_read_back_is_a_private_copy_whose_writes_never_reach_the_file(tmp_path: Path) -> None:
    write_tensor_file({"w": torch.ones(1000)}, tmp_path / "f", durable=False)
    before = (tmp_path / "f").read_bytes()
    read_tensor_file(tmp_path / "f")["w"].add_(1)
    assert (tmp_path / "f").read_bytes() == before


class UserState:
    """A callback's own class in its state: only a pickle carries it."""


@pytest.mark.parametrize(
    "unencodable",
    [UserState(), {1, 2}, torch.nn.Parameter(torch.ones(2)), torch.ones(2, requires_grad=True),
     torch.ones(3).to_sparse()],
    ids=["user-class", "set", "parameter", "requires-grad", "sparse"],
)
def test_a_state_the_format_cannot_carry_is_not_written(tmp_path: Path, unencodable: Any) -> None:
    assert write_tensor_file({"callbacks": {"mine": unencodable}}, tmp_path / "f", durable=False) is None
    assert not (tmp_path / "f").exists()


def test_the_snapshot_store_falls_back_to_torch_save_for_such_a_state_and_it_still_loads(tmp_path: Path) -> None:
    store, final = SnapshotStore(), tmp_path / "epoch=0-step=1"
    state = {"state_dict": {"w": torch.ones(3)}, "kept": OrderedDict(a=1), "when": np.float64(2.5)}
    outcome = store.write(final, "t0", 0, {SHARED_STATE_FILE: (state, []), rank_state_file(0): ({"x": {3}}, [])})
    assert outcome.error is None
    hidden = store.hidden_dir(final, "t0")
    assert is_tensor_file(hidden / SHARED_STATE_FILE) and not is_tensor_file(hidden / rank_state_file(0))
    assert_same(state, torch_load_untrusted(hidden / SHARED_STATE_FILE, "cpu"))
    assert torch_load_untrusted(hidden / rank_state_file(0), "cpu", trust_pickles=True) == {"x": {3}}


def test_a_reused_file_holds_exactly_the_new_bytes_however_large_it_was(tmp_path: Path) -> None:
    path = tmp_path / "f"
    write_tensor_file({"big": torch.randn(100_000)}, path, durable=False)
    small = {"small": torch.arange(10)}
    size, digest = write_tensor_file(small, path, durable=False, reuse=True) or (0, "")
    write_tensor_file(small, tmp_path / "fresh", durable=False)
    assert path.read_bytes() == (tmp_path / "fresh").read_bytes() and (size, digest) == hash_file(path)
    assert_same(small, read_tensor_file(path))


class NoteInodes(Callback):
    """At each step's start, the inode of every snapshot's shared state file then present."""

    def __init__(self, where: Path) -> None:
        self.where, self.inodes = where, {}

    def on_train_batch_start(self, *args: Any) -> None:
        for step_dir in self.where.glob("epoch=0-step=*"):
            step = int(step_dir.name.rsplit("=", 1)[1])
            self.inodes.setdefault(step, (step_dir / SHARED_STATE_FILE).stat().st_ino)


def test_each_snapshot_overwrites_the_files_of_the_one_it_retires(tmp_path: Path) -> None:
    torch.manual_seed(0)
    trainer = make_trainer(tmp_path, 5, every_n_train_steps=100, snapshot_every_n_train_steps=1,
                           snapshot_dir=tmp_path / "shm")  # fmt: skip
    note = NoteInodes(snapshot_dir_for(tmp_path / "ckpts", tmp_path / "shm"))
    trainer.callbacks.insert(0, note)
    trainer.fit(BoringModel())
    kept = sorted(p.name for p in note.where.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert kept == ["epoch=0-step=4", "epoch=0-step=5"]
    assert note.inodes[3] == note.inodes[1] and note.inodes[4] == note.inodes[2], note.inodes  # 3 took 1's pages
    assert is_tensor_file(note.where / "epoch=0-step=5" / SHARED_STATE_FILE)
    assert is_tensor_file(note.where / "epoch=0-step=5" / rank_state_file(0))


def _valid_file(tmp_path: Path) -> tuple[bytes, int]:
    write_tensor_file({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "n": [1, "x"]}, tmp_path / "ok",
                      durable=False)  # fmt: skip
    raw = (tmp_path / "ok").read_bytes()
    return raw, int.from_bytes(raw[8:16], "little")


def _with_header(raw: bytes, length: int, edit: Any) -> bytes:
    header = json.loads(raw[16 : 16 + length])
    edit(header)
    text = json.dumps(header).encode()
    rest = raw[16 + length :]
    pad = -(16 + len(text)) % 64
    data = rest[-(len(rest) - (-(16 + length) % 64)) :] if rest else b""
    return MAGIC + len(text).to_bytes(8, "little") + text + bytes(pad) + data


HOSTILE: dict[str, Any] = {
    "header-longer-than-the-file": lambda raw, n: raw[:8] + (2**40).to_bytes(8, "little") + raw[16:],
    "header-not-json": lambda raw, n: raw[:16] + b"{" * n + raw[16 + n :],
    "another-format": lambda raw, n: _with_header(raw, n, lambda h: h.update(format="x/9")),
    "another-byte-order": lambda raw, n: _with_header(raw, n, lambda h: h.update(byteorder="big")),
    "unknown-dtype": lambda raw, n: _with_header(raw, n, lambda h: h["tensors"][0].__setitem__(0, "object")),
    "size-not-the-shape": lambda raw, n: _with_header(raw, n, lambda h: h["tensors"][0].__setitem__(4, 4)),
    "tensor-past-the-end": lambda raw, n: _with_header(raw, n, lambda h: h["tensors"][0].__setitem__(3, 10**9)),
    "negative-shape": lambda raw, n: _with_header(raw, n, lambda h: h["tensors"][0].__setitem__(1, [-2, -3])),
    "unknown-tag": lambda raw, n: _with_header(raw, n, lambda h: h.update(tree=["os.system", "rm -rf /"])),
    "tensor-not-listed": lambda raw, n: _with_header(raw, n, lambda h: h.update(tree=["T", 5])),
    "unhashable-key": lambda raw, n: _with_header(raw, n, lambda h: h.update(tree=["d", [[["l", []], 1]]])),
    "too-deep": lambda raw, n: _with_header(raw, n, lambda h: h.update(tree=_nested(400))),
    "bad-base64": lambda raw, n: _with_header(raw, n, lambda h: h.update(tree=["b", "!!"])),
    "truncated": lambda raw, n: raw[: len(raw) - 50],  # into the last tensor's bytes, past its padding
}


def _nested(depth: int) -> Any:
    node: Any = 1
    for _ in range(depth):
        node = ["l", [node]]
    return node


@pytest.mark.parametrize("damage", sorted(HOSTILE))
def test_a_malformed_tensor_file_is_refused_naming_it(tmp_path: Path, damage: str) -> None:
    raw, length = _valid_file(tmp_path)
    path = tmp_path / "state.pt"
    path.write_bytes(HOSTILE[damage](raw, length))
    with pytest.raises(TensorFileError) as refused:
        torch_load_untrusted(path, "cpu")
    assert str(path) in str(refused.value)
