"""What the record cites: sources, and the figures read from them, as plain data.

A *source* is one artifact on disk (a manifest, an evidence bundle, a profile, ...) with its path,
digest, date and identity. A *figure* is one number or finding read from a source, and carries
everything a reader needs to judge it without opening anything else: the source's path and digest,
the configuration hash, the code version, the date, the population and denominator it was measured
on, and its limitations. Figures are plain data so the conditions can be re-evaluated from the
record alone (``field record check``), long after the run directories have moved.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_field.core.hashing import file_digest
from lightning_field.record.identity import code_version


def iso(unix: float | None) -> str | None:
    """A Unix time as the record shows dates: ISO 8601 in UTC, to the second."""
    if unix is None:
        return None
    return dt.datetime.fromtimestamp(unix, dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class Source:
    """One artifact the record cites. ``identity``: the comparable identity (``record.identity``)."""

    id: str
    kind: str
    path: Path
    digest: str
    size: int
    date_unix: float | None
    date_basis: str
    identity: dict[str, Any]
    config_projection: dict[str, Any] | None
    limitations: list[str] = field(default_factory=list)
    copied_to: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "path": str(self.path),
            "digest": self.digest,
            "size": self.size,
            "date": iso(self.date_unix),
            "date_unix": self.date_unix,
            "date_basis": self.date_basis,
            "identity": self.identity,
            "config_projection": self.config_projection,
            "code_version": code_version(self.identity),
            "limitations": self.limitations,
            "copied_to": self.copied_to,
        }


@dataclass
class Collection:
    """Everything gathered: the released run, the sources, the figures and what was not found."""

    release: dict[str, Any]
    sources: list[Source] = field(default_factory=list)
    figures: list[dict[str, Any]] = field(default_factory=list)
    not_found: list[str] = field(default_factory=list)
    plots: dict[str, Any] = field(default_factory=dict)

    def add_source(
        self,
        kind: str,
        path: Path,
        date_unix: float | None,
        date_basis: str,
        identity: dict[str, Any],
        projection: dict[str, Any] | None,
        limitations: Sequence[str] = (),
    ) -> Source:
        size, digest = path.stat().st_size, file_digest(path)
        source = Source(
            f"S{len(self.sources) + 1}",
            kind,
            path.resolve(),
            digest,
            size,
            date_unix,
            date_basis,
            identity,
            projection,
            list(limitations),
        )
        self.sources.append(source)
        return source

    def add_figure(
        self,
        source: Source,
        name: str,
        label: str,
        value: Any,
        unit: str | None,
        population: str,
        denominator: str,
        limitations: Sequence[str] = (),
        estimate: bool = False,
        date_unix: float | None = None,
    ) -> dict[str, Any]:
        when = date_unix if date_unix is not None else source.date_unix
        figure = {
            "id": f"{source.id}.{name}",
            "name": name,
            "kind": source.kind,
            "label": label,
            "value": value,
            "unit": unit,
            "estimate": estimate,
            "source": {"id": source.id, "path": str(source.path), "digest": source.digest},
            "config_hash": source.identity.get("config.hash"),
            "code_version": code_version(source.identity),
            "date": iso(when),
            "date_unix": when,
            "population": population,
            "denominator": denominator,
            "limitations": [*source.limitations, *limitations],
        }
        self.figures.append(figure)
        return figure

    def read_json(self, path: Path) -> Any:
        """The file's JSON, or None with the reason listed: unreadable evidence is missing evidence, which
        the conditions then report, rather than a reason to write no record at all."""
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            self.not_found.append(f"{path}: unreadable ({err})")
            return None


def modified(path: Path) -> float:
    """The file's modification time: the date of a source that records none of its own."""
    return path.stat().st_mtime
