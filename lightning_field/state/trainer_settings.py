"""The Trainer settings that define a run's trajectory, recorded in every manifest and compared on resume.

A checkpoint resumes exactly only under the settings it was trained with: ``accumulate_grad_batches``
(how many batches make a step), ``limit_train_batches`` (where an epoch ends, and with it every
epoch-seeded shuffle), ``val_check_interval`` and ``check_val_every_n_epoch`` (where validation
runs, and with it ``EarlyStopping``, ``ReduceLROnPlateau`` and validation-scheduled saves),
``gradient_clip_val``/``gradient_clip_algorithm``, ``precision``, the world size and strategy, and
the number of train loaders. Each is recorded in ``provenance.trainer``
(:class:`~lightning_field.core.manifest_records.TrainerSettings`) and a change is refused before
anything is unpickled, naming the setting and both values, unless the user allows it
(``ManifestCheckpoint(resume=ResumeConfig(allow_changed=["accumulate_grad_batches"]))``). An allowed
change resumes, and the lineage records it (``provenance.changed_settings``, carried into every later
manifest): it is no longer exact against an uninterrupted run, and no evidence may call it so.

Two settings are compared where they already were, so that each has one refusal and one way out:
the world size by the resume policy's identity check (allowed by ``ResumeConfig(allow_mismatch=["world_size"])``,
a resharded resume), and the number of train loaders by the loader-settings check
(:func:`~lightning_field.state.loaders.changed_loader_settings`), which sees the loaders first.
A strategy change that only follows a world-size change (Lightning's ``"auto"`` picks
``SingleDeviceStrategy`` for one device and ``DDPStrategy`` for several) is part of that change.
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Iterable, Mapping
from typing import Any

from lightning_field.core.errors import ResumeMismatchError
from lightning_field.core.manifest_records import TRAINER_SETTING_TYPES, TrainerSettings

__all__ = [
    "ALLOWABLE",
    "SETTINGS",
    "allowed_changes",
    "change_lines",
    "changed_settings",
    "refuse_changed_settings",
    "trainer_settings",
]

SETTINGS: tuple[str, ...] = tuple(TRAINER_SETTING_TYPES)
"""Every recorded setting, in the order a refusal lists them."""

COMPARED_ELSEWHERE = {
    "world_size": (
        "a world size change is a resharded resume: allow it with ResumeConfig(allow_mismatch=['world_size'])"
    ),
    "train_loaders": "a saved data position holds only for the train loaders it was saved with",
}
"""The recorded settings ``allow_changed`` cannot name, and why."""

ALLOWABLE: tuple[str, ...] = tuple(name for name in SETTINGS if name not in COMPARED_ELSEWHERE)
"""The names ``ResumeConfig(allow_changed=...)`` accepts."""

_AUTO_STRATEGIES = frozenset({"SingleDeviceStrategy", "DDPStrategy"})


def allowed_changes(names: Iterable[str]) -> frozenset[str]:
    """``allow_changed`` as given, checked.

    Raises:
        ValueError: a name is not a setting a resume may change; the message names it and the valid ones.
    """
    if isinstance(names, str):
        names = [names]  # allow_changed="precision": one setting, not its letters
    chosen = frozenset(str(name) for name in names)
    unknown = sorted(chosen - set(ALLOWABLE))
    if unknown:
        why = "; ".join(f"{name}: {COMPARED_ELSEWHERE[name]}" for name in unknown if name in COMPARED_ELSEWHERE)
        raise ValueError(
            f"ResumeConfig(allow_changed=...) names {', '.join(repr(n) for n in unknown)}, not a Trainer setting"
            f" a resume may change{f' ({why})' if why else ''}. The settings it may name: {', '.join(ALLOWABLE)}."
        )
    return chosen


def _plain(value: Any) -> Any:
    """A setting as JSON records it: an enum by its value, a time interval as text."""
    if isinstance(value, enum.Enum):
        return _plain(value.value)
    if isinstance(value, datetime.timedelta):
        return str(value)
    if isinstance(value, Mapping):
        try:
            return str(datetime.timedelta(**value))  # a time-based val_check_interval, {"seconds": 300.0}
        except TypeError:
            return str(dict(value))
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def trainer_settings(trainer: Any, train_loaders: int | None = None) -> TrainerSettings:
    """This Trainer's trajectory-defining settings (``train_loaders``: how many train loaders it
    trains on, once they exist). With a ``GradientAccumulationScheduler`` its schedule is recorded,
    not the factor the current epoch happens to use."""
    # Imported here: the comparisons above are read without the training stack (Lightning, torch).
    from lightning.pytorch.callbacks import GradientAccumulationScheduler

    from lightning_field.compat import lightning as internals  # the same: it imports Lightning

    accumulate: int | dict[str, int] = int(trainer.accumulate_grad_batches)
    for callback in getattr(trainer, "callbacks", []):
        if isinstance(callback, GradientAccumulationScheduler):
            accumulate = {str(epoch): int(factor) for epoch, factor in sorted(callback.scheduling.items())}
    settings: TrainerSettings = {
        "accumulate_grad_batches": accumulate,
        "limit_train_batches": _plain(trainer.limit_train_batches),
        "val_check_interval": _plain(internals.val_check_interval(trainer)),
        "check_val_every_n_epoch": _plain(trainer.check_val_every_n_epoch),
        "gradient_clip_val": _plain(trainer.gradient_clip_val),
        "gradient_clip_algorithm": _plain(trainer.gradient_clip_algorithm),
        "precision": str(_plain(trainer.precision)),
        "world_size": int(trainer.world_size),
        "strategy": type(trainer.strategy).__name__,
    }
    if train_loaders is not None:
        settings["train_loaders"] = train_loaders
    return settings


def _same(saved: Any, now: Any) -> bool:
    # 1 and 1.0 are different settings (one batch, or the whole epoch); True is not 1.
    return type(saved) is type(now) and saved == now


def changed_settings(saved: Mapping[str, Any], now: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Each setting recorded on both sides whose value differs, ``name -> (checkpoint's, now)``, in
    :data:`SETTINGS` order. The world size is the identity check's (not listed), and a strategy
    change that comes with a world-size change between the two strategies ``"auto"`` picks is part
    of it; a setting one side lacks (an earlier or later version) is not compared."""
    resized = saved.get("world_size") != now.get("world_size")
    changes: dict[str, tuple[Any, Any]] = {}
    for name in SETTINGS:
        if name == "world_size" or name not in saved or name not in now or _same(saved[name], now[name]):
            continue
        if name == "strategy" and resized and {saved[name], now[name]} <= _AUTO_STRATEGIES:
            continue
        changes[name] = (saved[name], now[name])
    return changes


def change_lines(changes: Mapping[str, tuple[Any, Any]]) -> list[str]:
    """``accumulate_grad_batches: 2 (checkpoint) -> 4 (now)``, one per change."""
    return [f"{name}: {before!r} (checkpoint) -> {after!r} (now)" for name, (before, after) in changes.items()]


def refuse_changed_settings(
    saved: Mapping[str, Any], now: Mapping[str, Any], allowed: Iterable[str], where: Any
) -> dict[str, tuple[Any, Any]]:
    """The changes ``allowed`` covers (the caller records them); the rest refused.

    Raises:
        ResumeMismatchError: a setting changed that ``allowed`` does not name, every such change in
            the message (``differences``: ``trainer.<name>`` -> both values, ``allowed_by`` the keyword
            that would allow them, None when one cannot be allowed).
    """
    changes = changed_settings(saved, now)
    allowed = frozenset(allowed)
    blocking = {name: values for name, values in changes.items() if name not in allowed}
    if not blocking:
        return changes
    lines = "\n".join(f"  {line}" for line in change_lines(blocking))
    allowable = [name for name in blocking if name in ALLOWABLE]
    ways = ["set them back to the checkpoint's values to resume exactly"]
    if allowable:
        names = ", ".join(repr(name) for name in sorted({*allowable, *(allowed & set(changes))}))
        ways.append(
            "or resume anyway, knowing the lineage is then no longer exact against an uninterrupted run (every later"
            f" manifest records it): ManifestCheckpoint(resume=ResumeConfig(allow_changed=[{names}]))"
        )
    ways.append("or start a new run on purpose (ckpt_path=None)")
    raise ResumeMismatchError(
        f"Refusing to resume from {where}: Trainer settings that define the training trajectory changed since it"
        f" was saved.\n{lines}\nThe continuation would match an uninterrupted run under neither setting. Ways out: "
        + "; ".join(ways)
        + ".",
        differences={f"trainer.{name}": values for name, values in blocking.items()},
        allowed_by="resume.allow_changed" if len(allowable) == len(blocking) else None,
    )
