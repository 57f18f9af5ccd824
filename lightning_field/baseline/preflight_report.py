"""The records of ``field preflight``: the plain-text report it prints, and ``preflight.json``,
``preflight.md`` and ``baseline.png`` in the run's directory.

Apart from ``preflight`` (which measures) because the report is plain data by then: rendering it
needs neither a model nor a Trainer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lightning_field.baseline.check_result import CheckResult, format_results
from lightning_field.core.fsio import atomic_write_bytes
from lightning_field.evidence.plots import standalone_figure


def _mb(n: int | None) -> str:
    if n is None:
        return "n/a"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def render_report(report: dict[str, Any]) -> str:
    """The report as the plain text ``field preflight`` prints: data checks, overfit, baseline, fit, verdict."""
    o, b, f = report["overfit"], report["baseline"], report["fit"]
    data = [CheckResult(**d) for d in report["data_checks"]]
    lines = ["Data and labels:", format_results(data), "", "Tiny overfit:"]
    lines.append(f"  {'ok  ' if o['passed'] else 'FAIL'} {o['detail']}")
    if o.get("hint"):
        lines.append(f"       try: {o['hint']}")
    lines.append("")
    if "error" in b:
        lines.append(f"Baseline: FAIL, training {b['error']}")
    else:
        tokens = f", {b['tokens_per_s']:.0f} tokens/s" if b["tokens_per_s"] else ""
        lines += [
            f"Baseline ({b['device']}, {b['steps_measured']} steps after {b['warmup_steps']} warm-up):",
            f"  step time median {1e3 * b['step_s_median']:.1f} ms, p90 {1e3 * b['step_s_p90']:.1f} ms;"
            f" {b['samples_per_s']:.1f} samples/s{tokens}",
            f"  peak memory {_mb(b['peak_memory_bytes'])} ({b['peak_memory_source']})",
        ]
        if b.get("breakdown_s"):
            split = ", ".join(f"{name} {1e3 * sec:.1f} ms" for name, sec in b["breakdown_s"].items())
            lines.append(f"  median split: {split} ({b['breakdown_source']})")
    if f is not None:
        lines += [
            "",
            "Fit (measured from the real model and optimizer):",
            f"  {'ok  ' if f['fits'] is not False else 'FAIL'} state {_mb(f['state_bytes'])} = params"
            f" {_mb(f['params_bytes'])} + grads {_mb(f['grads_bytes'])} + optimizer {_mb(f['optimizer_bytes'])};"
            f" device {_mb(f['device_memory_bytes'])} ({f['device_memory_source']}),"
            f" allowed share {f['state_fraction']:g}",
        ]
    lines += ["", "PREFLIGHT PASSED" if report["passed"] else f"PREFLIGHT FAILED: {', '.join(report['failed'])}"]
    return "\n".join(lines)


def write_report(report: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """``preflight.json``, ``preflight.md`` and ``baseline.png`` (step time and loss per step)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "preflight.json", "md": out_dir / "preflight.md", "png": out_dir / "baseline.png"}
    atomic_write_bytes(paths["json"], json.dumps(report, indent=2, default=str).encode())
    atomic_write_bytes(paths["md"], ("```\n" + render_report(report) + "\n```\n").encode())
    fig = standalone_figure((9, 4))
    left, right = fig.subplots(1, 2)
    times = report["baseline"].get("step_seconds", [])
    if times:
        left.plot([s for s, _ in times], [1e3 * t for _, t in times], marker=".")
    left.set(xlabel="step", ylabel="step time (ms)", title="baseline step time")
    losses = [(s, v) for s, v in report["baseline"].get("loss", []) if v is not None]
    if losses:
        right.plot([s for s, _ in losses], [v for _, v in losses], marker=".")
    right.set(xlabel="step", ylabel="loss", title="baseline loss")
    fig.tight_layout()
    fig.savefig(paths["png"])
    return paths
