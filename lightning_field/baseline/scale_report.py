"""The records of a scaling study: the plain-text table ``field scale`` prints, and ``scale.json``,
``scale.md`` and ``scale.png`` in the study's directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lightning_field.baseline.scale_analysis import SECTION_NAMES
from lightning_field.core.fsio import atomic_write_bytes
from lightning_field.evidence.plots import standalone_figure


def render_report(record: dict[str, Any]) -> str:
    """The study as a table, one row per rank count, then the verdict: what ``field scale`` prints."""
    cfg = record["config"]
    lines = [
        f"Scaling study: {cfg['steps']} steps at effective batch {cfg['effective_batch']} "
        f"(warm-up {cfg['warmup_steps']} steps excluded), gradient tolerance {cfg['tolerance']:.0e}",
        f"Workload: {record['workload']['model']['_target_']} on {record['workload']['data']['_target_']}"
        + (
            f"; dropout off in {record['dropout_modules_disabled']} modules"
            if record["dropout_modules_disabled"]
            else ""
        ),
        f"{'ranks':>5} {'batch/rank':>10} {'accum':>5} {'eff.batch':>9} {'samples/s':>10} {'efficiency':>10} "
        f"{'step ms':>8} {'data ms':>8} {'compute':>8} {'comm ms':>8} {'steps->N':>8}  gradient vs 1 rank",
    ]
    for r in record["runs"]:
        b, g = r["breakdown_s"], r["gradient"]
        grad = (
            "reference"
            if g is None
            else (
                f"{'PASS' if g['passed'] else 'FAIL'} max abs {g.get('max_abs', float('nan')):.2e} "
                f"rel {g.get('max_rel', float('nan')):.2e}" + (f" ({g['reason']})" if g.get("reason") else "")
            )
        )
        lines.append(
            f"{r['ranks']:>5} {r['per_rank_batch']:>10} {r['accumulation']:>5} {r['effective_batch']:>9} "
            f"{r['throughput_samples_s']:>10.1f} {r['efficiency']:>10.2f} {1e3 * r['step_time_median_s']:>8.2f} "
            f"{1e3 * b['data_s']:>8.2f} {1e3 * b['compute_s']:>8.2f} {1e3 * b['comm_s']:>8.2f} "
            f"{r['steps_to_target']:>8}  {grad}"
        )
        for s in r["stragglers"]:
            lines.append(f"      straggler: rank {s['rank']} in {SECTION_NAMES[s['section']]}")
    lines.append(
        f"(breakdown: the critical rank, the last to arrive at the all-reduce; steps->N: steps to "
        f"{record['target_samples']} samples)"
    )
    lines.append(f"Verdict: {record['verdict']['message']}")
    return "\n".join(lines)


def write_records(record: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """``scale.json``, ``scale.md`` and ``scale.png`` (throughput and efficiency against rank count)."""
    paths = {"json": out_dir / "scale.json", "md": out_dir / "scale.md", "png": out_dir / "scale.png"}
    atomic_write_bytes(paths["json"], json.dumps(record, indent=2, default=str).encode())
    atomic_write_bytes(paths["md"], ("```\n" + render_report(record) + "\n```\n").encode())
    ranks = [r["ranks"] for r in record["runs"]]
    fig = standalone_figure((9, 4))
    left, right = fig.subplots(1, 2)
    base = record["runs"][0]["throughput_samples_s"]
    left.plot(ranks, [r["throughput_samples_s"] for r in record["runs"]], marker="o", label="measured")
    left.plot(ranks, [n * base for n in ranks], linestyle="--", color="grey", label="linear")
    left.set(xlabel="ranks", ylabel="samples / s", title="throughput")
    left.legend(fontsize=8)
    right.plot(ranks, [r["efficiency"] for r in record["runs"]], marker="o")
    right.axhline(record["config"]["threshold"], linestyle=":", color="grey")
    right.set(xlabel="ranks", ylabel="throughput(N) / (N x throughput(1))", title="scaling efficiency", ylim=(0, 1.1))
    for ax in (left, right):
        ax.set_xticks(ranks)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(paths["png"], dpi=110)
    return paths
