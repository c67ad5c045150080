#!/usr/bin/env bash
# Every GPU benchmark, with the peers (RMM from .whl/ where carried, CuPy, cuda-python) in the same run.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out="${OUT:-benchmarks/out}"; mkdir -p "$out"
python3 benchmarks/alloc_pair.py --json "$out/alloc_pair.json"
python3 benchmarks/prefetch_read.py --json "$out/prefetch_read.json"
