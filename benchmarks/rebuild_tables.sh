#!/usr/bin/env bash
# Rebuild every simulator-against-H200 table in benchmarks/README.md from the saved runs: the real side is
# what the GPU measured; the simulated side is recomputed by the model as committed. No GPU needed.
set -euo pipefail
cd "$(dirname "$0")/.."
readme=benchmarks/README.md
while read -r marker run; do
    "${PYTHON:-python3}" benchmarks/sim_vs_gpu.py --from-json "benchmarks/$run" --readme "$readme" --marker "$marker"
done <<'TABLES'
sim_vs_gpu sim_vs_gpu_h200_g.json
sim_vs_gpu_variants sim_vs_gpu_h200_variants.json
sim_vs_gpu_check sim_vs_gpu_h200_check.json
sim_vs_gpu_rounds_strided sim_vs_gpu_h200_e_strided.json
sim_vs_gpu_rounds_variants sim_vs_gpu_h200_e_variants.json
sim_vs_gpu_g_variants sim_vs_gpu_h200_g_variants.json
sim_vs_gpu_h_variants sim_vs_gpu_h200_h_variants.json
sim_vs_gpu_i_variants sim_vs_gpu_h200_i_variants.json
sim_vs_gpu_j_variants sim_vs_gpu_h200_j_variants.json
sim_vs_gpu_k_remote sim_vs_gpu_h200_k_remote.json
sim_vs_gpu_k_resident sim_vs_gpu_h200_k_resident.json
TABLES
"${PYTHON:-python3}" benchmarks/sim_records.py --from-json benchmarks/sim_records_h200.json --readme "$readme" >/dev/null
