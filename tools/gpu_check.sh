#!/usr/bin/env bash
# GPU readiness in under 8 minutes on a CUDA machine: the real-pair tests on the GPU, a latency
# profile of the GPU, and a short benchmark (AR, SD, profile-chosen SD, prompt lookup).
#   tools/gpu_check.sh                 # from the repository root, with .venv set up
#   PYTHON=python OUT=/tmp/x tools/gpu_check.sh
# Needs a CUDA build of torch (the CPU wheel of `make setup` has none) and the converted models
# in ~/.cache/viasd-adapters/models (the first run converts them, ~3 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-outputs/gpu_check/$(date +%Y-%m-%d_%H-%M-%S)}
mkdir -p "$OUT"
begin=$(date +%s)
step() { echo "== $* ($(( $(date +%s) - begin )) s)"; }

step "device"
"$PY" - <<'PY'
import sys, torch
if not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__} sees no CUDA device: install a CUDA build of torch (the CPU wheel has none)")
print(torch.__version__, torch.cuda.get_device_name(0), f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB")
PY

step "real-pair tests on cuda (fp32, token-identical to AR)"
VIASD_TEST_DEVICE=cuda timeout 240 "$PY" -m pytest -q -p no:cacheprovider tests/test_real_pair.py

step "latency profile of the GPU (cached under ~/.cache/viasd-adapters/profiles/cuda-*.json)"
timeout 120 "$PY" -m viasd_adapters.cli.profile runtime.device=cuda progress=false \
    'grid.threads=[1]' 'grid.contexts=[256]' 'grid.new_tokens=[1,2,4,8,12,16]' hydra.run.dir="$OUT/profile"

step "short benchmark on cuda"
timeout 180 "$PY" -m viasd_adapters.cli.bench runtime.device=cuda out_dir="$OUT/bench" progress=false \
    repetitions=1 warmup=1 max_new_tokens=64 task.limit=1 \
    'task.categories=[mt_bench,translation,summarization,qa,math_reasoning]' \
    'method=[ar,sd,sd-adaptive,lookup]'

step "done: $OUT/bench/table.md"
