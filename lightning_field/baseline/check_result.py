"""The verdict every baseline data check returns, and the plain table ``field preflight`` prints of them.

A module of its own because each kind of check (``batch_checks``, ``label_checks``, ``loader_checks``)
returns it and ``preflight`` reads it back from a report: none of them should import another to get it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Severity = Literal["error", "warning", "info"]


@dataclass
class CheckResult:
    """One check's verdict.

    ``passed`` is False only for faults that break training (severity "error"); a "warning" passes
    but says what looks wrong (class imbalance, samples dropped each epoch); "info" reports a fact.
    ``split`` is "train", "val" or "train+val"; ``data`` holds the numbers behind ``detail`` for a
    record (counts, shapes, the first location).
    """

    name: str
    passed: bool
    detail: str
    hint: str | None = None
    severity: Severity = "info"
    split: str = "train"
    data: dict[str, Any] = field(default_factory=dict)


def format_results(results: Sequence[CheckResult]) -> str:
    """A plain pass/fail table, one line per check with its hint indented below it when there is one."""
    lines = []
    for r in results:
        verdict = "FAIL" if not r.passed else ("WARN" if r.severity == "warning" else "ok")
        lines.append(f"{verdict:<4}  {r.split:<9}  {r.name:<14}  {r.detail}")
        if r.hint and (not r.passed or r.severity == "warning"):
            lines.append(f"{'':<31}try: {r.hint}")
    return "\n".join(lines)
