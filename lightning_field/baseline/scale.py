"""``field scale``: the same model at 1, 2 and N ranks under a constant effective batch, measured, not assumed.

The method adds devices only once the exposed bottleneck is understood. A study plans the
per-rank batch and gradient accumulation (so that every rank count optimises the same
effective batch), runs one child process group per rank count (``scale_worker``: Lightning's DDP
launcher, gloo on CPU), and turns the per-rank timings into:

* throughput and scaling efficiency, throughput(N) / (N x throughput(1));
* the step time of the critical rank split into data wait, compute and exposed communication;
* gradient equivalence of the first step against the 1-rank run (the same samples, so only the
  reduction order may differ);
* steps to a fixed number of samples;
* a verdict: "add devices", or "fix X first" with the numbers behind it.

This module runs the study: one process group per rank count, then the analysis and the records.
Planning is ``scale_plan`` and the analysis and verdict ``scale_analysis``, both pure so that the
verdict logic is testable without processes; the records are ``scale_report``. Every name of the
study stays importable from here.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from lightning_field.baseline.scale_analysis import (
    SECTION_NAMES,
    SECTIONS,
    compare_gradients,
    find_stragglers,
    scaling_efficiency,
    steps_to_samples,
    summarize_run,
    verdict,
)
from lightning_field.baseline.scale_plan import (
    ACCELERATORS,
    RANKS_PER_CPU,
    RankPlan,
    ScaleInputError,
    max_ranks,
    parse_ranks,
    plan_batches,
    plan_study,
)
from lightning_field.baseline.scale_report import render_report, write_records
from lightning_field.baseline.scale_worker import GRADIENT_FILE, ScaleRunSpec
from lightning_field.conf import compose_config
from lightning_field.integrations.hydra_configs import resolved_dict

__all__ = [
    "ACCELERATORS",
    "RANKS_PER_CPU",
    "SECTIONS",
    "SECTION_NAMES",
    "RankPlan",
    "ScaleInputError",
    "ScaleRunError",
    "StudyConfig",
    "builtin_workload",
    "compare_gradients",
    "find_stragglers",
    "launch",
    "max_ranks",
    "parse_ranks",
    "plan_batches",
    "plan_study",
    "render_report",
    "run_study",
    "scaling_efficiency",
    "steps_to_samples",
    "summarize_run",
    "verdict",
    "write_records",
]


class ScaleRunError(RuntimeError):
    """A rank count's run failed; the message ends with the last lines of its log (the cause)."""


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
    cfg = compose_config("field_scale")
    return resolved_dict(cfg.model), resolved_dict(cfg.data)


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
