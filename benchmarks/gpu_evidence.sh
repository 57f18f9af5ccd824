#!/usr/bin/env bash
# GPU checks for the resume evidence, run on a CUDA machine from the repository root:
#   bash benchmarks/gpu_evidence.sh OUT_DIR
# 1. CUDA RNG round trip and a restore drill on the GPU (benchmarks/gpu_checks.py);
# 2. field-evidence on the GPU with the demo model (dropout on the CUDA generator), deterministic;
# 3. field-evidence on the GPU with a model whose index_add_ is nondeterministic on CUDA.
set -u
OUT=${1:?usage: gpu_evidence.sh OUT_DIR}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/tests:${PYTHONPATH:-}"
python3 benchmarks/gpu_checks.py "$OUT/checks"; echo "gpu_checks exit $?"
python3 -m lightning_field.cli.evidence_app trainer=gpu trainer.deterministic=true evidence.steps=20 \
  hydra.run.dir="$OUT/h1" evidence.bundle_dir="$OUT/deterministic" 2>&1 | grep field-evidence
echo "field-evidence (gpu, deterministic) exit ${PIPESTATUS[0]}"
python3 -m lightning_field.cli.evidence_app trainer=gpu model._target_=evidence_models.ScatterRegressor \
  evidence.steps=30 evidence.kill_steps=[8] hydra.run.dir="$OUT/h2" evidence.bundle_dir="$OUT/scatter" 2>&1 | grep field-evidence
echo "field-evidence (gpu, index_add_) exit ${PIPESTATUS[0]}"
