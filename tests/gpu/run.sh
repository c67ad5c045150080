#!/usr/bin/env bash
# The GPU suite, on a machine with an NVIDIA GPU and cuda-python + CuPy installed.
# Runs the GPU tests and the core unit tests that need no Jupyter packages. tests/gpu/test_multi_device.py
# needs two GPUs (the nvidia-h100-x2 or nvidia-h200-x2 machine); on one it skips, saying so. On two, the
# residency-truth state machine runs on both and then on one. Needs hypothesis (and cupti-python for the
# tracing-on half), carried as wheels where the machine lacks them.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# Run from a checkout: compile the pool's free list and hot path in place, as an install would (pure Python if it cannot).
python3 hatch_build.py || echo "the C hot paths were not compiled: their Python twins are used"
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv || true
python3 -c "import cuda.bindings, cupy, numpy; print('cuda-bindings', cuda.bindings.__version__, 'cupy', cupy.__version__)"
# Every test with the gpu marker: tests/gpu, and the GPU side of unit modules (workloads as CuPy kernels).
python3 -m pytest tests/gpu tests/unit -m gpu -v -rfEs -p no:cacheprovider "$@"
status=$?
# On a machine of several GPUs, the residency-truth machine once more on one of them.
if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -gt 1 ]; then
    CUDA_VISIBLE_DEVICES=0 python3 -m pytest tests/gpu/test_residency_truth.py -q -rfEs -p no:cacheprovider -s \
        -k "truth_after_every_step or by_default or leaves_unknown" || status=1
fi
python3 -m pytest -q -p no:cacheprovider tests/unit/test_sim_backend.py tests/unit/test_buffer.py \
    tests/unit/test_resources.py tests/unit/test_events.py tests/unit/test_buffer_data.py tests/unit/test_pool.py tests/unit/test_pool_hot_path.py tests/unit/test_residency_model.py \
    tests/unit/test_sim_rules.py tests/unit/test_sim_event_log.py tests/unit/test_tracing_decode.py tests/unit/test_tracing_collector.py \
    tests/unit/test_tracing_reconcile.py tests/unit/test_residency_inference.py tests/unit/test_bounded_events.py \
    tests/unit/test_fault_injection.py tests/unit/test_torch.py tests/unit/test_torch_allocator.py \
    tests/unit/test_trace_replay.py tests/unit/test_advisor.py tests/unit/test_experiment.py \
    tests/codebase/test_layering.py || status=1
exit $status
