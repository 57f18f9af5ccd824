"""Gathering what the other commands wrote into sources and figures (``record.sources``).

``collect`` walks the run directories given to ``field record build``, runs every collector on what
it finds (``collect_run``: what a training run writes; ``collect_reports``: what the other commands
write) and names the released run: the first directory that holds a committed checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning_field.checkpoint.resolver import committed_checkpoints
from lightning_field.core.layout import PLAN_RELPATH
from lightning_field.core.storage import basename
from lightning_field.evidence.bundle_format import EVIDENCE_JSON
from lightning_field.record.collect_reports import collect_evidence, collect_plan, collect_preflight, collect_scale
from lightning_field.record.collect_run import collect_checkpoints, collect_profile, collect_quality
from lightning_field.record.document import RECORD_JSON
from lightning_field.record.identity import code_version
from lightning_field.record.run_identity import run_identity, unknown_identity
from lightning_field.record.sources import Collection

__all__ = ["Collection", "NoSourcesError", "collect", "json_default"]


class NoSourcesError(ValueError):
    """Nothing the record could be built from was found; the message names every place looked in."""


def _under(path: Path, roots: Iterable[Path]) -> bool:
    return any(root == path or root in path.parents for root in roots)


def _found(run_dir: Path, name: str, exclude: Sequence[Path]) -> list[Path]:
    return sorted(p for p in run_dir.rglob(name) if p.is_file() and not _under(p.resolve(), exclude))


def _record_dirs(run_dir: Path) -> list[Path]:
    """Earlier records (and their --copy sources) are outputs, never inputs."""
    return [p.parent.resolve() for p in run_dir.rglob(RECORD_JSON)]


def collect(
    run_dirs: Sequence[Path],
    keys: Sequence[str],
    verify_all: bool = False,
    plan: Path | None = None,
    exclude: Sequence[Path] = (),
) -> Collection:
    """Every source under ``run_dirs``; the first directory holding checkpoints is the released run."""
    missing = [str(d) for d in run_dirs if not d.is_dir()]
    if missing:
        raise NoSourcesError(f"not a directory: {', '.join(missing)}")
    run_dirs = [d.resolve() for d in run_dirs]
    released = next((d for d in run_dirs if any(e.manifest for e in committed_checkpoints(d / "checkpoints"))), None)
    release: dict[str, Any] = {"run_dir": str(released) if released else None}
    if released is not None:
        identity, projection, basis = run_identity(released, keys)
        newest = next(e for e in committed_checkpoints(released / "checkpoints") if e.manifest is not None)
        assert newest.manifest is not None  # the one just chosen for having a manifest
        release.update(
            checkpoint=basename(newest.path),
            step=newest.manifest.step,
            identity=identity,
            config_projection=projection,
            code_version=code_version(identity),
            basis=basis,
        )
    else:
        release.update(
            identity=unknown_identity(None),
            config_projection=None,
            code_version="unknown",
            basis="no run directory holds a committed checkpoint",
        )
    col = Collection(release)
    for run_dir in run_dirs:
        skip = [*exclude, *_record_dirs(run_dir)]
        identity, projection, basis = run_identity(run_dir, keys)
        if (run_dir / "checkpoints").is_dir():
            collect_checkpoints(col, run_dir, keys, verify_all)
        collect_profile(col, run_dir, identity, projection, basis)
        collect_quality(col, run_dir, identity, projection, basis)
        for path in _found(run_dir, EVIDENCE_JSON, skip):
            collect_evidence(col, path, keys)
        for path in _found(run_dir, "preflight.json", skip):
            collect_preflight(col, path, keys)
        for path in _found(run_dir, "scale.json", skip):
            collect_scale(col, path)
        if (run_dir / PLAN_RELPATH).is_file():
            collect_plan(col, run_dir / PLAN_RELPATH)
    if plan is not None:
        if not plan.is_file():
            raise NoSourcesError(f"--plan {plan}: no such file")
        collect_plan(col, plan)
    if not col.sources:
        raise NoSourcesError(
            "no sources found: none of " + ", ".join(map(str, run_dirs)) + " holds checkpoints, an evidence bundle,"
            " a profile, time to quality, an event log, a preflight, a scaling record or a plan"
        )
    return col


def json_default(value: Any) -> Any:
    """Figures are plain data; paths and tuples from the collectors become strings and lists."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, Mapping):
        return dict(value)
    return repr(value)
