"""Building the record: collect, evaluate, decide, plot, and publish ``record.json`` and ``record.html``.

``record.json`` is written last, like a manifest: its presence says the record is complete. Its
format and file names are ``record.document``'s, shared with the readers.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning_field._version import __version__
from lightning_field.core.fsio import atomic_write_bytes
from lightning_field.core.hashing import file_digest
from lightning_field.record.collect import collect, json_default
from lightning_field.record.conditions import decide, evaluate_conditions
from lightning_field.record.config import RecordConfig
from lightning_field.record.document import FORMAT, RECORD_HTML, RECORD_JSON
from lightning_field.record.html import render_html
from lightning_field.record.ladder import exposure
from lightning_field.record.plots import plot_goodput, plot_quality, plot_throughput
from lightning_field.record.signing import (
    CONTENT_SHA256,
    SIGNATURES,
    content_sha256,
    missing_signoffs,
    verify_signatures,
)
from lightning_field.record.sources import Collection

LIMITATIONS = [
    "Signatures are accountability, not cryptographic identity: a signature is a typed name over the SHA-256 of"
    " the record's content.",
    "`field record check` re-evaluates the conditions from the record's figures at the time of the check and"
    " re-hashes every source it can still reach.",
    "Staleness compares the configuration over the configured sections only (record.identity.config_keys).",
]


def _finite(value: Any) -> Any:
    """NaN and infinities become None: the canonical JSON that signatures cover has no NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def plan_vs_measured(figures: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The plan's estimates beside the measured figure of the same quantity, where both exist."""
    plan = next((f for f in figures if f["name"] == "plan"), None)
    if plan is None:
        return []
    planned = plan["value"]
    measured = {f["name"]: f["value"] for f in figures if f["kind"] != "plan"}
    ttq = measured.get("time_to_quality") or {}
    so_far = measured.get("cost_so_far") or {}
    inputs = planned
    rows = [
        (
            "blocking checkpoint save",
            (inputs.get("save_seconds") or {}).get("value"),
            measured.get("median_save_seconds"),
            "s",
        ),
        (
            "restart (kill to first new step)",
            (inputs.get("restart_seconds") or {}).get("value"),
            measured.get("recovery_seconds"),
            "s",
        ),
        (
            "wall time (plan: to the token budget; measured: to the quality target)",
            (inputs.get("time_to_budget") or inputs.get("ideal_time") or {}).get("value"),
            ttq.get("wall_s"),
            "s",
        ),
        (
            "device-hours",
            (inputs.get("device_hours") or {}).get("value"),
            ttq.get("device_hours") or so_far.get("device_hours"),
            "device-h",
        ),
        ("cost", (inputs.get("cost") or {}).get("value"), ttq.get("cost") or so_far.get("cost"), "currency"),
    ]
    return [
        {"quantity": q, "planned": p, "measured": m, "unit": u} for q, p, m, u in rows if p is not None or m is not None
    ]


def _plots(col: Collection, out: Path) -> list[dict[str, Any]]:
    made: list[tuple[Path | None, str]] = []
    monitor, target = col.plots.get("target", (None, None))
    if monitor and col.plots.get("quality_events"):
        made.append(
            (
                plot_quality(col.plots["quality_events"], monitor, target, out / "quality.png"),
                f"{monitor} at each evaluation and the target (from the event log)",
            )
        )
    if col.plots.get("goodput"):
        made.append(
            (
                plot_goodput(col.plots["goodput"], out / "goodput.png"),
                "goodput ledger: where the wall time went (from the event log)",
            )
        )
    if col.plots.get("throughput"):
        made.append(
            (
                plot_throughput(col.plots["throughput"], out / "throughput.png"),
                "throughput per straggler report (field/profile/reports.jsonl)",
            )
        )
    entries = [
        {"file": path.name, "digest": file_digest(path), "caption": caption}
        for path, caption in made
        if path is not None
    ]
    # The evidence bundle's own plots are linked by path and hash, like the rest of its files.
    for png in col.plots.get("evidence", []):
        entries.append({"file": png, "digest": file_digest(png), "caption": f"resume evidence: {Path(png).name}"})
    return entries


def _copy_sources(col: Collection, out: Path) -> None:
    target = out / "sources"
    target.mkdir(parents=True, exist_ok=True)
    for source in col.sources:
        name = f"{source.id}-{source.path.name}"
        shutil.copy2(source.path, target / name)
        source.copied_to = f"sources/{name}"


def signature_state(record: Mapping[str, Any]) -> dict[str, Any]:
    valid, problems = verify_signatures(record)
    return {"valid": valid, "problems": problems, "missing": missing_signoffs(record["signoff"]["bundles"], valid)}


def write_html(record: Mapping[str, Any], out: Path) -> Path:
    path = out / RECORD_HTML
    atomic_write_bytes(path, render_html(record, out, signature_state(record)).encode())
    return path


def write_json(record: Mapping[str, Any], out: Path) -> Path:
    path = out / RECORD_JSON
    atomic_write_bytes(path, json.dumps(record, indent=2, default=json_default, allow_nan=False).encode())
    return path


def build_record(
    run_dirs: Sequence[Path],
    out: Path,
    config: RecordConfig,
    now: float,
    copy: bool = False,
    plan: Path | None = None,
) -> dict[str, Any]:
    """Collect every source under ``run_dirs`` and write the record into ``out``; returns the record."""
    out = out.resolve()
    col = collect(run_dirs, config.config_keys, config.verify_checkpoints == "all", plan, exclude=[out])
    out.mkdir(parents=True, exist_ok=True)
    for stale in (RECORD_JSON, RECORD_HTML):  # a rebuild must not leave a complete-looking old record behind
        (out / stale).unlink(missing_ok=True)
    if copy:
        _copy_sources(col, out)
    sources = [_finite(s.to_dict()) for s in col.sources]
    figures = [_finite(f) for f in col.figures]
    release = _finite(col.release)
    by_id = {s["id"]: s for s in sources}
    results = evaluate_conditions(config.conditions, figures, by_id, release, now, config.roles_for)
    # Signatures come after the build: an enforced sign-off is missing until then, and holds.
    bundles = [{"name": b.name, "roles": b.roles, "conditions": b.conditions} for b in config.bundles]
    unsigned = missing_signoffs(bundles, []) if config.enforce_signoff else []
    record: dict[str, Any] = {
        "format": FORMAT,
        "created": dt.datetime.fromtimestamp(now, dt.timezone.utc).isoformat(timespec="seconds"),
        "created_unix": now,
        "tool_version": __version__,
        "run_dirs": [str(d.resolve()) for d in run_dirs],
        "release": release,
        "decision": decide(results, unsigned),
        "exposure": exposure(config.ladder, results),
        "conditions": results,
        "signoff": {
            "roles": list(config.roles),
            "bundles": bundles,
            "enforce": config.enforce_signoff,
        },
        "figures": figures,
        "plan_vs_measured": _finite(plan_vs_measured(figures)),
        "sources": sources,
        "not_found": list(col.not_found),
        "plots": _plots(col, out),
        "config": _finite(config.raw),
        "limitations": [
            *LIMITATIONS,
            "Sources are copied into sources/ (--copy)."
            if copy
            else "Sources are linked by path and SHA-256, not"
            " copied: moving or changing them shows in `field record check` (use --copy to keep them).",
        ],
        SIGNATURES: [],
    }
    record = json.loads(json.dumps(record, default=json_default))  # plain JSON types, as a reader will see them
    record[CONTENT_SHA256] = content_sha256(record)
    write_html(record, out)
    write_json(record, out)
    return record
