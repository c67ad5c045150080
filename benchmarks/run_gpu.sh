#!/usr/bin/env bash
# Every GPU benchmark, with the peers (RMM from .whl/ where carried, CuPy, cuda-python) in the same run.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# Run from a checkout: compile the pool's free list and hot path in place, as an install would (pure Python if it cannot).
python3 hatch_build.py || echo "the pool was not compiled: the Python one is used"
out="${OUT:-benchmarks/out}"; mkdir -p "$out"
python3 benchmarks/alloc_pair.py --json "$out/alloc_pair.json"
python3 benchmarks/prefetch_read.py --json "$out/prefetch_read.json"
python3 benchmarks/tracing_decode.py
python3 benchmarks/tracing_overhead.py --repeats 2
python3 benchmarks/tracing_loss.py --trials 8
# The simulator against this GPU (about 3 minutes on an H200; writes its table into benchmarks/README.md):
#   python3 benchmarks/sim_vs_gpu.py --size 1GiB --readme benchmarks/README.md
# and variants of it (about a minute each; see benchmarks/README.md for the ones measured), e.g.
#   python3 benchmarks/sim_vs_gpu.py --cases "strided:stride=48KiB,random_gather:count=32768" \
#       --policies faults,read_mostly --json out/variants.json
# then fit the profile's fault-path costs to what this machine measured:
#   python3 benchmarks/sim_calibrate.py out/sim_vs_gpu.json out/variants.json --holdout workload
