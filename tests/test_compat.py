"""The Lightning range this library reaches into is declared once and enforced: pip installs only a
tested release, and an untested one is refused at import, with the fix, instead of resuming wrongly."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import lightning
import pytest

from lightning_field.compat.lightning import TESTED_LIGHTNING, unsupported_lightning
from lightning_field.compat.lightning_checkpoint import MODEL_CHECKPOINT_MEMBERS, PrivateMember

REPO = Path(__file__).resolve().parent.parent


def test_pyproject_pins_the_tested_lightning_range_and_the_installed_release_is_in_it() -> None:
    pins = re.findall(r'^\s*"lightning([<>=!~][^"]*)"', (REPO / "pyproject.toml").read_text(), re.M)
    assert pins == [TESTED_LIGHTNING]
    assert unsupported_lightning(lightning.__version__) is None, unsupported_lightning(lightning.__version__)


@pytest.mark.slow
def test_an_untested_lightning_is_refused_when_the_callback_is_imported_with_the_fix() -> None:
    assert unsupported_lightning("2.5.6") is not None and unsupported_lightning("2.7.0rc1") is not None
    code = "import lightning.pytorch as pl; pl.__version__ = '2.7.0'; from lightning_field import ManifestCheckpoint"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert f"ImportError: lightning_field is tested with Lightning {TESTED_LIGHTNING}" in result.stderr
    assert "Lightning 2.7.0 is installed. Install a tested release (pip install 'lightning>=2.6,<2.7')" in (
        result.stderr
    )


PACKAGE = REPO / "lightning_field"
EXTERNAL = ("lightning", "torch", "torchdata", "torchmetrics", "wandb", "hydra", "omegaconf", "fsspec", "blake3")
# Spelled with a leading underscore but documented as public API, or a type annotation only.
ALLOWED = {"os._exit", "argparse._SubParsersAction"}


def _private_names_wrapped_by_compat(package: Path = PACKAGE) -> set[str]:
    names = set()
    for path in (package / "compat").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                names.add(node.attr)
    return names


def private_accesses_outside_compat(package: Path = PACKAGE) -> list[str]:
    """``path:line: what`` for every private name of another package used outside ``package/compat/``."""
    wrapped = _private_names_wrapped_by_compat(package)
    problems = []
    for path in sorted(package.rglob("*.py")):
        if "compat" in path.relative_to(package).parts:
            continue
        tree = ast.parse(path.read_text())
        imported = {alias.asname or alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}  # fmt: skip
        for node in ast.walk(tree):
            where = f"{path.relative_to(package.parent)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in EXTERNAL:
                problems += [f"{where}: imports {a.name}" for a in node.names if a.name.startswith("_")]
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
                continue
            base = node.value.id if isinstance(node.value, ast.Name) else None
            if f"{base}.{node.attr}" in ALLOWED or base in ("self", "cls"):
                continue
            if base in imported or node.attr in wrapped:
                problems.append(f"{where}: {ast.unparse(node)}")
    return problems


def test_no_module_outside_compat_touches_a_private_name_of_another_package() -> None:
    wrapped = _private_names_wrapped_by_compat()
    assert {"_checkpoint_connector", "_sampler_list", "_wandb_init", "_spec", "_version"} <= wrapped
    problems = private_accesses_outside_compat()
    assert not problems, "private names of other packages outside lightning_field/compat/:\n" + "\n".join(problems)


def test_the_scan_finds_a_private_access_planted_outside_compat(tmp_path: Path) -> None:
    package = tmp_path / "lightning_field"
    shutil.copytree(PACKAGE / "compat", package / "compat")
    (package / "clean.py").write_text("import torch\n\ndef size(t):\n    return t.numel()\n")
    assert private_accesses_outside_compat(package) == []
    (package / "planted.py").write_text(
        "import torch\nfrom lightning.pytorch.loops.loop import _Loop\n\n"
        "def peek(trainer, t):\n    return trainer._checkpoint_connector, torch._C, t._version\n"
    )
    assert private_accesses_outside_compat(package) == [
        "lightning_field/planted.py:2: imports _Loop",
        "lightning_field/planted.py:5: trainer._checkpoint_connector",
        "lightning_field/planted.py:5: torch._C",
        "lightning_field/planted.py:5: t._version",
    ]


LAZY_PACKAGES = sorted(
    str(init.parent.relative_to(REPO)).replace("/", ".")
    for init in PACKAGE.rglob("__init__.py")
    if "_EXPORTS" in init.read_text()
)


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_a_lazy_package_lists_each_public_name_once_and_every_one_resolves(package: str) -> None:
    """A package that imports lazily: its name table, ``__all__`` and the type checker's imports must agree."""
    module = importlib.import_module(package)
    tree = ast.parse(Path(module.__file__ or "").read_text())
    guarded = [node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"]
    typed = {alias.asname or alias.name for block in guarded for node in ast.walk(block)
             if isinstance(node, ast.ImportFrom) for alias in node.names}  # fmt: skip
    exported = set(module._EXPORTS)
    assert typed == exported and exported <= set(module.__all__)
    for name in module.__all__:
        getattr(module, name)
    for name in sorted(exported):
        value = getattr(module, name)
        assert getattr(value, "__name__", name) == name, f"{package}.{name} resolves to {value!r}"
    with pytest.raises(AttributeError, match=f"module '{package}' has no attribute 'not_exported'"):
        module.not_exported  # noqa: B018


def test_a_lazy_name_that_is_also_a_submodule_is_refused_at_import(tmp_path: Path) -> None:
    from lightning_field.core.lazy import lazy_exports

    (tmp_path / "forecast.py").write_text("def forecast(): ...\n")
    with pytest.raises(ValueError, match=r"pkg: exported names \['forecast'\] are also submodules"):
        lazy_exports("pkg", {"forecast": "pkg.forecast"}, {"__path__": [str(tmp_path)]})


def test_every_subpackage_of_the_root_imports_lazily() -> None:
    assert "lightning_field" in LAZY_PACKAGES and len(LAZY_PACKAGES) >= 9, LAZY_PACKAGES


# ------------------------------------------------------------------ ModelCheckpoint's private members
def _model_checkpoint_members() -> set[str]:
    from lightning.pytorch.callbacks import ModelCheckpoint

    return {name for name in {*dir(ModelCheckpoint), *vars(ModelCheckpoint())}
            if name.startswith("_") and not name.endswith("__")}  # fmt: skip


def private_model_checkpoint_uses(sources: list[str], members: set[str]) -> set[str]:
    """The private ``ModelCheckpoint`` members that ``sources`` (class bodies) define, or reach through
    ``self``, ``super()`` or a variable named ``callback``."""
    used = set()
    for source in sources:
        for node in ast.walk(ast.parse(textwrap.dedent(source))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in members:
                used.add(node.name)
            elif isinstance(node, ast.Attribute) and node.attr in members:
                base = node.value
                via_super = isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super"
                if via_super or (isinstance(base, ast.Name) and base.id in ("self", "callback")):
                    used.add(node.attr)
    return used


def _callback_sources() -> list[str]:
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lightning_field.checkpoint.manifest_checkpoint import ManifestCheckpoint

    ours = [cls for cls in ManifestCheckpoint.__mro__ if issubclass(cls, ModelCheckpoint)
            and cls.__module__.startswith("lightning_field")]  # fmt: skip
    return [inspect.getsource(cls) for cls in ours] + [(PACKAGE / "compat" / "lightning.py").read_text()]


@pytest.mark.parametrize("member", MODEL_CHECKPOINT_MEMBERS, ids=lambda member: member.name)
def test_each_private_model_checkpoint_member_the_callback_uses_exists_in_the_installed_lightning(
    member: PrivateMember,
) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    declared = inspect.getattr_static(ModelCheckpoint, member.name, None)
    if member.parameters is None:  # an attribute __init__ sets (or a class attribute)
        assert declared is not None or member.name in vars(ModelCheckpoint()), (
            f"Lightning {lightning.__version__}'s ModelCheckpoint has no attribute {member.name}: {member.works_around}"
        )
        return
    assert callable(declared), f"Lightning {lightning.__version__}'s ModelCheckpoint has no method {member.name}"
    assert tuple(inspect.signature(declared).parameters) == member.parameters, (
        f"ModelCheckpoint.{member.name}{inspect.signature(declared)} changed; the callback relies on"
        f" {member.parameters}: {member.works_around}"
    )


def test_the_callback_uses_exactly_the_private_model_checkpoint_members_compat_lists() -> None:
    used = private_model_checkpoint_uses(_callback_sources(), _model_checkpoint_members())
    listed = {member.name for member in MODEL_CHECKPOINT_MEMBERS}
    assert used - listed == set(), "list these in lightning_field/compat/lightning_checkpoint.py, with why"
    assert listed - used == set(), "listed in compat/lightning_checkpoint.py but no longer used"


def test_the_member_scan_finds_an_unlisted_private_member_planted_in_a_callback() -> None:
    planted = '''
    class Planted(ManifestCheckpoint):
        def _save_topk_checkpoint(self, trainer, monitor_candidates):
            return super()._update_best_and_save(None, trainer, monitor_candidates)

        def hook(self, trainer):
            return self._last_global_step_saved, self.public_name
    '''
    members = _model_checkpoint_members()
    assert private_model_checkpoint_uses([planted], members) == {
        "_save_topk_checkpoint", "_update_best_and_save", "_last_global_step_saved"
    }
