"""Lightning's private sampler wrapper, whose drawn epoch order a resumed epoch replays.

Kept free of lightning_field's own modules so that ``state/data_position.py`` can import it at module
level (``compat/lightning_loops.py`` imports that module).
"""

from __future__ import annotations

from typing import Any

from lightning_field.compat import lightning_range  # noqa: F401  refuses an untested Lightning first

# isort: split
from lightning.pytorch.overrides.distributed import _DatasetSamplerWrapper


def wrapped_sampler_datasets(loader: Any) -> dict[str, Any]:
    """Lightning's ``_DatasetSamplerWrapper`` objects (inside its DistributedSamplerWrapper, which
    Lightning puts around a custom sampler under DDP), by path in the loader. Their epoch order
    (``_sampler_list``) is drawn once per epoch and is all a resumed epoch needs replayed."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    candidates: dict[str, Any] = {
        "sampler": getattr(loader, "sampler", None),
        "batch_sampler.sampler": getattr(batch_sampler, "sampler", None),
    }
    return {
        path: sampler.dataset
        for path, sampler in candidates.items()
        if isinstance(getattr(sampler, "dataset", None), _DatasetSamplerWrapper)
    }


def wrapped_sampler_order(wrapper: Any) -> list[int] | None:
    """A ``_DatasetSamplerWrapper``'s drawn epoch order (``_sampler_list``), None before its first draw."""
    return getattr(wrapper, "_sampler_list", None)


def set_wrapped_sampler_order(wrapper: Any, order: list[int]) -> None:
    wrapper._sampler_list = order
