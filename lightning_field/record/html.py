"""One self-contained HTML page for the record: decision, ladder, conditions, sign-off, figures, plots.

Self-contained because the page is what gets attached to a release ticket or an artifact store and
opened years later: the plots are embedded as base64 PNGs, the styles are inline, and nothing is
fetched. The page is a rendering of ``record.json``; the JSON is the record.

The markup is a Jinja2 template (``templates/record.html.j2``) rendered with autoescaping, so every
value taken from the record, a source path or a condition name, is text on the page and never markup.
"""

from __future__ import annotations

import base64
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined

from lightning_field.record.document import cited_digest

TEMPLATE = "record.html.j2"


def fmt(value: Any) -> str:
    """A figure's value in one line: numbers to 4 significant digits, mappings as key: value pairs."""
    if isinstance(value, bool) or value is None:
        return {True: "yes", False: "no", None: "n/a"}[value]
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, Mapping):
        return "; ".join(f"{k}: {fmt(v)}" for k, v in value.items() if not isinstance(v, (list, Mapping)) or v)
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt(v) for v in value) or "none"
    return str(value)


@dataclass(frozen=True)
class EmbeddedPlot:
    """One plot as the page shows it: its PNG inline, or None when the file is gone."""

    file: str
    caption: str
    png_base64: str | None


def _embedded_plots(record: Mapping[str, Any], record_dir: Path) -> list[EmbeddedPlot]:
    plots = []
    for plot in record["plots"]:
        path = Path(plot["file"]) if Path(plot["file"]).is_absolute() else record_dir / plot["file"]
        data = base64.b64encode(path.read_bytes()).decode() if path.is_file() else None
        plots.append(EmbeddedPlot(plot["file"], plot["caption"], data))
    return plots


@functools.cache  # built on the first render, not at import
def _environment() -> Environment:
    # StrictUndefined: a field the template names but the record lacks is an error, not an empty cell.
    environment = Environment(
        loader=PackageLoader("lightning_field.record", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters.update(fmt=fmt, cited_digest=cited_digest)
    return environment


def render_html(record: Mapping[str, Any], record_dir: Path, signature_state: Mapping[str, Any]) -> str:
    """``signature_state``: ``valid``, ``problems`` and ``missing`` from ``signing``, shown as they are now."""
    return (
        _environment()
        .get_template(TEMPLATE)
        .render(
            record=record,
            signatures=signature_state,
            plots=_embedded_plots(record, record_dir),
            config_json=json.dumps(record["config"], indent=1),
        )
    )
