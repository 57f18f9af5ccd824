"""Random-number state: captured per rank, restored at the exact point the continuation needs it.

Lightning's own checkpoints hold no RNG state, so dropout masks and random augmentations after a
resume differ from the uninterrupted run. Here every generator a training step can draw from is
captured: Python's ``random``, NumPy's global generator, torch's CPU generator, every CUDA device,
and any ``torch.Generator`` the run registers by name.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, cast

import numpy as np
import torch

from lightning_field.core.hashing import new_hasher


def _numpy_state_to_plain(state: tuple[Any, ...]) -> dict[str, Any]:
    name, keys, pos, has_gauss, cached = state
    return {
        "name": name,
        "keys": np.asarray(keys).tobytes(),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached": float(cached),
    }


def _numpy_state_from_plain(state: Mapping[str, Any]) -> tuple[Any, ...]:
    keys = np.frombuffer(state["keys"], dtype=np.uint32).copy()
    return (state["name"], keys, state["pos"], state["has_gauss"], state["cached"])


def capture_rng_state(generators: Mapping[str, torch.Generator] | None = None) -> dict[str, Any]:
    """Every RNG state of this process, as plain Python values and CPU tensors.

    Plain values keep the state loadable with ``torch.load(weights_only=True)``.
    """
    state: dict[str, Any] = {
        "python": random.getstate(),
        # legacy=True (the default) is the tuple form; only legacy=False returns a dict.
        "numpy": _numpy_state_to_plain(cast(tuple[Any, ...], np.random.get_state(legacy=True))),
        "torch": torch.get_rng_state(),
        "generators": {name: gen.get_state() for name, gen in (generators or {}).items()},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        # Reading the generator seed/offset does not synchronise the device.
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Mapping[str, Any], generators: Mapping[str, torch.Generator] | None = None) -> list[str]:
    """Restore what ``capture_rng_state`` captured; return the names of states that could not be restored."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state(_numpy_state_from_plain(state["numpy"]))
    torch.set_rng_state(state["torch"])
    unrestored = []
    cuda_states = state.get("cuda")
    if cuda_states is not None:
        if torch.cuda.is_available() and len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
        else:
            unrestored.append("cuda")
    saved_generators = state.get("generators", {})
    for name, gen in (generators or {}).items():
        if name in saved_generators:
            gen.set_state(saved_generators[name])
        else:
            unrestored.append(f"generator:{name}")
    return unrestored


def rng_digest(state: Mapping[str, Any]) -> str:
    """A short, stable fingerprint of an RNG state, for comparing runs without storing the state."""
    h = new_hasher()
    h.update(repr(state["python"]).encode())
    h.update(state["numpy"]["keys"])
    h.update(str(state["numpy"]["pos"]).encode())
    h.update(state["torch"].numpy().tobytes())
    for gen_state in state.get("cuda", []) or []:
        h.update(gen_state.numpy().tobytes())
    return h.hexdigest()[:16]


class WorkerRngCapture:
    """A ``worker_init_fn`` wrapper that makes DataLoader worker randomness resumable.

    StatefulDataLoader restores a worker's dataset and sampler position but re-seeds the worker's
    generators from the base seed, so a random augmentation after a resume differs from the
    uninterrupted run. This wrapper gives the worker's own copy of the dataset a
    ``state_dict``/``load_state_dict`` pair that carries the worker's RNG state (and the dataset's
    own state, when it has one). StatefulDataLoader snapshots that state with every batch it
    yields and hands it back to the worker on resume, so the worker continues the exact stream.
    The user's dataset object in the main process is never modified.
    """

    def __init__(self, inner: Any = None) -> None:
        self.inner = inner

    def __call__(self, worker_id: int) -> None:
        if self.inner is not None:
            self.inner(worker_id)
        info = torch.utils.data.get_worker_info()
        if info is None:
            return
        _attach_worker_rng_state(info.dataset)


_USER_STATE = "user_state"
_WORKER_RNG = "lightning_field_worker_rng"


def dataset_own_state(state: Any) -> Any:
    """A worker's dataset state as the dataset itself saved it, without the worker RNG added here."""
    if isinstance(state, Mapping) and _WORKER_RNG in state:
        return state.get(_USER_STATE)
    return state


def _attach_worker_rng_state(dataset: Any) -> None:
    own_state_dict: Any = getattr(dataset, "state_dict", None)
    own_load: Any = getattr(dataset, "load_state_dict", None)
    has_own = callable(own_state_dict) and callable(own_load)

    def state_dict() -> dict[str, Any]:
        rng = capture_rng_state()
        plain = {"python": rng["python"], "numpy": rng["numpy"], "torch": rng["torch"].numpy().tobytes()}
        return {_WORKER_RNG: plain, _USER_STATE: own_state_dict() if has_own else None}

    def load_state_dict(state: dict[str, Any]) -> None:
        if has_own and state.get(_USER_STATE) is not None:
            own_load(state[_USER_STATE])
        plain = state.get(_WORKER_RNG)
        if plain is not None:
            torch_state = torch.frombuffer(bytearray(plain["torch"]), dtype=torch.uint8)
            restore_rng_state({"python": plain["python"], "numpy": plain["numpy"], "torch": torch_state})

    dataset.state_dict = state_dict
    dataset.load_state_dict = load_state_dict
