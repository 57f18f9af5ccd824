"""``ManifestCheckpoint``'s own options, grouped by concern: where checkpoints are written
(:class:`StorageConfig`), the step-snapshot tier (:class:`SnapshotConfig`), what a resume accepts
(:class:`ResumeConfig`) and how an interrupted attempt ends (:class:`InterruptConfig`).

``ModelCheckpoint``'s own arguments stay flat, as Lightning's users write them; everything this
package adds sits in one of these groups, each checked in ``__post_init__`` (a bad value is refused
when it is written, naming the group and the field) and mirrored in Hydra by
``conf/lightning_field/callbacks/checkpoint.yaml``. The flat names of 0.x (``snapshot_dir=...``,
``allow_resume_mismatch=...``) keep working in Python calls through :func:`grouped_options`, with a
``DeprecationWarning`` naming the new spelling; LightningCLI and Hydra read the signature and the
schema, so there only the grouped keys exist.

Lightning-free: the defaults live here, and the modules that apply the options import them.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import numbers
import os
import signal
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from lightning_field.checkpoint.snapshot_interval import DEFAULT_BUDGET, check_every_n_train_steps
from lightning_field.checkpoint.stores.object import DEFAULT_CONCURRENCY, DEFAULT_PART_BYTES, check_multipart
from lightning_field.state.trainer_settings import allowed_changes

__all__ = [
    "DEFAULT_MAX_FAILED_ATTEMPTS",
    "DEFAULT_SIGNALS",
    "FLAT_NAMES",
    "SAVE_ERROR_POLICIES",
    "InterruptConfig",
    "ResumeConfig",
    "SaveErrorPolicy",
    "SnapshotConfig",
    "StorageConfig",
    "grouped_options",
    "positive_or_none",
    "save_error_policy",
]

SaveErrorPolicy = Literal["stop", "warn"]
SAVE_ERROR_POLICIES: tuple[SaveErrorPolicy, ...] = ("stop", "warn")

# Plain ints, not signal.Signals members: LightningCLI and OmegaConf must be able to write the default
# out (jsonargparse dumps the parsed config as YAML, which cannot represent an enum).
DEFAULT_SIGNALS: tuple[int, ...] = (int(signal.SIGTERM), int(signal.SIGUSR1))
"""SIGTERM (what schedulers and ``kill`` send) and SIGUSR1 (SLURM's ``--signal`` default)."""

DEFAULT_MAX_FAILED_ATTEMPTS = 3
"""Attempts that may fail in a row without committing past the step the next one resumes from."""


def save_error_policy(value: object) -> SaveErrorPolicy:
    """``value`` as a policy for a failed background save; the one place it is checked.

    Raises:
        ValueError: ``value`` is not ``"stop"`` or ``"warn"``.
    """
    for policy in SAVE_ERROR_POLICIES:
        if value == policy:
            return policy
    raise ValueError(f"storage.on_save_error must be one of {SAVE_ERROR_POLICIES}, got {value!r}")


def _is_count(value: Any) -> bool:
    # Any integer type (numpy's too), never a bool.
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def positive_or_none(where: str, value: Any) -> int | None:
    """``value`` as a count of at least 1, or None; the one check for such options.

    Raises:
        ValueError: anything else, naming ``where`` (``resume.max_failed_attempts``).
    """
    if value is None:
        return None
    if not _is_count(value) or value < 1:
        raise ValueError(f"{where} must be None or an integer >= 1, got {value!r}")
    return int(value)


def _names(where: str, value: Iterable[str] | str) -> tuple[str, ...]:
    """``value`` as names: a lone string is one name, not its characters.

    Raises:
        ValueError: anything but a string or an iterable of strings, naming ``where``.
    """
    names = (value,) if isinstance(value, str) else tuple(value) if isinstance(value, Iterable) else None
    if names is None or not all(isinstance(name, str) for name in names):
        raise ValueError(f"{where} must be a name or a list of names, got {value!r}")
    return names


_UNCATCHABLE = {int(signal.SIGKILL), int(signal.SIGSTOP)}


def _signal_numbers(value: Any) -> tuple[int, ...]:
    """``value`` as signal numbers this platform knows and a handler can catch.

    Raises:
        ValueError: anything else, naming ``interrupts.signals`` and the value.
    """
    known = {int(s) for s in signal.valid_signals()} - _UNCATCHABLE
    items = tuple(value) if isinstance(value, Iterable) and not isinstance(value, (str, bytes)) else None
    if items is None or not all(_is_count(item) and int(item) in known for item in items):
        raise ValueError(
            f"interrupts.signals must be a list of signal numbers a handler can catch (e.g. [{int(signal.SIGTERM)},"
            f" {int(signal.SIGUSR1)}] for SIGTERM and SIGUSR1), got {value!r}"
        )
    return tuple(int(item) for item in items)


@dataclass(frozen=True)
class StorageConfig:
    """Where persistent checkpoints are written, and how their commit runs.

    Args:
        options: fsspec options for a ``dirpath`` URL such as ``s3://bucket/run/ckpts`` (e.g.
            ``{"endpoint_url": ..., "key": ...}``); the manifest object is the commit there.
        upload_part_bytes: multipart part size per file in object stores (S3's minimum is 5 MiB).
        upload_concurrency: parts in flight per file.
        async_save: a background thread commits from reusable host buffers (copied while the next
            step runs; an in-place write before the copy fails that save); one in flight.
        on_save_error: after a failed background save is reported, ``"stop"`` raises
            ``CheckpointSaveError`` on every rank, ``"warn"`` trains on.
        store: a :class:`~lightning_field.checkpoint.stores.CheckpointStore` for every write and read
            (default: a ``LocalStore`` for a path, an ``ObjectStore`` for a URL), or your own backend.

    Raises:
        ValueError: a part size below 5 MiB, a concurrency below 1, ``options`` that are not a
            mapping, or an unknown ``on_save_error``.
    """

    # Out of repr and hash: fsspec options carry credentials (key, secret), and a dict has no hash.
    options: Mapping[str, Any] | None = dataclasses.field(default=None, repr=False, hash=False)
    upload_part_bytes: int = DEFAULT_PART_BYTES
    upload_concurrency: int = DEFAULT_CONCURRENCY
    async_save: bool = False
    on_save_error: SaveErrorPolicy = "stop"
    store: Any = None  # a CheckpointStore; checked against the protocol where the store is first used

    def __post_init__(self) -> None:
        names = ("storage.upload_part_bytes", "storage.upload_concurrency")
        check_multipart(self.upload_part_bytes, self.upload_concurrency, names)
        object.__setattr__(self, "on_save_error", save_error_policy(self.on_save_error))
        if self.options is not None:
            if not isinstance(self.options, Mapping):
                raise ValueError(
                    f"storage.options must be a mapping of fsspec options, got {type(self.options).__name__}"
                )
            object.__setattr__(self, "options", dict(self.options))


@dataclass(frozen=True)
class SnapshotConfig:
    """The step-snapshot tier: node-local checkpoints between persistent ones.

    Args:
        every_n_train_steps: snapshot every this many steps; ``"auto"`` (default): where they pay,
            at the interval that minimises the predicted waste from their measured cost, the
            persistent interval and the failure model; ``None``: off.
        directory: node-local and outliving the process: default ``/dev/shm`` (else the temporary
            directory); over several machines each node's snapshots are replicated to a partner.
        in_line: commit before the next step (True) or beside it from a host copy (False); default:
            in line where training computes on the CPU, beside it on an accelerator.
        overhead_budget: the largest share of step time ``"auto"`` snapshots may take.

    Raises:
        ValueError: ``every_n_train_steps`` is not ``"auto"``, ``None`` or an integer >= 1, or
            ``overhead_budget`` is not in (0, 1).
    """

    every_n_train_steps: int | Literal["auto"] | None = "auto"
    directory: str | os.PathLike[str] | None = None
    in_line: bool | None = None
    overhead_budget: float = DEFAULT_BUDGET

    def __post_init__(self) -> None:
        check_every_n_train_steps(self.every_n_train_steps, self.overhead_budget)


@dataclass(frozen=True)
class ResumeConfig:
    """What a resume accepts, and what it refuses.

    Args:
        allow_mismatch: provenance differences to accept, by dotted name or prefix, e.g.
            ``["world_size", "code.git_commit", "config"]``.
        allow_changed: Trainer settings a resume may change, e.g. ``["accumulate_grad_batches"]``
            (else refused by name); the lineage is then recorded as inexact.
        inexact: where ``ckpt_path="last"`` finds no recoverable checkpoint, resume the newest one
            anyway (and an explicit ``ckpt_path`` to an unrecoverable one); later manifests record it.
        require_fresh: refuse a ``"last"`` resume older than the signed record of the newest commit.
        max_failed_attempts: after this many attempts failed with nothing committed past the step the
            next one resumes from, refuse before the first batch (exit 77); None: off.
        trust_pickles: fully unpickle files that need it; off, such a file is refused naming its type.

    Raises:
        ValueError: ``max_failed_attempts`` is not None or an integer >= 1, ``allow_mismatch`` or
            ``allow_changed`` is not a name or a list of names, or ``allow_changed`` names something
            other than a Trainer setting a resume may change.
    """

    allow_mismatch: Iterable[str] = ()
    allow_changed: Iterable[str] = ()
    inexact: bool = False
    require_fresh: bool = False
    max_failed_attempts: int | None = DEFAULT_MAX_FAILED_ATTEMPTS
    trust_pickles: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "allow_mismatch", _names("resume.allow_mismatch", self.allow_mismatch))
        object.__setattr__(self, "allow_changed", _names("resume.allow_changed", self.allow_changed))
        allowed_changes(self.allow_changed)  # an unknown name is refused here, naming the valid ones
        object.__setattr__(
            self, "max_failed_attempts", positive_or_none("resume.max_failed_attempts", self.max_failed_attempts)
        )


@dataclass(frozen=True)
class InterruptConfig:
    """How an attempt that is told to stop, or stops by itself, leaves a resume point.

    Args:
        signals: signals that trigger a save at the next step boundary, then ``TrainingPreempted``
            (exit status 75 uncaught); under SLURM auto-requeue its signal too.
        check_every_n_steps: how often ranks agree on a pending signal (an all-reduce); default 1 on
            CPU, else 10.
        save_on_stop: commit a recoverable checkpoint where ``trainer.should_stop`` ends fit before
            its limits (``max_time``, ``EarlyStopping``, any callback).
        save_on_train_end: also commit the state training ends with at ``max_steps`` or
            ``max_epochs`` (unless saved): a rerun with larger limits then redoes none of the last steps.

    Raises:
        ValueError: ``signals`` holds anything but numbers of signals a handler can catch, or
            ``check_every_n_steps`` is not None or an integer >= 1.
    """

    signals: Sequence[int] = DEFAULT_SIGNALS
    check_every_n_steps: int | None = None
    save_on_stop: bool = True
    save_on_train_end: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "signals", _signal_numbers(self.signals))
        object.__setattr__(
            self, "check_every_n_steps", positive_or_none("interrupts.check_every_n_steps", self.check_every_n_steps)
        )


FLAT_NAMES: dict[str, tuple[str, str]] = {
    "storage_options": ("storage", "options"),
    "upload_part_bytes": ("storage", "upload_part_bytes"),
    "upload_concurrency": ("storage", "upload_concurrency"),
    "async_save": ("storage", "async_save"),
    "on_save_error": ("storage", "on_save_error"),
    "store": ("storage", "store"),
    "snapshot_every_n_train_steps": ("snapshots", "every_n_train_steps"),
    "snapshot_dir": ("snapshots", "directory"),
    "snapshot_in_line": ("snapshots", "in_line"),
    "snapshot_overhead_budget": ("snapshots", "overhead_budget"),
    "allow_resume_mismatch": ("resume", "allow_mismatch"),
    "allow_changed": ("resume", "allow_changed"),
    "resume_inexact": ("resume", "inexact"),
    "require_fresh": ("resume", "require_fresh"),
    "max_failed_attempts": ("resume", "max_failed_attempts"),
    "trust_pickles": ("resume", "trust_pickles"),
    "preemption_signals": ("interrupts", "signals"),
    "preemption_check_every_n_steps": ("interrupts", "check_every_n_steps"),
    "save_on_stop": ("interrupts", "save_on_stop"),
    "save_on_train_end": ("interrupts", "save_on_train_end"),
}
"""0.x's flat keyword -> (group, field): each still accepted, with a ``DeprecationWarning``."""

GROUPS: dict[str, type] = {
    "storage": StorageConfig,
    "snapshots": SnapshotConfig,
    "resume": ResumeConfig,
    "interrupts": InterruptConfig,
}

_Group = TypeVar("_Group", StorageConfig, SnapshotConfig, ResumeConfig, InterruptConfig)


def _as_group(kind: type[_Group], name: str, value: Any) -> _Group:
    """``value`` as the group: the dataclass itself, None (its defaults), or a mapping of its fields
    (a Hydra ``DictConfig``, a LightningCLI dict)."""
    if value is None:
        return kind()
    if isinstance(value, kind):
        return value
    if isinstance(value, Mapping):
        fields = {f.name for f in dataclasses.fields(kind)}
        unknown = sorted(str(key) for key in value if key not in fields and key != "_target_")
        if unknown:
            raise TypeError(
                f"{name}: {kind.__name__} has no field {', '.join(map(repr, unknown))}; it has {sorted(fields)}"
            )
        return kind(**{str(key): item for key, item in value.items() if key != "_target_"})
    raise TypeError(f"{name} must be a {kind.__name__}, a mapping of its fields or None, got {type(value).__name__}")


def _nearest(name: str, parameters: Iterable[str]) -> str | None:
    """What a misspelled keyword most likely meant: one of the callback's own ``parameters``
    (ModelCheckpoint's ``every_n_train_steps``, say) or a flat name of 0.x, that it begins (a name cut
    short), else the closest by spelling."""
    candidates = [*parameters, *FLAT_NAMES]
    begun = [candidate for candidate in candidates if len(name) >= 4 and candidate.startswith(name)]  # cut short
    if begun:
        return min(begun, key=len)
    near = difflib.get_close_matches(name, candidates, n=1)
    return near[0] if near else None


def _hint(owner: str, name: str, parameters: Iterable[str]) -> str | None:
    near = _nearest(name, parameters)
    if near is None:
        return None
    spelled = _new_spelling(owner, near) if near in FLAT_NAMES else near
    return f"did you mean {spelled} for {name!r}?"


def _new_spelling(owner: str, flat_name: str) -> str:
    group, field = FLAT_NAMES[flat_name]
    return f"{owner}({group}={GROUPS[group].__name__}({field}=...))"


def grouped_options(
    groups: Mapping[str, Any],
    flat: Mapping[str, Any],
    owner: str = "ManifestCheckpoint",
    accepts: Callable[..., Any] | None = None,
) -> tuple[StorageConfig, SnapshotConfig, ResumeConfig, InterruptConfig]:
    """The four groups from ``groups`` (name -> a dataclass, a mapping or None) with 0.x's flat
    keywords ``flat`` folded in, each with a ``DeprecationWarning`` naming its new spelling.
    ``accepts``: the owner's ``__init__``, whose own keyword names a misspelled keyword is matched
    against too (read only then).

    Raises:
        TypeError: a keyword that is neither an argument nor a flat name of 0.x (the nearest names
            suggested), or a group of the wrong type.
        ValueError: a flat name given beside its group where the group sets that field to another
            value, or a value its group refuses.
    """
    unknown = sorted(set(flat) - set(FLAT_NAMES))
    if unknown:
        named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        own = [] if accepts is None else list(inspect.signature(accepts).parameters.values())
        parameters = [p.name for p in own if p.kind in named and p.name != "self"]
        hints = [hint for name in unknown if (hint := _hint(owner, name, parameters)) is not None]
        raise TypeError(
            f"{owner}.__init__() got an unexpected keyword argument {', '.join(map(repr, unknown))}"
            + (f" ({'; '.join(hints)})" if hints else "")
        )
    built: dict[str, Any] = {name: _as_group(kind, name, groups.get(name)) for name, kind in GROUPS.items()}
    moved: dict[str, dict[str, Any]] = {}
    for name, value in flat.items():
        group, field = FLAT_NAMES[name]
        # The group given (a shipped Hydra config fills every group) may leave the field at its default:
        # then the flat name sets it; a field the group sets to another value would be set twice.
        current, default = getattr(built[group], field), getattr(GROUPS[group](), field)
        given = getattr(dataclasses.replace(GROUPS[group](), **{field: value}), field)  # as its group holds it
        if current != default and current != given:
            raise ValueError(
                f"{owner}: {name}={value!r} and {group}.{field}={current!r} set the same option;"
                f" give it once, as {group}.{field}"
            )
        moved.setdefault(group, {})[field] = value
        warnings.warn(
            f"{owner}({name}=...) is deprecated; use {_new_spelling(owner, name)}", DeprecationWarning, stacklevel=3
        )
    for group, fields in moved.items():
        built[group] = dataclasses.replace(built[group], **fields)  # checked again in __post_init__
    return built["storage"], built["snapshots"], built["resume"], built["interrupts"]
