# Sourced by every script in benchmarks/device/ (run them through run.sh). From the project's root it:
# - picks the results folder: $OUT if set, else $RESULTS_DIR, else benchmarks/results/device/<gpu>/ (<gpu> from
#   nvidia-smi, e.g. h100-80gb-hbm3; GPU_TAG overrides it), and names reports with $GPU;
# - makes MLX's CUDA build importable: what is installed if MLX already sees a GPU, else the offline staging in
#   .gpuB/ (see README.md, "Without a package registry") if present, else `pip install "mlx[cuda13]"`, mlx-lm and
#   the project's other dependencies into the current Python environment (DEVICE_INSTALL=no refuses to install);
# - defines `step NAME SECONDS COMMAND...`, which runs one measurement under its own time limit, appends its output
#   to $OUT/log.txt and, if it is still running after half and three quarters of its limit, appends a py-spy dump
#   (native frames included) of every thread, so a step cut at its limit still says where it was; and `save_ptx`.
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
GPU=${GPU_TAG:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr 'A-Z' 'a-z' \
  | sed -e 's/nvidia //; s/geforce //; s/ /-/g')}
GPU=${GPU:-gpu}
OUT=${OUT:-${RESULTS_DIR:-benchmarks/results/device/$GPU}}
mkdir -p "$OUT" && export OUT GPU
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
gpu_mlx() { python3 -c "import mlx.core as mx, sys; sys.exit('gpu' not in str(mx.default_device()))" 2>/dev/null; }
STAGED=
if [ -f .gpuB/install.sh ] && ! gpu_mlx; then
  # offline: MLX's CUDA build staged in .gpuA/.gpuB, the extra wheels in .gpuC/.gpuD, a PTX cache in .gpuE
  STAGED=1
  source .gpuB/install.sh
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site2 \
    $(ls .gpuC/*.whl .gpuD/*.whl 2>/dev/null) 2>&1 | tail -2
  export PYTHONPATH=$PYTHONPATH:/tmp/site2 PATH=$PATH:/tmp/site2/bin
  [ -f .gpuE/ptx.tar.xz ] && tar -xJf .gpuE/ptx.tar.xz -C /tmp && echo "PTX cache: $(ls /tmp/mlx/*/ptx | wc -l) files"
elif ! gpu_mlx; then
  if [ "${DEVICE_INSTALL:-yes}" = no ]; then
    echo "MLX does not see a GPU in this Python ($(command -v python3)) and DEVICE_INSTALL=no" >&2; exit 1
  fi
  # the project's dependencies from pyproject.toml except mlx itself (mlx[cpu] and mlx[cuda13] must not be
  # installed together), then MLX's CUDA build, the openai client (agent runs) and py-spy (the step dumps)
  deps=$(python3 -c "
import re, tomllib
deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']
print(' '.join(d.split(';')[0].replace(' ', '') for d in deps if re.split(r'[\[<>=;! ]', d)[0] != 'mlx'))")
  python3 -m pip install -q "mlx[cuda13]>=0.32" $deps "openai>=2.14,<3" py-spy || exit 1
fi
# the peers some scripts compare against (DEVICE_PEERS, set before sourcing), without their needs
if [ -n "$DEVICE_PEERS" ] && [ -z "$STAGED" ]; then
  python3 -m pip install -q --no-deps $DEVICE_PEERS || exit 1
fi
python3 -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device())"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
echo "results in $OUT"
# MLX's CUDA backend compiles each kernel variant with NVRTC on first use (tens of seconds for some) and keeps the
# PTX in /tmp/mlx/<version>/ptx, which later processes on the same machine reuse. Offline, `save_ptx` also leaves
# the grown cache in $OUT/ptx.tar.xz, to be copied to .gpuE/ so that the next machine starts with it.
save_ptx() { [ -n "$STAGED" ] && tar -cJf "$OUT/ptx.tar.xz" -C /tmp mlx; return 0; }
step() {
  local name=$1 seconds=$2; shift 2
  echo "== $name (limit ${seconds}s) $(date +%T)" | tee -a "$OUT/log.txt"
  timeout "$seconds" "$@" >>"$OUT/log.txt" 2>&1 &
  local pid=$!
  ( for at in $((seconds / 2)) $((seconds * 3 / 4)); do
      sleep $((at - ${last:-0})); last=$at
      if kill -0 $pid 2>/dev/null; then
        echo "-- py-spy at ${at}s" >>"$OUT/log.txt"
        # timeout's children from /proc (some images have no pgrep); --native shows where inside MLX's C++ it is
        for child in $(cat /proc/$pid/task/*/children 2>/dev/null); do
          py-spy dump --native --pid $child >>"$OUT/log.txt" 2>&1 || py-spy dump --pid $child >>"$OUT/log.txt" 2>&1
        done
      fi
    done ) &
  local spy=$!
  wait $pid; local rc=$?
  kill $spy 2>/dev/null
  echo "== $name rc=$rc $(date +%T)" | tee -a "$OUT/log.txt"
  tail -4 "$OUT/log.txt"
}
