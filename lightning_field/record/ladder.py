"""The exposure ladder: the highest level the evidence supports, and what the next one lacks.

The method approves only the next exposure level the evidence supports. Levels are cumulative: a
level is supported when every critical condition passes and every condition it, and each level
below it, requires passes too. So a missing multi-rank resume test stops the ladder at one device
however good the forecast to the deadline looks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def exposure(levels: Sequence[Any], results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``levels``: ``LadderLevel``s, lowest first; ``results``: evaluated conditions."""
    by_name = {r["name"]: r for r in results}
    critical = [r for r in results if r["severity"] == "critical" and not r["passed"]]
    rows: list[dict[str, Any]] = []
    supported: str | None = None
    blocked = bool(critical)
    for level in levels:
        lacking = [
            {"name": name, "status": by_name[name]["status"], "detail": by_name[name]["detail"]}
            for name in level.requires
            if not by_name[name]["passed"]
        ]
        if critical:
            lacking = [{"name": r["name"], "status": r["status"], "detail": r["detail"]} for r in critical] + lacking
        ok = not blocked and not lacking
        rows.append(
            {
                "level": level.name,
                "description": level.description,
                "requires": list(level.requires),
                "supported": ok,
                "lacking": lacking,
            }
        )
        if ok:
            supported = level.name
        else:
            blocked = True  # cumulative: nothing above an unsupported level is supported
    index = next((i for i, r in enumerate(rows) if not r["supported"]), None)
    following = rows[index] if index is not None else None
    if supported is None:
        why = (
            "no level: critical condition(s) " + ", ".join(r["name"] for r in critical) + " not met"
            if critical
            else f"no level: {rows[0]['level']} lacks " + ", ".join(x["name"] for x in rows[0]["lacking"])
            if rows
            else "no ladder configured"
        )
    else:
        level_row = next(r for r in rows if r["level"] == supported)
        met = [name for r in rows[: rows.index(level_row) + 1] for name in r["requires"]]
        why = f"{supported}: every critical condition passes" + (f", and {', '.join(met)}" if met else "")
    return {
        "supported": supported,
        "why": why,
        "next": following["level"] if following else None,
        "next_lacks": following["lacking"] if following else [],
        "levels": rows,
    }
