"""Records inside a manifest that a resume acts on: why training stopped (``manifest.stopped``), the
Trainer settings that define the trajectory (``provenance.trainer``) and the lineage's allowed
setting changes (``provenance.changed_settings``).

Read back from storage others can write, each is checked here for the shape this version writes
before anything acts on it: :func:`stop_record_problem` and :func:`lineage_problem` say what is
wrong in words, and the manifest's reader refuses the file naming it.
"""

from __future__ import annotations

from typing import Any, TypedDict


class TrainerSettings(TypedDict, total=False):
    """The Trainer settings that define a run's trajectory (``provenance.trainer``), compared on a
    resume (:mod:`lightning_field.state.trainer_settings`); an earlier version recorded none."""

    accumulate_grad_batches: int | dict[str, int]  # a GradientAccumulationScheduler's schedule: epoch -> factor
    limit_train_batches: int | float
    val_check_interval: int | float | str | None  # text: a time-based interval
    check_val_every_n_epoch: int | None
    gradient_clip_val: int | float | None
    gradient_clip_algorithm: str | None
    precision: str
    world_size: int
    strategy: str  # the strategy's class name
    train_loaders: int


TRAINER_SETTING_TYPES: dict[str, tuple[type, ...]] = {
    "accumulate_grad_batches": (int, dict),
    "limit_train_batches": (int, float),
    "val_check_interval": (int, float, str, type(None)),
    "check_val_every_n_epoch": (int, type(None)),
    "gradient_clip_val": (int, float, type(None)),
    "gradient_clip_algorithm": (str, type(None)),
    "precision": (str,),
    "world_size": (int,),
    "strategy": (str,),
    "train_loaders": (int,),
}
"""What a reader accepts for each recorded setting, in the order they are compared (a key this
version does not know is kept as read, and not compared)."""


class StopRecord(TypedDict, total=False):
    """Why training stopped at the step a checkpoint was saved (``manifest.stopped``), for the rerun.

    ``by``, ``detail`` and ``finished`` are always there. Only ``finished: True`` means that the same
    command, rerun, has nothing to do (``checkpoint.stop_points``); a save at an exception, an
    interrupt or a preemption signal records ``finished: False``, and its rerun continues.
    """

    by: str  # what stopped it: "EarlyStopping", "max_time", "max_steps", "max_epochs", "should_stop", ...
    detail: str  # in words, e.g. "EarlyStopping on val_loss"
    finished: bool
    epochs_done: int  # epochs the run had finished when it stopped (``max_epochs`` counts these)
    stopper: dict[str, Any]  # what a rerun must still have for the stop to hold (a callback's settings, a limit)


class SnapshotIntervalRecord(TypedDict, total=False):
    """The run's step snapshots at a save (``manifest.snapshot_interval``): what the user asked for,
    the interval in force and why (``checkpoint.snapshot_interval``), or why they are off."""

    requested: int | str  # snapshot_every_n_train_steps as given: "auto" or an integer
    every_n_train_steps: int | None  # None: off (reason says why)
    chosen_by: str  # "auto", "auto (measuring)" or "user"
    budget: float
    snapshot_seconds: float | None
    step_seconds: float | None
    overhead: float | None
    reason: str


_SNAPSHOT_INTERVAL_TYPES: dict[str, tuple[type, ...]] = {
    "requested": (int, str),
    "every_n_train_steps": (int, type(None)),
    "chosen_by": (str,),
    "budget": (int, float),
    "snapshot_seconds": (int, float, type(None)),
    "step_seconds": (int, float, type(None)),
    "overhead": (int, float, type(None)),
    "reason": (str,),
}


def snapshot_interval_problem(record: Any) -> str | None:
    """What is wrong with a manifest's ``snapshot_interval`` (a :class:`SnapshotIntervalRecord` or None)."""
    if record is None:
        return None
    if not isinstance(record, dict):
        return f"field 'snapshot_interval' is {type(record).__name__}, not an object"
    for key, types in _SNAPSHOT_INTERVAL_TYPES.items():
        if key in record and not _is_of(record[key], types):
            return f"field 'snapshot_interval.{key}' is {shown(record[key])}, not {types[0].__name__}"
    if not isinstance(record.get("reason"), str):
        return "field 'snapshot_interval' needs a reason (text)"
    return None


def shown(value: Any) -> str:
    """An untrusted value in a refusal: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_of(value: Any, types: tuple[type, ...]) -> bool:
    return isinstance(value, types) and (bool in types or not isinstance(value, bool))


def stop_record_problem(stopped: Any) -> str | None:
    """What is wrong with a manifest's ``stopped`` (a :class:`StopRecord` or None), else None."""
    if stopped is None:
        return None
    if not isinstance(stopped, dict):
        return f"field 'stopped' is {type(stopped).__name__}, not dict"
    by, detail, finished = stopped.get("by"), stopped.get("detail"), stopped.get("finished")
    if not (isinstance(by, str) and isinstance(detail, str) and isinstance(finished, bool)):
        return (
            "field 'stopped' needs by and detail (texts) and finished (true or false);"
            f" got by={shown(by)}, detail={shown(detail)}, finished={shown(finished)}"
        )
    epochs = stopped.get("epochs_done", 0)
    if not _is_of(epochs, (int,)) or not 0 <= epochs < 2**53:
        return f"field 'stopped.epochs_done' is {shown(epochs)}, not a count of epochs"
    if not isinstance(stopped.get("stopper", {}), dict):
        return f"field 'stopped.stopper' is {type(stopped['stopper']).__name__}, not dict"
    return None


def lineage_problem(provenance: dict[str, Any]) -> str | None:
    """What is wrong with the provenance a resume compares and carries on (the Trainer settings, the
    lineage's inexact resume and allowed setting changes), else None."""
    settings = provenance.get("trainer", {})
    if not isinstance(settings, dict):
        return f"field 'provenance.trainer' is {type(settings).__name__}, not dict"
    for key, types in TRAINER_SETTING_TYPES.items():
        value = settings.get(key)
        if key in settings and not _is_of(value, types):
            expected = " or ".join(t.__name__ for t in types)
            return f"field 'provenance.trainer.{key}' is {shown(value)}, not {expected}"
    schedule = settings.get("accumulate_grad_batches")
    if isinstance(schedule, dict) and not all(_is_of(factor, (int,)) for factor in schedule.values()):
        return f"field 'provenance.trainer.accumulate_grad_batches' is {shown(schedule)}, not a schedule of factors"
    if not isinstance(provenance.get("inexact_resume", {}), dict):
        return "field 'provenance.inexact_resume' is not an object"
    changed = provenance.get("changed_settings", [])
    if not isinstance(changed, list) or not all(
        isinstance(entry, dict)
        and isinstance(entry.get("changes"), dict)
        and all(isinstance(pair, list) and len(pair) == 2 for pair in entry["changes"].values())
        for entry in changed
    ):
        return (
            f"field 'provenance.changed_settings' is {shown(changed)}, not a list of resumes, each with its changes"
            " as setting: [checkpoint's value, the run's value]"
        )
    return None
