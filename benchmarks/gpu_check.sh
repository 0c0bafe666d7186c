#!/usr/bin/env bash
# Issue 29's check on a GPU machine, within GPU_CHECK_DEADLINE (560 s): install netdef from this checkout (plus the
# wheels that machine lacks), run the GPU tests, time one training iteration of the zoo's nets against
# PyTorch (benchmarks/gpu_train.py) and one net layer by layer (netdef time --gpu 0), and write every
# log and table under $OUT.
#
# The GPU machines this project measures on have no network: they get the checkout, and in .device/
# (ignored by git, carried with the checkout; `bash benchmarks/gpu_prepare.sh` makes it on the development
# machine) the wheels they lack and a copy of ../shared/fixtures:
#   .device/whl/     nvidia-cudnn-frontend, protobuf (>= the gencode of netdef_pb2), lmdb, simplejpeg, for Python 3.12
#   .device/shared/  fixtures/caffe-ref and fixtures/caffe-models, as ../shared holds them
#   .device/mpi/     the mpich wheel
#
# Usage: bash benchmarks/gpu_check.sh [BENCH_SECONDS] [EXTRA gpu_train.py FLAGS...]
# Environment: GPU_CHECK_DEADLINE (seconds from the start, default 560: every stage's timeout is cut to what
# is left before it, a stage with under 30 s left is skipped, and what is done is packed into $OUT after
# each stage, so that a device call's 600 s limit never takes the results with it),
# GPU_CHECK_STAGES (which of: tests profile time train graphs data overlap; default all but profile),
# GPU_CHECK_TESTS_BESIDE=1 (tests beside the benchmarks, see below), GPU_CHECK_PROFILE_NETS, OVERLAP_SECONDS (200), OVERLAP_RUNS,
# OVERLAP_ZOO (resnet50) and OVERLAP_BATCH (32): the overlap stage's net and batch per rank,
# GPU_CHECK_GRAPH_NETS and GRAPHS_SECONDS (120): the nets and time of the CUDA-graph stage, GPU_CHECK_PROFILE_FLAGS
# (e.g. --cuda-graphs --precision tf32): more flags for gpu_profile.py.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/netdef-gpu-check}"
mkdir -p "$OUT"
BENCH_SECONDS="${1:-210}"
shift || true

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device/whl/*.whl \
  || { echo "could not install the carried wheels" >&2; exit 1; }
export PYTHONPATH="/tmp/site:$PWD" NETDEF_SHARED="$PWD/.device/shared" PYTHONUNBUFFERED=1
# MPI for the two-rank tests (issue 30): the image's mpi4py has no MPI library of its own. The mpich
# wheel is installed where pip puts scripts and libraries beside Python (mpi4py finds it there);
# where that is refused, into the user's site.
if ls .device/mpi/mpich-*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-cache-dir .device/mpi/mpich-*.whl 2>/dev/null \
    || python3 -m pip install -q --no-index --no-deps --no-cache-dir --user .device/mpi/mpich-*.whl \
    || echo "could not install the mpich wheel: the two-rank GPU tests will skip" >&2
  export PATH="${HOME:-/root}/.local/bin:$PATH"
fi

# A newer NCCL than the image's, where gpu_prepare.sh built one (.device/nccl/, NCCL 2.30+ for this
# GPU's architecture): 2.28.9 refuses two ranks of one communicator on one GPU, so without it the
# NCCL tests skip and the overlap stage's NCCL runs fail. It is preloaded into the stages that use
# NCCL (CuPy takes a libnccl.so.2 already loaded before it searches the wheels).
NCCL_PRELOAD=
[ -f .device/nccl/libnccl.so.2 ] && NCCL_PRELOAD="$PWD/.device/nccl/libnccl.so.2"

{
  date -u
  [ -n "$NCCL_PRELOAD" ] && echo "NCCL preloaded for the tests and overlap stages: $(LD_PRELOAD=$NCCL_PRELOAD python3 -c \
    'from cupy.cuda import nccl; print(nccl.get_version())' 2>&1 | tail -1)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  python3 - <<'EOF'
import cupy, torch, cudnn, numpy, netdef.cudnn
print("python", __import__("sys").version.split()[0], "numpy", numpy.__version__, "cupy", cupy.__version__,
      "torch", torch.__version__, "torch cudnn", torch.backends.cudnn.version(), "cudnn frontend", cudnn.__version__)
print("netdef:", netdef.cudnn.status())
try:
    from cupy.cuda import nccl
    print("nccl", nccl.get_version())
except Exception as exc:  # noqa: BLE001
    print("nccl: not usable:", exc)
try:
    from mpi4py import MPI
    print("mpi:", MPI.Get_library_version().splitlines()[0], "mpiexec:", __import__("shutil").which("mpiexec"))
except Exception as exc:  # noqa: BLE001
    print("mpi: not usable:", exc)
EOF
} 2>&1 | tee "$OUT/versions.txt"

# A GPU machine returns at most 8 files from $OUT: the main logs go there as they are written, and
# everything (profiles, simulations, JSON) is packed into $OUT/all.tgz after each stage.
WORK=/tmp/netdef-gpu-check-work
rm -rf "$WORK"; mkdir -p "$WORK"
DEADLINE="${GPU_CHECK_DEADLINE:-560}"

# limit S: S, or the seconds left before the deadline less a margin for packing, whichever is less.
limit() {
  local left=$(( DEADLINE - SECONDS - 15 ))
  (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"
}
pack() {
  cp "$OUT"/*.log "$OUT"/*.txt "$WORK"/ 2>/dev/null
  tar -czf "$OUT/all.tgz" -C "$WORK" . 2>/dev/null
}

# The GPU tests run beside the layer timing and the training benchmark when GPU_CHECK_TESTS_BESIDE=1
# (a first visit, when finding what breaks matters more than clean figures; the figures of such a run
# are disturbed by the tests and are not reported); by default they run first, alone.
run_tests() {
  LD_PRELOAD="$NCCL_PRELOAD" timeout "$(limit 240)" python3 -m pytest -q -p no:cacheprovider -n 6 --dist load --timeout 90 \
    tests/test_gpu.py tests/test_gpu_cudnn.py tests/test_gpu_chains.py tests/test_gpu_graphs.py tests/test_gpu_ranks.py \
    tests/test_gpu_data.py \
    > "$OUT/tests.log" 2>&1
  echo "== tests (GPU): $(tail -1 "$OUT/tests.log")"
}

time_and_simulate() {
  echo "== netdef time --gpu 0 --json of the zoo's train_val nets: ResNet-50 (batch 32), AlexNet (256) (issue 30) =="
  for net in resnet50 alexnet; do
    size=224; [ $net = alexnet ] && size=227
    timeout "$(limit 45)" python3 -m netdef.cli time --model=models/$net/train_val.prototxt --data_shape 3,$size,$size --gpu 0 \
      --iterations 3 --json "$WORK/profile_${net}_gpu.json" > "$WORK/time_$net.log" 2>&1
    tail -3 "$WORK/time_$net.log"
    # 8 GPUs per node over NVLink-class links, nodes over 100 Gbit/s InfiniBand-class links; NCCL polls
    # nothing (--poll_ms 0); the update on the device at 500 GB of parameters per second (HBM-bound SGD).
    for bandwidth in 100gbit 200gbit; do
      timeout "$(limit 30)" python3 -m netdef.cli simulate "$WORK/profile_${net}_gpu.json" --workers 1,8,16,32,64,128,256 \
        --topology nodes --ranks_per_node 8 --intra_bandwidth 300GB/s --intra_latency 2us --bandwidth $bandwidth \
        --latency 2us --poll_ms 0 --update_rate 500 > "$WORK/simulate_${net}_$bandwidth.txt" 2>&1
      tail -9 "$WORK/simulate_${net}_$bandwidth.txt"
    done
  done
}

train_benchmark() {
  echo "== gpu_train.py =="
  local seconds; seconds=$(limit $((BENCH_SECONDS + 60)))
  timeout "$seconds" python3 benchmarks/gpu_train.py --time-budget "$(( seconds > 90 ? seconds - 60 : seconds * 2 / 3 ))" \
    --json "$WORK/gpu_train.json" "$@" > "$OUT/gpu_train.log" 2>&1
  tail -40 "$OUT/gpu_train.log"
}

graphs_benchmark() {
  # The nets the host held back in the first runs, with their replayable stretches replayed from CUDA
  # graphs (Net.cuda_graphs); the train stage's table is the same nets without.
  echo "== gpu_train.py --cuda-graphs (${GPU_CHECK_GRAPH_NETS:-resnet50,resnet152,googlenet}) =="
  local seconds; seconds=$(limit $((GRAPHS_SECONDS + 60)))
  timeout "$seconds" python3 benchmarks/gpu_train.py --cuda-graphs --time-budget "$(( seconds > 90 ? seconds - 60 : seconds * 2 / 3 ))" \
    --nets "${GPU_CHECK_GRAPH_NETS:-resnet50,resnet152,googlenet}" --json "$WORK/gpu_train_graphs.json" "$@" \
    > "$OUT/gpu_train_graphs.log" 2>&1
  tail -30 "$OUT/gpu_train_graphs.log"
}

overlap_benchmark() {
  # Staged through pinned host buffers and MPI, then over NCCL with both ranks on the one GPU (NCCL
  # 2.30+ allows it experimentally: NCCL_MULTI_RANK_GPU_ENABLE=1, its channels capped by NCCL_MAX_CTAS),
  # under the fifo schedule (one NCCL group per layer, ordered on the device) and the priority schedule
  # (its chunks started by the host as they become final, first what the next forward needs).
  # The net: a zoo net (OVERLAP_ZOO, default ResNet-50, issue 30's case) at OVERLAP_BATCH images per rank.
  # OVERLAP_RUNS: via:schedule:modes[:graphs] each. The staged path's buckets are driven by a
  # communication thread; NCCL's by what AUTO chooses (its events test cheaply: POLL, between layers);
  # "graphs": the train net replayed from CUDA graphs, the exchange's hooks at the stretches' edges.
  local runs=(${OVERLAP_RUNS:-mpi:fifo:THREAD nccl:fifo:AUTO nccl:priority:AUTO nccl:priority:AUTO:graphs})
  local seconds=$(( ${OVERLAP_SECONDS:-200} / ${#runs[@]} ))
  (( seconds < 30 )) && seconds=30  # a two-rank ResNet-50 launch needs that much
  for run in "${runs[@]}"; do
    seconds=$(limit "$seconds")
    (( seconds < 30 )) && { echo "== overlap: $run skipped: the deadline is near"; continue; }
    local via schedule modes graphs name
    IFS=: read -r via schedule modes graphs <<< "$run"
    name="${via}_${schedule}${graphs:+_$graphs}"
    echo "== overlap.py --gpu --exchange-via $via --schedule $schedule ${graphs:+--cuda-graphs }--zoo ${OVERLAP_ZOO:-resnet50}: two ranks on the GPU, the exchange hidden behind backward (issue 30) =="
    LD_PRELOAD="$NCCL_PRELOAD" NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_MAX_CTAS=8 timeout "$seconds" python3 benchmarks/overlap.py \
      --gpu --exchange-via $via --schedule $schedule ${graphs:+--cuda-graphs} \
      --zoo "${OVERLAP_ZOO:-resnet50}" --ranks 2 --batch "${OVERLAP_BATCH:-32}" --buckets 4 --modes "$modes" --rounds 2 \
      --iters 3 --warmup "$([ -n "$graphs" ] && echo 5 || echo 2)" --no-single \
      --timeout "$(( seconds - 5 ))" --json "$WORK/overlap_gpu_$name.json" > "$WORK/overlap_gpu_$name.txt" 2>&1
    tail -15 "$WORK/overlap_gpu_$name.txt"
  done
  cat "$WORK"/overlap_gpu_*.txt > "$OUT/overlap_gpu.txt"
}

data_benchmark() {
  echo "== gpu_data.py: ResNet-50 from an LMDB of JPEG Datums against a batch on the device (issue 29) =="
  timeout "$(limit 180)" python3 benchmarks/gpu_data.py --images 2000 --iters 10 --rounds 3 > "$OUT/gpu_data.log" 2>&1
  tail -6 "$OUT/gpu_data.log"
}

profile() {
  echo "== gpu_profile.py: where the iteration's time goes (${GPU_CHECK_PROFILE_NETS:-resnet50,googlenet}) =="
  timeout "$(limit 200)" python3 benchmarks/gpu_profile.py --nets "${GPU_CHECK_PROFILE_NETS:-resnet50,googlenet}" --iters 5 \
    ${GPU_CHECK_PROFILE_FLAGS:-} > "$OUT/profile.log" 2>&1
  grep -A 14 "^## " "$OUT/profile.log" | head -80
}

# The stages run in this order, those named in GPU_CHECK_STAGES (default: all but profile).
STAGES=" ${GPU_CHECK_STAGES:-tests time train graphs data overlap} "
GRAPHS_SECONDS="${GRAPHS_SECONDS:-120}"
# A stage runs when named and when 45 s or more are left before the deadline; what is done is packed after it.
stage() {
  [[ "$STAGES" == *" $1 "* ]] || return 1
  (( DEADLINE - SECONDS >= 45 )) || { echo "== $1: skipped, $(( DEADLINE - SECONDS )) s left before the deadline"; return 1; }
}
tests_pid=
if stage tests; then
  if [ "${GPU_CHECK_TESTS_BESIDE:-0}" = 1 ]; then run_tests & tests_pid=$!; else run_tests; fi
fi
pack
stage profile && profile; pack
stage time && time_and_simulate; pack
stage train && train_benchmark "$@"; pack
stage graphs && graphs_benchmark "$@"; pack
stage data && data_benchmark; pack
[ -n "$tests_pid" ] && wait $tests_pid
stage overlap && overlap_benchmark; pack
[ -f "$OUT/tests.log" ] && tail -30 "$OUT/tests.log"
pack && echo "everything: all.tgz ($(du -h "$OUT/all.tgz" | cut -f1)), $SECONDS s in all"
