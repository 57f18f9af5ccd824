"""The record's own figures as PNGs: the quality curve, where the time went, and throughput.

Standalone matplotlib Figures (``evidence.plots.standalone_figure``): no global backend is chosen for
the process that builds the record, and matplotlib is imported only when a record is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning_field.evidence.plots import standalone_figure


def plot_quality(
    evals: Sequence[tuple[int, Mapping[str, Any]]], monitor: str, target: float | None, path: Path
) -> Path | None:
    """The monitored metric at every evaluation, with the target; None when nothing was evaluated."""
    points = [(s, float(m[monitor])) for s, m in evals if monitor in m and m[monitor] is not None]
    if not points:
        return None
    fig = standalone_figure((8, 3.6))
    ax = fig.subplots()
    steps, values = zip(*points, strict=True)
    ax.plot(steps, values, marker="o", linewidth=1.2, label=monitor)
    if target is not None:
        ax.axhline(target, color="tab:red", linestyle="--", linewidth=0.9, label=f"target {target:g}")
    ax.set(xlabel="optimizer step", ylabel=monitor, title=f"Quality: {monitor} at each evaluation (measured)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def plot_goodput(buckets: Mapping[str, float], path: Path) -> Path | None:
    """Seconds per goodput bucket (they sum to the elapsed wall time)."""
    if not buckets or sum(buckets.values()) <= 0:
        return None
    fig = standalone_figure((8, 3.2))
    ax = fig.subplots()
    names = list(buckets)
    ax.barh(names, [buckets[n] for n in names], color=["tab:green" if n == "productive" else "tab:gray" for n in names])
    ax.invert_yaxis()
    ax.set(xlabel="seconds", title=f"Where the wall time went ({sum(buckets.values()):.1f} s, every attempt)")
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def plot_throughput(points: Sequence[tuple[int, float, bool]], path: Path) -> Path | None:
    """Samples/s of every report; reports that flagged a straggler in red."""
    if not points:
        return None
    fig = standalone_figure((8, 3.2))
    ax = fig.subplots()
    steps = [p[0] for p in points]
    ax.plot(steps, [p[1] for p in points], marker=".", linewidth=1.0, label="samples/s (all ranks)")
    flagged = [(s, t) for s, t, f in points if f]
    if flagged:
        ax.scatter(*zip(*flagged, strict=True), color="tab:red", zorder=3, label="straggler flagged")
    ax.set(xlabel="optimizer step", ylabel="samples / s", title="Throughput per straggler report (measured)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path
