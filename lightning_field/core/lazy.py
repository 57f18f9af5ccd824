"""Package exports imported on first use (PEP 562).

A package that re-exports names from heavy modules (torch, Lightning) makes every reader of a JSON
document pay for them: ``field evidence check`` and ``field record check`` read files and hashes,
and importing torch and Lightning costs ~4 s on a small machine. A package built with
:func:`lazy_exports` imports the module behind a name when the name is first looked up.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose public names map to the modules in ``exports``.

    Args:
        package: the package's ``__name__``, for the error message.
        exports: ``{name: module}``; ``name`` is looked up in ``module`` on first use.
        namespace: the package's ``globals()``; a name, once imported, is stored there so that later
            lookups do not reach ``__getattr__``.

    Raises:
        ValueError: when an exported name is also a submodule's name: importing that submodule (from
            anywhere) sets it on the package, which would then hide the lazy name for good. Such a
            name must be imported eagerly.
        AttributeError: (from ``__getattr__``) for a name that is not exported, as for any module.

    Example::

        __getattr__, __dir__ = lazy_exports(__name__, {"verify_checkpoint": "pkg.verify"}, globals())
    """
    submodules = {info.name for info in pkgutil.iter_modules(namespace.get("__path__", ()))}
    if shadowed := sorted(submodules & set(exports)):
        raise ValueError(f"{package}: exported names {shadowed} are also submodules; import them eagerly")

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
