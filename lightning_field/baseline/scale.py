"""``field scale``: the same model at 1, 2 and N ranks under a constant effective batch, measured, not assumed.

The method adds devices only once the exposed bottleneck is understood. This module plans the
study (per-rank batch and gradient accumulation so that every rank count optimises the same
effective batch), runs one child process group per rank count (``scale_worker``: Lightning's DDP
launcher, gloo on CPU), and turns the per-rank timings into:

* throughput and scaling efficiency, throughput(N) / (N x throughput(1));
* the step time of the critical rank split into data wait, compute and exposed communication;
* gradient equivalence of the first step against the 1-rank run (the same samples, so only the
  reduction order may differ);
* steps to a fixed number of samples;
* a verdict: "add devices", or "fix X first" with the numbers behind it.

The planning and analysis functions are pure so that the verdict logic is testable without processes.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lightning_field.baseline.scale_worker import GRADIENT_FILE, ScaleRunSpec, rank_file

ACCELERATORS = ("cpu", "gpu")
RANKS_PER_CPU = 2  # the most processes per CPU core a study may start: beyond, it measures the scheduler
SECTIONS = ("data", "compute", "comm")
SECTION_NAMES = {"data": "data", "compute": "compute", "comm": "communication"}


class ScaleInputError(ValueError):
    """The study cannot be run as asked; the message names the numbers. Raised before any process starts."""


class ScaleRunError(RuntimeError):
    """A rank count's run failed; the message ends with the last lines of its log (the cause)."""


@dataclass(frozen=True)
class RankPlan:
    """How one rank count reaches the effective batch: ``ranks x per_rank_batch x accumulation``."""

    ranks: int
    per_rank_batch: int
    accumulation: int

    @property
    def effective_batch(self) -> int:
        return self.ranks * self.per_rank_batch * self.accumulation


def parse_ranks(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``; refuses anything that is not a positive integer."""
    counts = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise ScaleInputError(f"--ranks: {part!r} is not a positive integer (expected e.g. 1,2,4)")
        counts.append(int(part))
    return sorted(set(counts))


def max_ranks(cpu_count: int | None = None) -> int:
    """The largest rank count this machine may run: ``RANKS_PER_CPU`` processes per CPU core."""
    return RANKS_PER_CPU * (cpu_count or os.cpu_count() or 1)


def plan_batches(effective_batch: int, ranks: int, max_rank_batch: int | None = None) -> RankPlan:
    """Per-rank batch ``effective_batch / ranks``; when that exceeds ``max_rank_batch`` (what one rank's
    memory holds), the smallest gradient accumulation that divides it evenly. Refuses uneven splits,
    because an effective batch that differs between rank counts makes the comparison meaningless."""
    if effective_batch % ranks:
        raise ScaleInputError(
            f"--effective-batch {effective_batch} is not divisible by {ranks} ranks "
            f"({effective_batch} / {ranks} = {effective_batch / ranks:g}): the effective batch could not stay constant"
        )
    per_rank = effective_batch // ranks
    if max_rank_batch is None or per_rank <= max_rank_batch:
        return RankPlan(ranks, per_rank, 1)
    for accumulation in range(2, per_rank + 1):
        if per_rank % accumulation == 0 and per_rank // accumulation <= max_rank_batch:
            return RankPlan(ranks, per_rank // accumulation, accumulation)
    raise ScaleInputError(f"no accumulation splits {per_rank} samples per rank into batches <= {max_rank_batch}")


def plan_study(
    ranks: list[int],
    steps: int,
    effective_batch: int,
    max_rank_batch: int | None = None,
    cpu_count: int | None = None,
    warmup_steps: int = 2,
) -> list[RankPlan]:
    """Validate every input and plan every rank count, so that a bad study fails before any process starts."""
    if steps <= 0:
        raise ScaleInputError(f"--steps {steps}: the step budget must be >= 1 (zero steps measure nothing)")
    if warmup_steps < 0:
        raise ScaleInputError(f"--warmup {warmup_steps} must be >= 0")
    if effective_batch <= 0:
        raise ScaleInputError(f"--effective-batch {effective_batch} must be >= 1")
    if max_rank_batch is not None and max_rank_batch <= 0:
        raise ScaleInputError(f"--max-rank-batch {max_rank_batch} must be >= 1")
    if not ranks or any(n < 1 for n in ranks):
        raise ScaleInputError(f"--ranks {ranks}: rank counts must be positive integers")
    if 1 not in ranks or len(ranks) < 2:
        raise ScaleInputError(
            f"--ranks {','.join(map(str, ranks))}: needs 1 and at least one more count "
            "(efficiency is throughput(N) / (N x throughput(1)))"
        )
    limit = max_ranks(cpu_count)
    too_many = [n for n in ranks if n > limit]
    if too_many:
        cpus = cpu_count or os.cpu_count() or 1
        raise ScaleInputError(
            f"--ranks {max(too_many)} exceeds what this machine can run: at most {RANKS_PER_CPU} ranks per CPU core, "
            f"{cpus} cores -> {limit} ranks"
        )
    return [plan_batches(effective_batch, n, max_rank_batch) for n in ranks]


# ---------------------------------------------------------------------------------------------- analysis
def scaling_efficiency(throughput_n: float, ranks: int, throughput_1: float) -> float:
    """throughput(N) / (N x throughput(1)): 1.0 is perfect linear scaling."""
    if throughput_1 <= 0 or ranks < 1:
        raise ValueError(f"need throughput(1) > 0 and ranks >= 1, got {throughput_1} and {ranks}")
    return throughput_n / (ranks * throughput_1)


def compare_gradients(reference: Any, other: Any, tolerance: float) -> dict[str, Any]:
    """Max absolute difference and max relative difference (|Δ| over the reference's largest magnitude,
    so near-zero entries cannot blow it up) between two flattened gradients; passes when the relative
    difference is within ``tolerance``, the allowance for a different reduction order in float32."""
    import torch

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
    stragglers = top["stragglers"] or next((r["stragglers"] for r in reversed(runs) if r["stragglers"]), [])
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


# ---------------------------------------------------------------------------------------------- running
@dataclass
class StudyConfig:
    """Mirrored by ``conf/lightning_field/scale/default.yaml`` (the workload by the ``model``/``data`` groups)."""

    ranks: list[int]
    steps: int
    effective_batch: int
    out_dir: Path
    max_rank_batch: int | None = None
    warmup_steps: int = 2
    tolerance: float = 1e-5
    threshold: float = 0.7
    stall_rank: int | None = None
    stall_s: float = 0.05  # per batch, only with stall_rank
    seed: int = 0
    timeout_s: float = 300.0
    accelerator: str = "cpu"
    disable_dropout: bool = True
    model: dict[str, Any] | None = None  # resolved ``_target_`` configs; None: the built-in workload
    data: dict[str, Any] | None = None


def builtin_workload() -> tuple[dict[str, Any], dict[str, Any]]:
    """The model and data ``field scale`` studies when none is named, read from the shipped configs."""
    from omegaconf import OmegaConf

    from lightning_field.conf import compose_config

    cfg = compose_config("field_scale")
    return OmegaConf.to_container(cfg.model, resolve=True), OmegaConf.to_container(cfg.data, resolve=True)  # type: ignore[return-value]


def launch(spec_path: Path, log_path: Path, timeout_s: float) -> int:
    """One rank count as its own process group (Lightning's launcher starts the other ranks in it), so a
    timeout kills every rank, not only the first."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    # The package's own checkout and the user's directory (their modules, named by _target_), for every rank.
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.getcwd(), env.get("PYTHONPATH")) if p)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lightning_field.baseline.scale_worker", str(spec_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return -1
        finally:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # ranks or loader workers left behind
            proc.wait()


RANDOM_STEP = (
    "the training step draws random numbers (torch's RNG advanced during step 1): dropout, functional dropout "
    "such as scaled_dot_product_attention(dropout_p=...), or noise. Set them to 0 for the study (e.g. "
    "model.dropout=0); with them the gradients cannot match at any tolerance"
)


def _drew_random_numbers(run: dict[str, Any]) -> bool:
    marker = Path(run["gradient_file"]).with_suffix(".json")
    return marker.exists() and bool(json.loads(marker.read_text())["step1_drew_random_numbers"])


def run_study(config: StudyConfig, cpu_count: int | None = None) -> dict[str, Any]:
    """Plan (refusing bad input first), run every rank count in turn, analyse and write the records."""
    import torch

    plans = plan_study(
        config.ranks, config.steps, config.effective_batch, config.max_rank_batch, cpu_count, config.warmup_steps
    )
    if config.accelerator not in ACCELERATORS:
        raise ScaleInputError(f"accelerator {config.accelerator!r}: expected one of {', '.join(ACCELERATORS)}")
    if config.model is None or config.data is None:
        model, data = builtin_workload()
        config.model, config.data = config.model or model, config.data or data
    config.out_dir.mkdir(parents=True, exist_ok=True)
    runs = []
    for plan in plans:
        run_dir = config.out_dir / f"ranks-{plan.ranks}"
        run_dir.mkdir(parents=True, exist_ok=True)
        spec = ScaleRunSpec(
            out_dir=str(run_dir),
            ranks=plan.ranks,
            per_rank_batch=plan.per_rank_batch,
            accumulation=plan.accumulation,
            steps=config.steps,
            model=config.model,
            data=config.data,
            seed=config.seed,
            disable_dropout=config.disable_dropout,
            accelerator=config.accelerator,
            stall_rank=config.stall_rank,
            stall_s=config.stall_s,
        )
        spec_path = run_dir / "spec.json"
        spec.write(spec_path)
        started = time.perf_counter()
        rc = launch(spec_path, run_dir / "log.txt", config.timeout_s)
        if rc != 0:
            # Rank 0's lines only (other ranks repeat them), without the `[rank0]: ` prefixes.
            lines = (run_dir / "log.txt").read_text(errors="replace").rstrip().splitlines()
            lines = [line.removeprefix("[rank0]: ") for line in lines if not re.match(r"\[rank[1-9]\d*\]:", line)]
            tail = "\n".join(f"  {line}" for line in lines[-12:])
            raise ScaleRunError(f"the {plan.ranks}-rank run exited {rc} (log {run_dir / 'log.txt'}):\n{tail}")
        summary = summarize_run(run_dir, plan, config.warmup_steps)
        summary["process_wall_s"] = time.perf_counter() - started
        summary["gradient_file"] = str(run_dir / GRADIENT_FILE)
        runs.append(summary)
    base = runs[0]
    reference = torch.load(base["gradient_file"])
    target = config.effective_batch * config.steps
    first_samples = base["first_step_indices"]
    for run in runs:
        run["efficiency"] = scaling_efficiency(run["throughput_samples_s"], run["ranks"], base["throughput_samples_s"])
        run["steps_to_target"] = steps_to_samples(run["measured_samples_per_step"], target)
        run["same_first_step_samples"] = run["first_step_indices"] == first_samples
        run["gradient"] = (
            None if run is base else compare_gradients(reference, torch.load(run["gradient_file"]), config.tolerance)
        )
        if run["gradient"] is not None and not run["same_first_step_samples"]:
            run["gradient"] = {**run["gradient"], "passed": False, "reason": "step 1 read different samples"}
        elif run["gradient"] is not None and not run["gradient"]["passed"] and _drew_random_numbers(run):
            run["gradient"] = {**run["gradient"], "reason": RANDOM_STEP}
        del run["first_step_indices"]
    record = {
        "config": {**asdict(config), "out_dir": str(config.out_dir)},
        "target_samples": target,
        "workload": {"model": config.model, "data": config.data},
        "dropout_modules_disabled": runs[0]["dropout_modules_disabled"],
        "timing_source": "scale_worker.ScaleClock: host clocks per optimizer step; exposed communication from "
        "ProfiledDDPStrategy's gradient-bucket timer",
        "cpu_count": cpu_count or os.cpu_count(),
        "runs": runs,
        "verdict": verdict(runs, config.threshold, cpu_count),
    }
    record["records"] = {k: str(v) for k, v in write_records(record, config.out_dir).items()}
    return record


# ---------------------------------------------------------------------------------------------- records
def render_report(record: dict[str, Any]) -> str:
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
        grad = "reference" if g is None else (
            f"{'PASS' if g['passed'] else 'FAIL'} max abs {g.get('max_abs', float('nan')):.2e} "
            f"rel {g.get('max_rel', float('nan')):.2e}" + (f" ({g['reason']})" if g.get("reason") else "")
        )  # fmt: skip
        lines.append(
            f"{r['ranks']:>5} {r['per_rank_batch']:>10} {r['accumulation']:>5} {r['effective_batch']:>9} "
            f"{r['throughput_samples_s']:>10.1f} {r['efficiency']:>10.2f} {1e3 * r['step_time_median_s']:>8.2f} "
            f"{1e3 * b['data_s']:>8.2f} {1e3 * b['compute_s']:>8.2f} {1e3 * b['comm_s']:>8.2f} "
            f"{r['steps_to_target']:>8}  {grad}"
        )
        for s in r["stragglers"]:
            lines.append(f"      straggler: rank {s['rank']} in {SECTION_NAMES[s['section']]}")
    lines.append(f"(breakdown: the critical rank, the last to arrive at the all-reduce; steps->N: steps to "
                 f"{record['target_samples']} samples)")  # fmt: skip
    lines.append(f"Verdict: {record['verdict']['message']}")
    return "\n".join(lines)


def write_records(record: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """``scale.json``, ``scale.md`` and ``scale.png`` (throughput and efficiency against rank count)."""
    from lightning_field.core.fsio import atomic_write_bytes
    from lightning_field.evidence.plots import standalone_figure

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
