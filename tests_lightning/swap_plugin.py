"""pytest plugin: Lightning's tests see ``ManifestCheckpoint`` wherever they see ``ModelCheckpoint``.

Load it into a run of Lightning's own test files (``tests_lightning/run.py`` does)::

    PYTHONPATH=/path/to/this/repo pytest -p tests_lightning.swap_plugin --tl-swap ...

What is swapped, before any test module is imported (``pytest_configure``):

- ``lightning.pytorch.callbacks.ModelCheckpoint``: the name the test modules import
  (``from lightning.pytorch.callbacks import ModelCheckpoint``, ``callbacks.ModelCheckpoint``), so every
  callback a test builds, every ``mock.patch.object(ModelCheckpoint, ...)`` and every
  ``isinstance(cb, ModelCheckpoint)`` of a test is ``ManifestCheckpoint``'s;
- ``lightning.pytorch.trainer.connectors.callback_connector.ModelCheckpoint``: the Trainer's default
  checkpoint callback (``enable_checkpointing=True`` with none given) is a ``ManifestCheckpoint()``.

Not swapped: ``lightning.pytorch.callbacks.model_checkpoint.ModelCheckpoint`` (it is ``ManifestCheckpoint``'s
own base class, and Lightning's internal ``isinstance`` checks against it hold for the subclass).

``ManifestCheckpoint`` runs at its defaults, unless ``--tl-snapshots=off`` changes the one default
``snapshots`` to ``SnapshotConfig(every_n_train_steps=None)`` (through ``__init__.__kwdefaults__``, so the
class, its name and its state key stay the same). ``--tl-format-adapt`` turns on the format-only adaptations of
:mod:`tests_lightning.format_adaptations` (each listed there, with why). Without ``--tl-swap`` the
plugin swaps nothing: with ``--tl-format-adapt`` that is the check that the adaptations leave plain
``ModelCheckpoint`` runs unchanged.

Artifact attribution: Lightning's conftest fails a test that leaves new files under its tests folder
(``leave_no_artifacts_behind``); a file that an earlier test left is not new, so only the first test
that writes one (say, into the working directory) is flagged. This plugin's autouse fixture, torn down
after that check, removes what the test left there, so each test that writes one is flagged. It
changes nothing for a test that leaves nothing (every test of the control).

Child processes: ``strategy="ddp_spawn"`` starts fresh interpreters that unpickle the test's callback,
re-importing its test module there, where no pytest plugin runs. So ``pytest_configure`` also puts the
same settings in the environment (``TL_CHILD_SETTINGS``) and ``tests_lightning/_child`` on ``PYTHONPATH``,
whose ``sitecustomize`` applies them in a child just before it first imports ``tests_pytorch``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

_STATE: dict[str, Any] = {"swapped": False, "snapshots": "default", "adaptations": [], "applied": False}
CHILD_ENV = "TL_CHILD_SETTINGS"
_CHILD_DIR = Path(__file__).resolve().parent / "_child"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tests_lightning", "ManifestCheckpoint in Lightning's own tests")
    group.addoption("--tl-swap", action="store_true", help="replace ModelCheckpoint with ManifestCheckpoint")
    group.addoption(
        "--tl-snapshots",
        choices=("default", "off"),
        default="default",
        help="ManifestCheckpoint's step snapshots: its default ('auto'), or off (None)",
    )
    group.addoption("--tl-format-adapt", action="store_true", help="apply the format-only adaptations")
    group.addoption(
        "--tl-adapt-only",
        default=None,
        help="with --tl-format-adapt: only these adaptations (comma-separated names of format_adaptations.ADAPTATIONS)",
    )
    group.addoption(
        "--tl-count-saves",
        action="store_true",
        help="diagnostic, not an adaptation: each persistent ManifestCheckpoint save also calls torch.save once "
        "on rank 0, so tests that count a mocked torch.save count its saves",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    settings = {
        "swap": bool(config.getoption("--tl-swap")),
        "snapshots": config.getoption("--tl-snapshots"),
        "adapt": bool(config.getoption("--tl-format-adapt")),
        "adapt_only": config.getoption("--tl-adapt-only"),
        "count_saves": bool(config.getoption("--tl-count-saves")),
    }
    apply(settings)
    # For processes started from here (ddp_spawn's workers): see the module docstring.
    os.environ[CHILD_ENV] = json.dumps(settings)
    paths = [str(_CHILD_DIR), str(_CHILD_DIR.parent.parent), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)


def apply(settings: dict[str, Any]) -> None:
    """Swap and adapt as ``settings`` say (once per process)."""
    if _STATE["applied"]:
        return
    _STATE["applied"] = True
    if settings["swap"]:
        _swap(settings["snapshots"])
    if settings["adapt"]:
        from tests_lightning import format_adaptations

        only = settings.get("adapt_only")
        names = tuple(n.strip() for n in only.split(",") if n.strip()) if only else None
        _STATE["adaptations"] = format_adaptations.install(swapped=_STATE["swapped"], enabled=names)
    if settings.get("count_saves") and _STATE["swapped"]:
        _count_saves_as_torch_save()
        _STATE["adaptations"] = [*_STATE["adaptations"], "DIAGNOSTIC count-saves"]


def _count_saves_as_torch_save() -> None:
    """Lightning's ModelCheckpoint makes one ``torch.save`` call per checkpoint it writes (rank 0, through
    ``trainer.save_checkpoint``); ManifestCheckpoint writes through ``torch.serialization._save`` and never
    calls it. This makes each persistent save (``_save_checkpoint``; step snapshots are not persistent saves)
    call ``torch.save(None, BytesIO())`` once on rank 0, so a test's count of a mocked ``torch.save``
    compares the *number of checkpoints* saved. It changes what the tests measure: diagnostic only."""
    import io

    import torch

    from lightning_field.checkpoint.committed import CommittedCheckpoint

    original = CommittedCheckpoint._save_checkpoint

    def _save_checkpoint(self: Any, trainer: Any, filepath: str) -> None:
        original(self, trainer, filepath)
        if trainer.is_global_zero:
            torch.save(None, io.BytesIO())

    CommittedCheckpoint._save_checkpoint = _save_checkpoint  # type: ignore[method-assign]


def apply_from_env() -> None:
    """In a child process: the settings the pytest process put in ``TL_CHILD_SETTINGS``."""
    raw = os.environ.get(CHILD_ENV)
    if raw:
        apply(json.loads(raw))


def _swap(snapshots: str) -> None:
    # lightning_field is imported before the names are replaced: it subclasses the original ModelCheckpoint.
    import lightning.pytorch.callbacks as callbacks
    import lightning.pytorch.trainer.connectors.callback_connector as callback_connector

    from lightning_field.checkpoint.manifest_checkpoint import ManifestCheckpoint
    from lightning_field.checkpoint.options import SnapshotConfig

    if snapshots == "off":
        ManifestCheckpoint.__init__.__kwdefaults__["snapshots"] = SnapshotConfig(every_n_train_steps=None)
    callbacks.ModelCheckpoint = ManifestCheckpoint
    callback_connector.ModelCheckpoint = ManifestCheckpoint
    _STATE.update(swapped=True, snapshots=snapshots, cls=ManifestCheckpoint)


@pytest.fixture(autouse=True)
def _tl_attribute_artifacts(request: pytest.FixtureRequest) -> Any:
    """See the module docstring: set up before (so torn down after) the upstream conftest's check."""
    root = Path(str(request.config.rootpath)) / "tests"
    before = set(root.iterdir()) if root.is_dir() else set()
    yield
    if not root.is_dir():
        return
    for path in set(root.iterdir()) - before:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def pytest_report_header(config: pytest.Config) -> list[str]:
    import lightning

    lines = [f"tests_lightning: lightning {lightning.__version__}"]
    if _STATE["swapped"]:
        default = _STATE["cls"].__init__.__kwdefaults__["snapshots"] or "SnapshotConfig()"
        lines.append(f"tests_lightning: ModelCheckpoint -> lightning_field ManifestCheckpoint (snapshots: {default})")
    else:
        lines.append("tests_lightning: no swap (plain ModelCheckpoint)")
    names = ", ".join(a for a in _STATE["adaptations"]) or "none"
    lines.append(f"tests_lightning: format-only adaptations: {names}")
    return lines


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[Any]) -> None:
    """Fail loudly if a collected test module still holds Lightning's own ModelCheckpoint."""
    if not _STATE["swapped"]:
        return
    from lightning.pytorch.callbacks.model_checkpoint import ModelCheckpoint as Original

    stale = sorted(
        name
        for name, module in list(sys.modules.items())
        if name.startswith("tests_pytorch") and getattr(module, "ModelCheckpoint", None) is Original
    )
    if stale:
        raise pytest.UsageError(f"tests_lightning: ModelCheckpoint not swapped in {stale}")
