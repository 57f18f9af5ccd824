"""``evidence.md``: an evidence bundle's record, rendered for a reader.

The layout lives in ``templates/evidence.md.j2`` (Jinja2), so changing what the page shows is an
edit of the page, not of string-building code; this module only loads the template and supplies
the few value formats the page needs (seconds, a number to a format spec, a path's file name).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

import jinja2

from lightning_field.evidence.bundle_format import DIVERGENCE_PLOT, LOSS_PLOT

__all__ = ["RECOVERY_PHASES", "render_markdown"]

RECOVERY_PHASES = {
    "restart_gap": "kill to relaunch (the harness restarts at once; a scheduler adds its queueing time)",
    "process_start": "interpreter start and imports",
    "setup_and_restore": "model, data and trainer construction, checkpoint verification and load",
    "data_fast_forward": "restoring the loader position up to the first new batch",
}
"""What each phase of ``recovery[].phases_s`` measures."""

TEMPLATE = "evidence.md.j2"


def _seconds(value: Any) -> str:
    return f"{value:.2f} s" if isinstance(value, (int, float)) else "n/a"


@functools.cache  # built on the first render, not at import
def _environment() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("lightning_field.evidence", "templates"),
        # Escaping is HTML's: in Markdown it would print a config repr's quotes or a detail's "->" and
        # "&" as entities. The values are the bundle's own text, shown as written; off for .md (and .j2).
        autoescape=jinja2.select_autoescape(enabled_extensions=("html", "htm", "xml"), default=False),
        undefined=jinja2.StrictUndefined,  # a key the record lacks fails the render, as it did by KeyError
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    environment.filters.update(
        seconds=_seconds,
        spec=format,
        filename=lambda path: PurePath(path).name,
        stem=lambda path: PurePath(path).stem,
    )
    return environment


def render_markdown(ev: Mapping[str, Any]) -> str:
    """``evidence.md`` for the evidence record ``ev`` (``build_evidence``'s first result)."""
    return (
        _environment()
        .get_template(TEMPLATE)
        .render(ev=ev, recovery_phases=RECOVERY_PHASES, loss_plot=LOSS_PLOT, divergence_plot=DIVERGENCE_PLOT)
    )
