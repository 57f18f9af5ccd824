"""The bundle's two figures: every run's loss overlaid with the kills marked, and the per-step divergence."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def standalone_figure(size: tuple[float, float]) -> Any:
    """A standalone Figure: no pyplot, so no global backend is chosen for the user's process, and
    matplotlib is imported only when a bundle is written, not with the package."""
    # Imported here, not with the module: matplotlib's import cost is paid only when a figure is drawn.
    from matplotlib.figure import Figure

    return Figure(figsize=size)


def plot_losses(
    series: Mapping[str, Sequence[tuple[int, float]]],
    kills: Mapping[str, tuple[int, int]],
    path: Path,
) -> Path:
    """``series``: run name -> (step, loss); ``kills``: run name -> (kill step, resumed-from step)."""
    fig = standalone_figure((9, 5))
    ax = fig.subplots()
    for name, points in series.items():
        if not points:
            continue
        steps, losses = zip(*points, strict=True)
        style = {"linewidth": 2.2, "alpha": 0.6} if name.startswith("control") else {"linewidth": 1.0}
        (line,) = ax.plot(steps, losses, label=name, **style)
        if name in kills:
            kill_step, resumed_step = kills[name]
            ax.axvline(kill_step, color=line.get_color(), linestyle="--", linewidth=0.8)
            ax.axvline(resumed_step, color=line.get_color(), linestyle=":", linewidth=0.8)
            ax.annotate(
                f"kill @{kill_step}\nresume @{resumed_step}",
                xy=(kill_step, max(losses)),
                fontsize=7,
                color=line.get_color(),
                ha="left",
                va="top",
            )
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss (rank 0)")
    ax.set_title("Loss of every run; dashed: SIGKILL, dotted: the checkpoint resumed from")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def plot_divergence(deltas: Mapping[str, Sequence[tuple[int, float]]], path: Path) -> Path:
    """|Δloss| against control 1 per step; zero (bitwise equal) is drawn on its own baseline."""
    fig = standalone_figure((9, 4))
    ax = fig.subplots()
    nonzero = [d for points in deltas.values() for _, d in points if d > 0]
    floor = min(nonzero) / 10 if nonzero else 1e-12
    for name, points in deltas.items():
        if not points:
            continue
        steps, values = zip(*points, strict=True)
        ax.plot(steps, [v if v > 0 else floor for v in values], marker=".", linewidth=1.0, label=name)
    ax.set_yscale("log")
    ax.axhline(floor, color="grey", linewidth=0.6)
    ax.text(0.01, 0.02, f"baseline {floor:.0e} = bitwise equal", transform=ax.transAxes, fontsize=7, color="grey")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("|loss - control-1 loss|")
    title = "Per-step divergence from control 1" + ("" if nonzero else ": none, every run is bitwise equal")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def loss_series(records: Mapping[Any, Mapping[str, Any]]) -> list[tuple[int, float]]:
    return [(int(r["step"]), float(r["loss"])) for r in records.values() if r.get("loss") is not None]
