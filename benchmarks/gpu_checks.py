"""GPU-only paths, run on a CUDA machine: CUDA RNG capture/restore and a restore drill on the GPU.

    python benchmarks/gpu_checks.py OUT_DIR

Prints one line per check and exits non-zero if any fails. The GPU evidence runs themselves are
field-evidence invocations (see benchmarks/gpu_evidence.sh).
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning.pytorch as pl
import torch

from lightning_field import ManifestCheckpoint, RestoreDrill, read_manifest
from lightning_field.state.rng import capture_rng_state, restore_rng_state
from lightning_field.workloads.demo import DemoDataModule, DemoRegressor


def cuda_rng_round_trip() -> bool:
    torch.rand(1, device="cuda")  # initialise CUDA's generator
    state = capture_rng_state()
    first = torch.rand(1000, device="cuda")
    assert "cuda" in state, "capture_rng_state did not capture the CUDA generator"
    restore_rng_state(state)
    again = torch.rand(1000, device="cuda")
    return bool(torch.equal(first, again))


def drill_on_gpu(root: Path) -> bool:
    pl.seed_everything(0)
    checkpoint = ManifestCheckpoint(dirpath=root / "ckpts", every_n_train_steps=3, save_top_k=-1)
    drill = RestoreDrill(every_n_checkpoints=1)
    trainer = pl.Trainer(
        default_root_dir=root, max_steps=10, accelerator="gpu", devices=1, deterministic=True, logger=False,
        enable_progress_bar=False, limit_val_batches=0, callbacks=[drill, checkpoint],
    )  # fmt: skip
    trainer.fit(DemoRegressor(), datamodule=DemoDataModule())
    for result in drill.results:
        print(f"  drill {Path(result['checkpoint']).name}: passed={result['passed']} error={result['error']}")
    tested = [read_manifest(root / "ckpts" / f"epoch=0-step={s}").restore_tested for s in (3, 6, 9)]
    return len(drill.results) == 3 and all(tested)


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    checks = {"cuda_rng_round_trip": cuda_rng_round_trip(), "restore_drill_on_gpu": drill_on_gpu(out / "drill")}
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'} {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
