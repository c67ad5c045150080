#!/usr/bin/env bash
# Every GPU benchmark, with the peers (RMM from .whl/ where carried, CuPy, cuda-python) in the same run.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# Run from a checkout: compile the pool's free list and hot path in place, as an install would (pure Python if it cannot).
python3 hatch_build.py || echo "the C hot paths were not compiled: their Python twins are used"
out="${OUT:-benchmarks/out}"; mkdir -p "$out"
python3 benchmarks/alloc_pair.py --json "$out/alloc_pair.json"
python3 benchmarks/prefetch_read.py --json "$out/prefetch_read.json"
# torch through uvm_lab against torch's caching allocator and RMM's torch allocator (rmm from .whl/):
python3 benchmarks/torch_allocator.py --json "$out/torch_allocator.json"
python3 benchmarks/tracing_decode.py
python3 benchmarks/tracing_overhead.py --repeats 3 --modes "watcher,watcher 0.05 s,migrations,faults"
python3 benchmarks/tracing_loss.py --trials 8
# CUPTI's silent loss on the 2 GiB fault-driven read, setting by setting (benchmarks/README.md's table):
for cfg in "--counters faults" "--counters migrations" "--counters transfers" "--counters faults --drain 0.00025" \
           "--counters faults --buffer-size 1MiB" "--counters faults --buffer-size 64MiB" \
           "--counters faults --attr ATTR_DEVICE_BUFFER_POOL_LIMIT=1000 --attr ATTR_PER_THREAD_BUFFER=0"; do
    echo "== $cfg"; python3 benchmarks/tracing_loss.py --size 2GiB --trials 5 --settle 0.2 $cfg
done
python3 benchmarks/watch_with_cupti.py --size 1GiB --trials 3
# The advisor's advice on each catalog workload and policy, recorded on this GPU with CUPTI, applied, and timed
# (benchmarks/README.md's second advisor table; ReadMostly with GPU writes costs about a minute a pass at 1 GiB):
python3 benchmarks/advisor_validation.py --on gpu --size 256MiB --json "$out/advisor_gpu.json"
# The simulator against this GPU (each case timed 5 times in rounds, the median judged; about 2 minutes on an
# H200 with the two one-minute ReadMostly write cases taken from an earlier run; writes its table into
# benchmarks/README.md):
#   python3 benchmarks/sim_vs_gpu.py --repeats 5 --skip stencil:read_mostly,tiled_matmul:read_mostly \
#       --previous benchmarks/sim_vs_gpu_h200_c.json --json out/e.json --readme benchmarks/README.md
# and variants of it (about two minutes for each of these two sets), as in sim_vs_gpu_h200_e_*.json:
#   S=$(printf 'strided:stride=%s,' 16KiB 32KiB 48KiB 64KiB 80KiB 96KiB 128KiB 192KiB 256KiB 512KiB 1MiB 2MiB 8MiB)
#   O=strided:stride=64KiB:offset=4KiB,strided:stride=64KiB:offset=64KiB,strided:stride=64KiB:offset=1MiB
#   O=$O,strided:stride=32KiB:offset=1536KiB,strided:stride=128KiB:offset=1MiB
#   python3 benchmarks/sim_vs_gpu.py --repeats 5 --cases "$S$O" --policies faults,read_mostly \
#       --json out/e_strided.json
#   V=stencil:row_bytes=64KiB,stencil:row_bytes=256KiB,stencil:row_bytes=4MiB,stencil:row_bytes=16MiB
#   V=$V,random_gather:count=16384,random_gather:count=65536,random_gather:count=131072
#   V=$V,host_then_device:size=256MiB,host_then_device:size=2GiB,host_then_device:passes=2
#   V=$V,tiled_matmul:tiles=2,tiled_matmul:tiles=8,sequential_stream:size=256MiB,sequential_stream:size=4GiB
#   python3 benchmarks/sim_vs_gpu.py --repeats 5 --cases "$V" --policies faults --json out/e_variants.json
# (ReadMostly with GPU writes costs about a minute a pass: keep stencil and matmul variants to faults.)
# The check of the full-duplex link and the matmul's C tile, as in sim_vs_gpu_h200_g_variants.json (two minutes):
#   V=sequential_stream:write=1,sequential_stream:write=1:size=256MiB,stencil:row_bytes=256KiB
#   V=$V,stencil:row_bytes=4MiB,tiled_matmul:tiles=2,tiled_matmul:tiles=8
#   python3 benchmarks/sim_vs_gpu.py --repeats 5 --cases "$V" --policies faults,prefetch,remote \
#       --json out/g_variants.json
# The check of the host's and the GPU's write costs, as in sim_vs_gpu_h200_j_variants.json (one minute):
#   V=sequential_stream:write=1:size=512MiB,sequential_stream:size=512MiB,sequential_stream:write=1:size=2GiB
#   V=$V,sequential_stream:size=2GiB,sequential_stream:write=1,sequential_stream
#   V=$V,stencil:row_bytes=2MiB,stencil:size=512MiB,tiled_matmul:size=512MiB,tiled_matmul
#   V=$V,host_then_device:size=512MiB,host_then_device:write_every=4,host_then_device:size=4GiB
#   python3 benchmarks/sim_vs_gpu.py --repeats 5 --cases "$V" --policies faults --json out/j_variants.json
# The check of the timed pass's floor, as in sim_vs_gpu_h200_k_remote.json and _k_resident.json (one minute):
#   S=$(printf 'strided:stride=%s,' 16KiB 32KiB 64KiB 128KiB 512KiB 2MiB 8MiB)
#   python3 benchmarks/sim_vs_gpu.py --repeats 5 --cases "${S}random_gather:count=16384,random_gather:count=65536,random_gather" \
#       --policies remote --json out/k_remote.json
#   python3 benchmarks/sim_vs_gpu.py --repeats 5 --cases multi_pass_stream,multi_pass_stream:size=4GiB,host_then_device:passes=2 \
#       --policies faults,prefetch --json out/k_resident.json
# access() on resident memory, the CUDA backend's touch kernel and host loop beside the simulator (seconds), as in
# sim_access_h200_c.json:
#   python3 benchmarks/sim_access.py --json out/sim_access.json
# then fit the profile's fault-path costs to what this machine measured:
#   python3 benchmarks/sim_calibrate.py out/sim_vs_gpu.json out/variants.json --holdout workload
# The records a trace holds, CUPTI's against the simulator's, as in sim_records_h200.json (two minutes; with GPU
# faults on as well, as in sim_records_h200_gpu_faults.json, leave out --no-gpu-faults):
#   python3 benchmarks/sim_records.py --no-gpu-faults --json out/sim_records.json
# uvm_lab.dask at scale, on this host's cores (simulated GPUs: 8 worker processes; needs distributed, from .whl/):
# 1 M events a second from 8 workers to the client, and the plugin's cost to a task loop, as in dask_*_h100.json.
if python3 -c "import distributed" 2>/dev/null; then
    python3 benchmarks/dask_scale.py scale --workers 8 --rate 1000000 --seconds 10 --json "$out/dask_scale.json"
    python3 benchmarks/dask_scale.py cost --workers 8 --pairs 20 --iterations 200 --json "$out/dask_cost.json"
else
    echo "distributed is not installed: the uvm_lab.dask benchmarks did not run"
fi
# The live view's cost to a loop, on this host's cores (simulated device): 8 processes side by side, half with the
# view or the dashboard and half without, swapping every slot, beside two yardstick threads that take 5% of a core,
# as in view_cost_h100.json and view_cost_yardsticks_h100.json (about 8 minutes; the dashboard needs bokeh and
# ipywidgets, from .whl/).
python3 benchmarks/view_scale.py --repeats 0 --modes view,dashboard,busy,busy_numpy --concurrent 8 --slots 36 \
    --json "$out/view_cost.json"
# main's view and dashboard against themselves opened and closed before the loop, with the loop's waits
# (view_cost_h100_main.json; about 4 minutes)
python3 benchmarks/view_scale.py --repeats 0 --modes view,dashboard --baseline closed --concurrent 8 --slots 30 \
    --json "$out/view_cost_main.json"
# the dashboard at its default of one refresh a second against its earlier five, and the view at 10 updates a
# second (view_cost_h100_dashboard_1s.json; about 9 minutes)
python3 benchmarks/view_scale.py --repeats 0 --modes dashboard,dashboard_5hz --baseline closed --concurrent 8 \
    --slots 40 --json "$out/view_cost_dashboard_1s.json"
python3 benchmarks/view_scale.py --repeats 0 --modes view,view_10hz --baseline closed --concurrent 8 --slots 30 \
    --json "$out/view_cost_view_10hz.json"
# the view beside pure Python at its pace and switch interval, 1.6 ms and 0.2 ms every 50 ms (the second machine of
# view_cost_h100_lighter_updates.json; about 4 minutes). Its first machine ran the view alone at two commits, each
# checkout in turn: --modes view --slots 28.
python3 benchmarks/view_scale.py --repeats 0 --modes view,busy_fine,tick_fine --baseline closed --concurrent 8 \
    --slots 24 --json "$out/view_cost_paced.json"
# and each of an update's reads alone at that pace (its third and fourth machines; about 6 minutes)
python3 benchmarks/view_scale.py --repeats 0 --modes view,maps_fine,journal_fine,readin_fine --baseline closed \
    --concurrent 8 --slots 24 --json "$out/view_cost_paced_reads.json"
# the rest of an update, not yet run on a GPU host: the maps on screen described again where they changed, at the
# view's pace, and the view with its messages not encoded as JSON (about 6 minutes)
python3 benchmarks/view_scale.py --repeats 0 --modes view,view_unencoded,refresh_fine,busy_fine --baseline closed \
    --concurrent 8 --slots 24 --json "$out/view_cost_update_parts.json"
# the view beside the loop made 1.6 times as fast (b70b53a): at its rate, at 67 and 100 ms, and with every thread of
# each process on one core, and the dashboard (view_cost_h100_faster_loop.json; about 2 minutes a mode)
python3 benchmarks/view_scale.py --repeats 0 --modes view,view_15hz,view_10hz --baseline closed --concurrent 8 \
    --slot-seconds 3 --slots 24 --json "$out/view_cost_faster_loop.json"
python3 benchmarks/view_scale.py --repeats 0 --modes view --baseline closed --pin together --concurrent 8 \
    --slot-seconds 3 --slots 24 --json "$out/view_cost_pinned_together.json"
python3 benchmarks/view_scale.py --repeats 0 --modes dashboard --baseline closed --concurrent 8 \
    --slot-seconds 3 --slots 20 --json "$out/dashboard_cost_faster_loop.json"
# the view and the dashboard reading the loop's records from the bus's history (c94804d; machine 1 ran the view twice
# and the dashboard at 24 slots, machine 2 each once: view_cost_h100_history_reader.json; about 3.5 minutes a run)
python3 benchmarks/view_scale.py --repeats 0 --modes view --baseline closed --concurrent 8 \
    --slot-seconds 3 --slots 40 --json "$out/view_cost_history_reader.json"
python3 benchmarks/view_scale.py --repeats 0 --modes dashboard --baseline closed --concurrent 8 \
    --slot-seconds 3 --slots 40 --json "$out/dashboard_cost_history_reader.json"
# the view with the switch interval it holds while open at 0.1 ms (uvm_lab's), 0.05 and 0.02 ms (the fifth machine
# of view_cost_h100_dashboard_1s.json; about 7 minutes)
for interval in 1e-4 5e-5 2e-5; do
    python3 benchmarks/view_scale.py --repeats 0 --modes view --baseline closed --concurrent 8 --slots 40 \
        --switch-interval $interval --json "$out/view_cost_switch_$interval.json"
done
# and the view's cost taken apart, each set in one run so that its modes meet the same machine (about 1.5 minutes a
# mode): a paused view (fed, no update), the updates made on the loop's own thread, 5% of pure Python there, the
# shared timeline window alone, and a view's snapshot made and closed before the loop (view_cost_h100_parts.json);
# then the view, the view with no map on screen, a paused one and the dashboard, each against itself opened and
# closed before the loop, so that the halves differ only in what is attached while the loop runs
# (view_cost_h100_vs_closed.json, view_cost_h100_split.json; about 6.5 minutes).
python3 benchmarks/view_scale.py --repeats 0 --modes view,view_inline,paused,busy_inline,window,snapshot \
    --concurrent 8 --slots 24 --json "$out/view_cost_parts.json"
python3 benchmarks/view_scale.py --repeats 0 --modes view,view_no_maps,paused,dashboard --baseline closed \
    --concurrent 8 --slots 24 --json "$out/view_cost_vs_closed.json"
# What the view costs beyond its CPU: at half the rate, and with each process's threads pinned to cores of their own
# (view_cost_h100_rate.json, view_cost_h100_pinned.json; about 5 minutes).
python3 benchmarks/view_scale.py --repeats 0 --modes view,view_10hz --baseline closed \
    --concurrent 8 --slots 30 --json "$out/view_cost_rate.json"
python3 benchmarks/view_scale.py --repeats 0 --modes view --baseline closed --pin \
    --concurrent 8 --slots 30 --json "$out/view_cost_pinned.json"
