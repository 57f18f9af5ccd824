"""The restore drill's process: load a checkpoint into fresh objects, replay one step, compare.

``RestoreDrill`` (``drill.py``) starts ``python -m lightning_field.evidence.drill_replay SPEC`` with a
spec holding the recipe (model and data configs, trainer settings) and what the live run recorded
in the step right after the checkpoint; this process writes ``result.json`` beside the spec. Not
meant to be run by hand.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from lightning_field.checkpoint.manifest_checkpoint import ManifestCheckpoint
from lightning_field.checkpoint.options import ResumeConfig, SnapshotConfig, StorageConfig
from lightning_field.evidence.digest import parameter_norms, weights_digest
from lightning_field.evidence.drill_runs import ERROR, MISMATCH, PASSED, STORAGE_OPTIONS_ENV
from lightning_field.evidence.trace import StepTracer, read_trace

__all__ = ["main", "run_drill"]


def _close(a: float | None, b: float | None, rtol: float) -> bool:
    if a is None or b is None:
        return a is b
    if rtol == 0:
        return a == b
    return math.isclose(a, b, rel_tol=rtol, abs_tol=0.0)


def run_drill(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Load the checkpoint into fresh objects, train exactly one step, compare with the live record."""
    started = time.monotonic()
    torch.set_num_threads(int(spec["threads"]))
    work = Path(spec["work_dir"])
    expected = spec["expected"]
    model = instantiate(OmegaConf.create(spec["model"]))
    data = instantiate(OmegaConf.create(spec["data"]))
    # A checkpoint callback that never saves: it loads the manifest checkpoint and its per-rank state.
    # The live process built the recipe from the same code a moment ago, so code and config are not re-checked.
    loader = ManifestCheckpoint(
        dirpath=work / "unused",
        save_top_k=0,
        save_last=False,
        resume=ResumeConfig(allow_mismatch=["code", "config"]),
        snapshots=SnapshotConfig(every_n_train_steps=None),  # one step, then gone: a snapshot would outlive it
        storage=StorageConfig(options=json.loads(os.environ.get(STORAGE_OPTIONS_ENV) or "{}")),
    )
    tracer = StepTracer(work / "trace")
    trainer = pl.Trainer(
        **spec["trainer"],
        max_steps=int(expected["step"]) + 1,
        callbacks=[tracer, loader],
        default_root_dir=str(work),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )  # validation as the live run's: one that followed the checkpoint's step drew from the streams the step sees
    trainer.fit(model, datamodule=data, ckpt_path=spec["checkpoint"])
    records = read_trace(work / "trace")
    rtol = float(spec["rtol"])
    if not records:
        return {"outcome": ERROR, "error": "the drill trained no step from the checkpoint"}
    first = records[0]
    checks: dict[str, dict[str, Any]] = {
        "position": {"expected": expected["position"], "actual": [first["epoch"], first["batch_idx"]]},
        "batch": {"expected": expected["batch"], "actual": first["batch"]},
        "loss": {"expected": expected["loss"], "actual": first["loss"]},
    }
    checks["position"]["passed"] = checks["position"]["expected"] == checks["position"]["actual"]
    checks["batch"]["passed"] = expected["batch"] == first["batch"]
    checks["loss"]["passed"] = _close(expected["loss"], first["loss"], rtol)
    if rtol == 0:
        actual = weights_digest(model)
        checks["weights_after_step"] = {"expected": expected["weights"], "actual": actual}
        checks["weights_after_step"]["passed"] = expected["weights"] == actual
    else:
        norms = parameter_norms(model)
        worst = max(
            (abs(norms.get(k, math.inf) - v) / max(abs(v), 1e-30) for k, v in expected["norms"].items()), default=0.0
        )
        checks["weights_after_step"] = {"max_relative_norm_diff": worst, "passed": worst <= rtol}
    return {
        "outcome": PASSED if all(c["passed"] for c in checks.values()) else MISMATCH,
        "checks": checks,
        "seconds": time.monotonic() - started,
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m lightning_field.evidence.drill_replay SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(args[0]).read_text())
    for entry in reversed(spec.get("sys_path", [])):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    out = Path(spec["work_dir"]) / "result.json"
    try:
        result = run_drill(spec)
    except Exception as err:  # the live run must learn *why* a drill could not run, not just that it died
        result = {"outcome": ERROR, "error": f"{type(err).__name__}: {err}"}
    except BaseException as err:  # an interrupt or a library's exit: recorded, then it goes on as it would
        out.write_text(json.dumps({"outcome": ERROR, "error": f"{type(err).__name__}: {err}"}, indent=2))
        raise
    out.write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps(result, indent=2, default=str))
    return 0 if result["outcome"] == PASSED else 1


if __name__ == "__main__":
    sys.exit(main())
