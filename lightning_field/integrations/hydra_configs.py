"""Structured configs that type-check the shipped Hydra groups, and the search path that ships them.

The schemas are generated from the constructors the YAML files mirror rather than written out by
hand: a hand-written dataclass per callback drifts from its constructor the day an argument is
added, and a stale schema rejects a valid override. One source of truth, the signature, and
``tests/test_configs.py`` checks that each YAML file still names every argument.

Each shipped group file pulls its schema in with ``optional``: an app that composes the configs
through ``hydra.searchpath`` without importing this module still composes, only without the type
checks (the search-path plugin and the ``field-*`` apps register them).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import inspect
import types
import typing
from typing import Any, Literal, Optional, Union

from hydra.core.config_store import ConfigStore
from hydra.utils import get_class
from omegaconf import MISSING

CONFIG_PACKAGE = "pkg://lightning_field.conf"
"""The search-path entry that makes ``lightning_field/<group>/<option>`` composable in any Hydra app."""
SCHEMA_GROUP = "lightning_field_schema"

_PRIMITIVES = (int, float, bool, str)
_SEQUENCES = (list, tuple, collections.abc.Sequence, collections.abc.Iterable, collections.abc.MutableSequence)
_MAPPINGS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)


@dataclasses.dataclass(frozen=True)
class Schema:
    """Which class a shipped config instantiates; ``exclude`` are arguments only code can pass."""

    target: str
    exclude: frozenset[str] = frozenset()


# group/option -> the class its YAML mirrors. Model, data and strategy configs have none on purpose:
# users point them at their own classes (model._target_=my_pkg.MyModule) with their own arguments.
SCHEMAS: dict[str, Schema] = {
    "callbacks/checkpoint": Schema("lightning_field.ManifestCheckpoint", frozenset({"generators", "config"})),
    "callbacks/time_to_quality": Schema("lightning_field.TimeToQuality"),
    "callbacks/checkpoint_cadence": Schema("lightning_field.CheckpointCadence"),
    "callbacks/straggler_monitor": Schema("lightning_field.StragglerMonitor"),
    "callbacks/restore_drill": Schema("lightning_field.RestoreDrill"),
    "callbacks/wandb_review": Schema("lightning_field.WandbReview"),
    "trainer/default": Schema("lightning.pytorch.Trainer", frozenset({"callbacks", "logger", "plugins", "profiler"})),
    "logger/csv": Schema("lightning.pytorch.loggers.CSVLogger"),
}


def omegaconf_type(annotation: Any) -> Any:
    """The closest type OmegaConf can validate: primitives, Optional primitives, lists and dicts of
    them; everything else (unions of several types, classes, callables) becomes ``Any``."""
    if annotation in _PRIMITIVES:
        return annotation
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        kinds = {type(a) for a in args}
        return kinds.pop() if len(kinds) == 1 and kinds <= set(_PRIMITIVES) else Any
    if origin in (Union, types.UnionType):
        present = [a for a in args if a is not type(None)]
        inner = omegaconf_type(present[0]) if len(present) == 1 else Any
        if inner is Any or len(present) == len(args):
            return inner
        return Optional[inner]  # noqa: UP045 - OmegaConf reads typing.Optional, not X | None
    if origin in _SEQUENCES or annotation in (list, tuple):
        element = omegaconf_type(args[0]) if args else Any
        return list[element] if element in _PRIMITIVES else list[Any]
    if origin in _MAPPINGS or annotation is dict:
        return dict[str, Any]
    return Any


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _is_plain(value: Any) -> bool:
    if value is None or isinstance(value, _PRIMITIVES):
        return True
    return isinstance(value, list) and all(_is_plain(v) for v in value)


def _parameters(cls: type) -> dict[str, tuple[Any, Any]]:
    """name -> (annotation, default) for ``cls.__init__``, followed through ``**kwargs`` into the base
    class that receives them (ManifestCheckpoint forwards every ModelCheckpoint argument)."""
    found: dict[str, tuple[Any, Any]] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        init = inspect.unwrap(init)
        try:
            hints = typing.get_type_hints(init)
        except Exception:  # an unresolvable forward reference: fall back per parameter below
            hints = {}
        takes_kwargs = False
        for name, param in inspect.signature(init).parameters.items():
            if name == "self" or param.kind is param.VAR_POSITIONAL:
                continue
            if param.kind is param.VAR_KEYWORD:
                takes_kwargs = True
                continue
            annotation = hints.get(name, param.annotation if not isinstance(param.annotation, str) else Any)
            found.setdefault(name, (annotation, param.default))
        if not takes_kwargs:
            break
    return found


def structured_config(cls: type, target: str, exclude: frozenset[str] = frozenset()) -> type:
    """A dataclass with ``_target_`` and one typed field per constructor argument of ``cls``."""
    fields: list[tuple[str, Any, Any]] = [("_target_", str, dataclasses.field(default=target))]
    for name, (annotation, default) in _parameters(cls).items():
        if name in exclude:
            continue
        kind = omegaconf_type(annotation)
        if default is inspect.Parameter.empty:
            fields.append((name, kind, dataclasses.field(default=MISSING)))
            continue
        value = _plain(default)
        if not _is_plain(value):
            raise TypeError(f"{target}.{name}: default {default!r} cannot be written in YAML; exclude it")
        if isinstance(value, list):
            fields.append((name, kind, dataclasses.field(default_factory=lambda v=value: list(v))))
        else:
            fields.append((name, kind, dataclasses.field(default=value)))
    return dataclasses.make_dataclass(f"{cls.__name__}Config", fields)


def register_configs(store: ConfigStore | None = None) -> None:
    """Put every schema in Hydra's ConfigStore under ``lightning_field_schema/<group>/<option>``.

    Idempotent, so the plugin and the apps may both call it."""
    store = store or ConfigStore.instance()
    for key, schema in SCHEMAS.items():
        group, _, name = key.rpartition("/")
        node = structured_config(get_class(schema.target), schema.target, schema.exclude)
        store.store(group=f"{SCHEMA_GROUP}/{group}", name=name, node=node)
