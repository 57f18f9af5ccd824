"""Analysing a scaling study: per-rank timings turned into efficiency, the step's breakdown, the
gradient check and the verdict ("add devices", or "fix X first" with the numbers behind it).

Pure functions of the records the ranks wrote (``scale_worker``), so the verdict logic is testable
on synthetic numbers without starting a process.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from lightning_field.baseline.scale_plan import RankPlan
from lightning_field.baseline.scale_worker import rank_file

SECTIONS = ("data", "compute", "comm")
SECTION_NAMES = {"data": "data", "compute": "compute", "comm": "communication"}


def scaling_efficiency(throughput_n: float, ranks: int, throughput_1: float) -> float:
    """throughput(N) / (N x throughput(1)): 1.0 is perfect linear scaling."""
    if throughput_1 <= 0 or ranks < 1:
        raise ValueError(f"need throughput(1) > 0 and ranks >= 1, got {throughput_1} and {ranks}")
    return throughput_n / (ranks * throughput_1)


def compare_gradients(reference: Any, other: Any, tolerance: float) -> dict[str, Any]:
    """Max absolute difference and max relative difference (|Δ| over the reference's largest magnitude,
    so near-zero entries cannot blow it up) between two flattened gradients; passes when the relative
    difference is within ``tolerance``, the allowance for a different reduction order in float32."""
    a, b = torch.as_tensor(reference).double().reshape(-1), torch.as_tensor(other).double().reshape(-1)
    if a.shape != b.shape:
        return {"passed": False, "reason": f"{a.numel()} vs {b.numel()} gradient entries", "tolerance": tolerance}
    max_abs = (a - b).abs().max().item() if a.numel() else 0.0
    scale = a.abs().max().item() if a.numel() else 0.0
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    return {"passed": max_rel <= tolerance, "max_abs": max_abs, "max_rel": max_rel, "tolerance": tolerance}


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def find_stragglers(ranks: list[dict[str, float]], factor: float = 2.0, min_share: float = 0.1) -> list[dict[str, Any]]:
    """Ranks whose data or compute median is ``factor`` times its peers' and costs at least ``min_share``
    of the step: the peers then wait for it at the all-reduce, which shows up as *their* communication."""
    if len(ranks) < 2:
        return []
    step = _median([r["wall_s"] for r in ranks])
    flagged = []
    for section in ("data", "compute"):
        for i, row in enumerate(ranks):
            peers = _median([r[f"{section}_s"] for j, r in enumerate(ranks) if j != i])
            own = row[f"{section}_s"]
            if own > factor * peers and own - peers > min_share * step:
                flagged.append({"rank": int(row["rank"]), "section": section, "own_s": own, "peers_s": peers})
    return sorted(flagged, key=lambda f: f["peers_s"] - f["own_s"])  # largest excess first


def summarize_run(run_dir: Path, plan: RankPlan, warmup_steps: int) -> dict[str, Any]:
    """Per-rank medians, the critical rank's breakdown and the throughput of one rank count's run.

    The critical rank is the one that waits least at the all-reduce (it arrives last): every other
    rank waits for it, so its split of the step is the run's. Throughput counts the samples of all
    ranks over the slowest rank's summed wall time of the steps after the warm-up."""
    records = [json.loads((run_dir / rank_file(r)).read_text()) for r in range(plan.ranks)]
    warmup = min(warmup_steps, max(len(records[0]["steps"]) - 1, 0))
    per_rank = []
    for rec in records:
        timed = [s for s in rec["steps"] if s["step"] >= warmup]
        row: dict[str, Any] = {"rank": rec["rank"], "wall_s": _median([s["wall_s"] for s in timed])}
        for section in SECTIONS:
            row[f"{section}_s"] = _median([s[f"{section}_s"] for s in timed])
        row["timed_wall_s"] = sum(s["wall_s"] for s in timed)
        row["timed_samples"] = sum(s["samples"] for s in timed)
        row["samples_per_step"] = _median([float(s["samples"]) for s in rec["steps"]])
        row["comm_measured"] = all(s.get("comm_measured", False) for s in timed)
        per_rank.append(row)
    critical = min(per_rank, key=lambda r: (r["comm_s"], -r["wall_s"]))
    wall = max(r["timed_wall_s"] for r in per_rank)
    samples = sum(r["timed_samples"] for r in per_rank)
    step_median = max(r["wall_s"] for r in per_rank)
    breakdown = {f"{s}_s": critical[f"{s}_s"] for s in SECTIONS}
    shares = {s: (critical[f"{s}_s"] / critical["wall_s"] if critical["wall_s"] > 0 else 0.0) for s in SECTIONS}
    first = sorted(i for rec in records for i in rec["first_step_indices"])
    return {
        **asdict(plan),
        "effective_batch": plan.effective_batch,
        "measured_samples_per_step": sum(r["samples_per_step"] for r in per_rank),
        "steps_run": len(records[0]["steps"]),
        "timed_steps": len(records[0]["steps"]) - warmup,
        "throughput_samples_s": samples / wall if wall > 0 else 0.0,
        "step_time_median_s": step_median,
        "critical_rank": critical["rank"],
        "breakdown_s": breakdown,
        "shares": shares,
        "per_rank": per_rank,
        "stragglers": find_stragglers(per_rank),
        "first_step_indices": first,
        "dropout_modules_disabled": records[0].get("dropout_modules_disabled", 0),
    }


def steps_to_samples(samples_per_step: float, target_samples: int) -> int:
    """Optimizer steps to consume ``target_samples``: the same at every rank count when the effective batch is."""
    return math.ceil(target_samples / samples_per_step) if samples_per_step > 0 else 0


def verdict(runs: list[dict[str, Any]], threshold: float = 0.7, cpu_count: int | None = None) -> dict[str, Any]:
    """ "add devices" when the largest rank count scales at >= ``threshold``, no rank straggles and the
    gradients match; otherwise "fix X first", X being the failed gradient check, a straggler's section,
    or the section whose share of the step grew most from 1 rank to the largest count."""
    base = next(r for r in runs if r["ranks"] == 1)
    top = max(runs, key=lambda r: r["ranks"])
    n, eff = top["ranks"], top["efficiency"]
    evidence = [f"efficiency at {n} ranks {eff:.2f} (threshold {threshold:.2f})"]
    cpus = cpu_count or os.cpu_count() or 1
    if n > cpus:
        evidence.append(f"{n} ranks share {cpus} CPU cores: compute slows from sharing cores, not from the model")
    failed = [r for r in runs if r.get("gradient") and not r["gradient"]["passed"]]
    if failed:
        g = failed[0]["gradient"]
        measured = f"max rel {g['max_rel']:.2e} > {g['tolerance']:.0e}" if "max_rel" in g else ""
        detail = "; ".join(part for part in (measured, g.get("reason")) if part)
        return {
            "decision": "fix gradients first",
            "bottleneck": "gradient equivalence",
            "straggler_rank": None,
            "message": f"fix gradient equivalence first: at {failed[0]['ranks']} ranks the step-1 gradient differs "
            f"from 1 rank ({detail}); more ranks would train a different model",
            "evidence": evidence,
        }
    earlier: list[dict[str, Any]] = next((r["stragglers"] for r in reversed(runs) if r["stragglers"]), [])
    stragglers: list[dict[str, Any]] = top["stragglers"] or earlier
    if eff >= threshold and not stragglers:
        return {
            "decision": "add devices",
            "bottleneck": None,
            "straggler_rank": None,
            "message": f"add devices: {n} ranks run at {eff:.0%} scaling efficiency with no straggler",
            "evidence": evidence,
        }
    if stragglers:
        s = stragglers[0]
        section = SECTION_NAMES[s["section"]]
        evidence.append(
            f"rank {s['rank']} spends {1e3 * s['own_s']:.1f} ms per step in {section} vs {1e3 * s['peers_s']:.1f} ms "
            "for its peers, who wait for it at the all-reduce"
        )
        return {
            "decision": f"fix {section} first",
            "bottleneck": section,
            "straggler_rank": s["rank"],
            "message": f"fix {section} first: rank {s['rank']} is a straggler in {section}; " + "; ".join(evidence),
            "evidence": evidence,
        }
    growth = {s: top["shares"][s] - base["shares"][s] for s in SECTIONS}
    grown = max(SECTIONS, key=lambda s: growth[s])
    if growth[grown] <= 0:
        grown = max(SECTIONS, key=lambda s: top["shares"][s])
    section = SECTION_NAMES[grown]
    evidence.append(
        f"{section} share of the step {base['shares'][grown]:.0%} at 1 rank -> {top['shares'][grown]:.0%} at {n} "
        f"({1e3 * base['breakdown_s'][grown + '_s']:.1f} -> {1e3 * top['breakdown_s'][grown + '_s']:.1f} ms)"
    )
    return {
        "decision": f"fix {section} first",
        "bottleneck": section,
        "straggler_rank": None,
        "message": f"fix {section} first: " + "; ".join(evidence),
        "evidence": evidence,
    }
