"""Every private torch name lightning_field uses, each with what it works around.

Kept apart from the Lightning accessors (``compat/lightning.py``) because the supported range is
torch's (``torch>=2.4``), not Lightning's.
"""

from __future__ import annotations

import pickle
from typing import Any, TypeGuard

import torch
from torch import nn, serialization


def save_without_crc32(obj: Any, buffer: Any) -> None:
    """``torch.save(obj, buffer)`` without the zip writer's CRC32 of every record.

    The CRC costs ~0.24 s/GB that cannot overlap the write, and is redundant in our files: the
    manifest's content hash covers every byte and is checked before anything is unpickled. torch
    skips it only through ``torch.serialization.config.save.compute_crc32``, a process-wide flag:
    flipping it around our save would also strip the CRC from a user's own ``torch.save`` in
    another thread, and race with our background writer. So this builds the zip writer that
    ``torch.save`` builds, with the flag given to it directly (private: ``torch._C.PyTorchFileWriter``
    and ``torch.serialization._save``, torch 2.6+), and falls back to ``torch.save`` where they differ.
    Files load with a plain ``torch.load``; zip tools cannot check their (zero) CRC fields.
    """
    try:
        zip_file = torch._C.PyTorchFileWriter(buffer, False, serialization._get_storage_alignment())
        save = serialization._save
    except (AttributeError, TypeError):  # another torch: its own path, CRC included
        torch.save(obj, buffer)
        return
    try:
        save(obj, zip_file, pickle, serialization.DEFAULT_PROTOCOL, False)
    finally:
        # Also after a failed pickle, as torch.save's context manager does: the writer aborts the
        # process if it is destroyed unfinished.
        zip_file.write_end_of_file()
    buffer.flush()


def tensor_version(tensor: Any) -> int:
    """The in-place write counter autograd keeps per tensor (``Tensor._version``, every torch 2.x).

    An async snapshot copies optimizer state and parameters after the save returned; this counter
    is how it proves nothing wrote them in place before their copy was made. It does not see writes
    through ``tensor.data`` (a separate counter), which is why the copy also completes before every
    hook outside the training batch (``checkpoint/async_save.py``).
    """
    return int(tensor._version)


def host_dtensor(tensor: Any, local: Any) -> Any:
    """A DTensor with ``tensor``'s sharding whose local shard is the host copy ``local``.

    Built like DCP's own async staging (which swaps the local tensor of a DTensor copy): the public
    ``DTensor.from_local`` would move the host copy back onto the mesh's device, and DCP's planner
    needs only the sharding metadata plus this rank's bytes (private: ``DTensor._spec``, torch 2.4+).
    """
    # Only sharded saves hold DTensors; a torch built without distributed support lacks the module.
    from torch.distributed.tensor import DTensor

    return DTensor(local, tensor._spec, requires_grad=False)


def is_dropout(module: Any) -> TypeGuard[nn.Dropout]:
    """Whether ``module`` is any of torch's dropout layers (their private common base ``_DropoutNd``;
    ``AlphaDropout`` and ``FeatureAlphaDropout`` included, which no public class groups). Typed as
    ``nn.Dropout``, the public one: every such layer has its float ``p`` and ``inplace``."""
    return isinstance(module, nn.modules.dropout._DropoutNd)


def draw_sampler_seed() -> int:
    """The seed torch's ``RandomSampler.__iter__`` draws from the global RNG when it has no generator
    (its body, not a public function): one int64 drawn the same way, so a re-created sampler consumes
    the global stream exactly as the user's would have."""
    return int(torch.empty((), dtype=torch.int64).random_().item())


def random_sampler_num_samples(sampler: Any) -> int | None:
    """The ``num_samples`` a ``RandomSampler`` was built with, None when it was left to the dataset
    size (``RandomSampler._num_samples``; the public property answers the resolved size, which
    would freeze the dataset's length into a re-created sampler)."""
    return sampler._num_samples
