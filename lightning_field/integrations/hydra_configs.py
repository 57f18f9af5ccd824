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
import functools
import importlib
import inspect
import types
import typing
from typing import Any, Literal, Optional, Union

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.utils import get_class
from omegaconf import MISSING, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from lightning_field.conf import CONFIG_DIR
from lightning_field.workloads import current_target

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
    them, and an option group's dataclass as a structured config of its own (so a misspelled
    ``callbacks.checkpoint.snapshots.every_n_train_step`` fails at composition); everything else
    (unions of several types, other classes, callables) becomes ``Any``."""
    if annotation in _PRIMITIVES:
        return annotation
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return structured_config(annotation, f"{annotation.__module__}.{annotation.__qualname__}")
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
        # Built at run time from the annotation, so spelled as the subscription call it is.
        return list.__class_getitem__(element) if element in _PRIMITIVES else list[Any]
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
    """A dataclass with ``_target_`` and one typed field per constructor argument of ``cls`` (its
    fields, where ``cls`` is a dataclass itself)."""
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
            fields.append((name, kind, dataclasses.field(default_factory=functools.partial(list, value))))
        else:
            fields.append((name, kind, dataclasses.field(default=value)))
    return dataclasses.make_dataclass(f"{cls.__name__}Config", fields)


def group_options(*groups: str) -> str:
    """``  group: a, b, c`` per line, from the shipped config directory: the ``--help`` listing of
    the apps (Hydra's own lists every group twice, once per search-path entry, and the schemas)."""
    lines = []
    for group in groups:
        options = sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))
        lines.append(f"  {group}: {', '.join(options)}")
    return "\n".join(lines)


def register_configs(store: ConfigStore | None = None) -> None:
    """Put every schema in Hydra's ConfigStore under ``lightning_field_schema/<group>/<option>``,
    and the ``lightning_field_groups`` resolver the apps' ``--help`` uses.

    Idempotent, so the plugin and the apps may both call it."""
    OmegaConf.register_new_resolver("lightning_field_groups", group_options, replace=True)
    store = store or ConfigStore.instance()
    for key, schema in SCHEMAS.items():
        group, _, name = key.rpartition("/")
        node = structured_config(get_class(schema.target), schema.target, schema.exclude)
        store.store(group=f"{SCHEMA_GROUP}/{group}", name=name, node=node)


# ---------------------------------------------------------------------------------------------- your own classes
SWAPPABLE_SECTIONS = ("model", "data")
"""Config sections whose ``_target_`` a user points at a class of their own."""


class TargetConfigError(ValueError):
    """A swapped ``model``/``data`` target cannot be built from the given keys; the message names the
    key and the class's signature. Raised before anything is instantiated."""


def apply_target_swaps(cfg: Any, overrides: typing.Sequence[str]) -> Any:
    """Give ``model._target_=pkg.Class`` (and ``data._target_=``) LightningCLI's meaning: the class with
    its own defaults, and only the keys given on the command line.

    Without this, Hydra merges the override into the shipped group, so the shipped model's other keys
    (``vocab_size``, ``hidden``, ...) reach the user's constructor: a ``TypeError`` at best, and at
    worst a key whose name happens to match silently replaces the user's default (``batch_size``).

    The section is rebuilt from the class's signature (its plain defaults, so the recorded config
    says what ran) plus the keys that ``overrides`` set, type-checked against the annotations before
    anything is built: an unknown key, a wrong type or a missing required argument raises
    :class:`TargetConfigError` naming the key and the signature. ``cfg`` is changed in place and returned.

    First, a ``_target_`` anywhere in ``cfg`` that names a moved class by its old path is refused
    (:func:`refuse_moved_targets`).

    Call it in your own Hydra app with ``HydraConfig.get().overrides.task`` to get the same behaviour
    on the shipped groups; the ``field-*`` apps and ``field scale`` do.
    """
    refuse_moved_targets(OmegaConf.to_container(cfg, resolve=False))
    given = _overridden_keys(overrides)
    for section in SWAPPABLE_SECTIONS:
        if "_target_" not in given.get(section, ()) or section not in cfg:
            continue
        node = cfg[section]
        target = str(node["_target_"])
        cls = _import_class(section, target)
        schema, open_ended = _lenient_schema(cls, target)
        keys = [k for k in given[section] if k != "_target_"]
        raw = OmegaConf.to_container(node, resolve=False)
        assert isinstance(raw, dict)
        chosen = {k: raw[k] for k in keys if k in raw}
        try:
            typed = OmegaConf.structured(schema)
            OmegaConf.set_struct(typed, not open_ended)
            typed = OmegaConf.merge(typed, chosen)
            OmegaConf.to_container(typed, resolve=False, throw_on_missing=True)
        except OmegaConfBaseException as err:
            key = getattr(err, "key", None)
            reason = str(err).splitlines()[0]
            where = f"{section}.{key}" if key else section
            if "MissingMandatoryValue" in type(err).__name__:
                reason = f"{cls.__name__} needs it (no default): pass {where}=..."
            elif type(err).__name__ == "ConfigAttributeError" or "not in" in reason:
                reason = f"{cls.__name__} takes no argument {key!r}"
            raise TargetConfigError(f"{where}: {reason}; {_signature_text(cls)}") from None
        with open_dict(cfg):
            cfg[section] = OmegaConf.create(OmegaConf.to_container(typed, resolve=False))
    return cfg


def refuse_moved_targets(node: Any, where: str = "") -> None:
    """Refuse a ``_target_`` that names a class at the path it had before it moved
    (``lightning_field.workloads.MOVED_TARGETS``), wherever it is set: on the command line, in a
    shipped or the user's own YAML. The error names the path to write instead.

    Raises:
        TargetConfigError: a moved target, e.g. ``model._target_=lightning_field.char_gpt.CharGPT``.
    """
    if isinstance(node, dict):
        for key, value in node.items():
            name = f"{where}.{key}" if where else str(key)
            if key == "_target_" and isinstance(value, str) and current_target(value) != value:
                raise TargetConfigError(
                    f"{name}={value}: that class moved to {current_target(value)} (lightning_field keeps its example"
                    f" workloads in lightning_field.workloads); write {name}={current_target(value)}. A checkpoint"
                    " written under the old name still resumes."
                )
            refuse_moved_targets(value, name)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            refuse_moved_targets(value, f"{where}[{index}]")


def prepare_target_overrides(overrides: typing.Sequence[str]) -> list[str]:
    """Let keys of a swapped target reach Hydra: ``model.width=8`` becomes ``++model.width=8`` when
    ``model._target_`` is overridden too, since the shipped group has no ``width`` and Hydra would
    refuse it before :func:`apply_target_swaps` could check it against the user's class. Hydra's own
    flags (``-m``, ``--cfg job``) and explicit ``+``/``++``/``~`` overrides pass unchanged."""
    swapped = {
        section
        for section in SWAPPABLE_SECTIONS
        if any(o.lstrip("+").split("=", 1)[0] == f"{section}._target_" for o in overrides if "=" in o)
    }
    prepared = []
    for override in overrides:
        key = override.split("=", 1)[0]
        if "=" in override and not override.startswith(("-", "+", "~")) and key.split(".")[0] in swapped:
            override = f"++{override}"
        prepared.append(override)
    return prepared


def _overridden_keys(overrides: typing.Sequence[str]) -> dict[str, set[str]]:
    """section -> first-level keys set under it by the overrides (``model.width=8`` -> width)."""
    found: dict[str, set[str]] = {}
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        if override.is_delete():
            continue
        section, _, rest = override.key_or_group.partition(".")
        if rest:
            found.setdefault(section, set()).add(rest.split(".")[0])
    return found


def _lenient_schema(cls: type, target: str) -> tuple[type, bool]:
    """(dataclass, open-ended) from ``cls``'s constructor: typed fields for arguments whose defaults
    YAML can hold; others are typed ``Any`` and left to the constructor's default."""
    open_ended = _takes_open_kwargs(cls)
    parameters = _parameters(cls)
    if open_ended:  # its **kwargs are its own to read: the base classes' arguments are not implied
        own = inspect.signature(cls).parameters
        parameters = {k: v for k, v in parameters.items() if k in own}
    fields: list[tuple[str, Any, Any]] = [("_target_", str, dataclasses.field(default=target))]
    for name, (annotation, default) in parameters.items():
        kind = omegaconf_type(annotation)
        if default is inspect.Parameter.empty:
            fields.append((name, kind, dataclasses.field(default=MISSING)))
            continue
        value = _plain(default)
        if isinstance(value, list) and _is_plain(value):
            fields.append((name, kind, dataclasses.field(default_factory=functools.partial(list, value))))
        elif _is_plain(value):
            fields.append((name, kind, dataclasses.field(default=value)))
        # A default YAML cannot write (a callable, a tensor) stays the constructor's: no field.
    return dataclasses.make_dataclass(f"{cls.__name__}Config", fields), open_ended


def _takes_open_kwargs(cls: type) -> bool:
    """Whether the class's own constructor takes ``**kwargs``: then a key outside its signature may
    be one it reads itself, and only the constructor can refuse it. (``**kwargs`` that only reach
    Lightning's or torch's constructors accept none of a user's keys.)"""
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        if klass.__module__.startswith(("lightning.", "torch.", "builtins")):
            return False
        params = inspect.signature(inspect.unwrap(init)).parameters.values()
        return any(p.kind is p.VAR_KEYWORD for p in params)
    return False


def _import_class(section: str, target: str) -> type:
    module, _, name = target.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name) if module else None
    except Exception as err:  # the user's module itself may fail to import: say so in one line
        reason = f"{type(err).__name__}: {err}"
    else:
        reason = f"{module or target} has no class {name!r}" if not isinstance(found, type) else ""
    if reason:
        raise TargetConfigError(
            f"{section}._target_={target} cannot be imported ({reason}); it must be importable from the current"
            " directory or PYTHONPATH"
        )
    assert isinstance(found, type)  # refused just above otherwise
    return found


def _signature_text(cls: type) -> str:
    try:
        signature = inspect.signature(cls).replace(return_annotation=inspect.Signature.empty)
    except (TypeError, ValueError):
        return f"see {cls.__module__}.{cls.__qualname__}"
    return f"its signature is {cls.__name__}{signature}"


def resolved_dict(node: Any) -> dict[str, Any]:
    """A config section as plain, resolved data: what an app passes to code that takes a dict."""
    data = OmegaConf.to_container(node, resolve=True)
    if not isinstance(data, dict):
        raise TypeError(f"expected a config mapping, got {type(data).__name__}")
    return {str(key): value for key, value in data.items()}  # Hydra's keys are strings
