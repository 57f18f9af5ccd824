"""``field scale``: a scaling study at constant effective batch (``--json`` for machines).

The study's settings are the ``scale`` config group; flags such as ``--ranks`` are shorthand for
``scale.*`` overrides. Other arguments are Hydra overrides on the same groups as ``field-train``, which
name the workload: ``experiment=char_gpt_tiny`` or ``model._target_=my_pkg.MyModule data._target_=...``.
Bad input exits 2 with a message naming the problem, before any process is started.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

# The study, torch and Hydra are imported when a study is asked for: `field --help` and every other
# `field` command build this parser too.
from lightning_field.baseline.scale_plan import RANKS_PER_CPU, ScaleInputError, parse_ranks, plan_study

if TYPE_CHECKING:
    from lightning_field.baseline.scale import StudyConfig

# flag (argparse dest) -> the scale.* setting it sets
FLAG_KEYS = {
    "steps": "steps",
    "effective_batch": "effective_batch",
    "max_rank_batch": "max_rank_batch",
    "warmup": "warmup_steps",
    "tolerance": "tolerance",
    "threshold": "threshold",
    "stall_rank": "stall_rank",
    "stall_s": "stall_s",
    "timeout": "timeout_s",
    "out": "out_dir",
    "accelerator": "accelerator",
}


def study_config(args: argparse.Namespace) -> StudyConfig:
    """Compose ``field_scale`` with the user's overrides, then apply the flags (which win: they are what
    was typed most explicitly, and paths need no Hydra quoting)."""
    # Hydra, OmegaConf and the study (torch) load only for `field scale`: `field --help` stays fast.
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    # (the same reason: the study config and the Hydra helpers import torch and Lightning)
    from lightning_field.baseline.scale import StudyConfig
    from lightning_field.cli.hydra_app import import_from_working_directory, one_line
    from lightning_field.conf import compose_config
    from lightning_field.integrations.hydra_configs import (
        TargetConfigError,
        apply_target_swaps,
        prepare_target_overrides,
        resolved_dict,
    )

    import_from_working_directory()
    overrides = prepare_target_overrides(args.overrides)
    try:
        cfg = apply_target_swaps(compose_config("field_scale", overrides), overrides)
        scale = resolved_dict(cfg.scale)
        # Checked below, with the message a config without a _target_ deserves.
        model: Any = OmegaConf.to_container(cfg.model, resolve=True)
        data: Any = OmegaConf.to_container(cfg.data, resolve=True)
    except TargetConfigError as err:
        raise ScaleInputError(str(err)) from None
    except (HydraException, OmegaConfBaseException) as err:
        raise ScaleInputError(f"config: {one_line(str(err))}") from None
    for name, node in (("model", model), ("data", data)):
        if not isinstance(node, dict) or not node.get("_target_"):
            raise ScaleInputError(f"{name}: needs a _target_ (e.g. {name}._target_=my_pkg.My{name.title()})")
    unknown = set(scale) - set(StudyConfig.__dataclass_fields__)
    if unknown:
        raise ScaleInputError(f"scale: unknown setting(s) {', '.join(sorted(unknown))}")
    scale.update({key: getattr(args, dest) for dest, key in FLAG_KEYS.items() if getattr(args, dest) is not None})
    if args.ranks is not None:
        scale["ranks"] = parse_ranks(args.ranks)
    ranks = scale.pop("ranks")
    if not isinstance(ranks, list) or not all(isinstance(n, int) for n in ranks):
        raise ScaleInputError(f"scale.ranks: {ranks!r} is not a list of rank counts (e.g. [1,2,4])")
    out = scale.pop("out_dir") or Path("runs") / "scale" / time.strftime("%Y%m%d-%H%M%S")
    config = StudyConfig(ranks=sorted(set(ranks)), out_dir=Path(out), model=model, data=data, **scale)
    if config.stall_rank is None:
        config.stall_s = 0.0
    return config


def validate(config: StudyConfig) -> None:
    if config.stall_s < 0:
        raise ScaleInputError(f"--stall-s {config.stall_s} must be >= 0")
    if config.stall_rank is not None and not 0 <= config.stall_rank < max(config.ranks):
        raise ScaleInputError(
            f"--stall-rank {config.stall_rank}: no such rank at any count (ranks 0..{max(config.ranks) - 1})"
        )
    if config.tolerance <= 0:
        raise ScaleInputError(f"--tolerance {config.tolerance} must be > 0")
    if config.timeout_s <= 0:
        raise ScaleInputError(f"--timeout {config.timeout_s} must be > 0")
    plan_study(
        config.ranks, config.steps, config.effective_batch, config.max_rank_batch, warmup_steps=config.warmup_steps
    )


def cmd_scale(args: argparse.Namespace) -> int:
    # torch and Lightning load only when a study runs (see study_config).
    from lightning_field.baseline.scale import ScaleRunError, render_report, run_study

    try:
        config = study_config(args)
        validate(config)  # before any process starts
        record = run_study(config)
    except ScaleInputError as err:
        print(f"field scale: {err}", file=sys.stderr)
        return 2
    except ScaleRunError as err:
        print(f"field scale: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(record, indent=2, default=str))
    else:
        print(render_report(record))
        print(f"records: {', '.join(record['records'].values())}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "scale",
        help="throughput, efficiency, step breakdown and gradient equivalence at 1..N ranks",
        description="Flags default to conf/lightning_field/scale/default.yaml; trailing arguments are Hydra "
        "overrides naming the workload (experiment=char_gpt_tiny, model._target_=..., data._target_=...).",
    )
    p.add_argument("--ranks", help="rank counts, e.g. 1,2,4 (must include 1; default 1,2,4)")
    p.add_argument("--steps", type=int, help="optimizer steps per rank count (default 20)")
    p.add_argument("--effective-batch", type=int, help="samples per optimizer step, over all ranks (default 32)")
    p.add_argument("--max-rank-batch", type=int, help="largest per-rank batch; above it, gradient accumulation")
    p.add_argument("--warmup", type=int, help="steps excluded from timing (default 2)")
    p.add_argument("--tolerance", type=float, help="max relative gradient difference (reduction order; default 1e-5)")
    p.add_argument("--threshold", type=float, help="efficiency at the largest count to add devices (default 0.7)")
    p.add_argument("--stall-rank", type=int, help="inject a data stall: this rank's loader sleeps per batch")
    p.add_argument("--stall-s", type=float, help="seconds of the injected stall per batch (with --stall-rank)")
    p.add_argument("--timeout", type=float, help="seconds per rank count before its group is killed (default 300)")
    p.add_argument("--accelerator", choices=["cpu", "gpu"], help="cpu: gloo processes; gpu: one GPU per rank, NCCL")
    p.add_argument("--out", help="records directory (default runs/scale/<timestamp>)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("overrides", nargs="*", help="Hydra overrides: experiment=..., model.*, data.*, scale.*")
    p.set_defaults(func=cmd_scale)
    p.epilog = f"Rank counts above {RANKS_PER_CPU} x the CPU cores are refused."
