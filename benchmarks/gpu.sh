#!/usr/bin/env bash
# Issue 26: the GPU figures in one run, on a machine with a CUDA GPU (none was lent while this was written).
#   bash benchmarks/gpu.sh [OUT.json]       # default .bench/gpu/results.json (+ results.md beside it)
# Verification at fp32 and bf16, the corpus ratio (hs.heads / bare eager loop), the long-text table on
# gemma3-270m up to 32,768 tokens (SDPA forward vs hs.heads(attention="recompute")), patching throughput.
# Issue 37: smollm2 split over 2 GPUs against cuda:0 alone (same numbers); skipped, saying why, with fewer GPUs.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
OUT="${1:-.bench/gpu/results.json}"
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "benchmarks/gpu.sh: torch sees no CUDA GPU here")'
exec "$PY" benchmarks/gpu.py --out "$OUT"
