# Sourced on the NVIDIA machine from the project's root (after part A of the CUDA build was staged in
# /root/stage; see ../shared/gpu/README.md): installs MLX CUDA and the extra wheels, and defines
# `step NAME SECONDS COMMAND...`, which runs one measurement under its own timeout, appends its
# output to $OUT/log.txt and, if it is still running after half and three quarters of its time, appends a
# py-spy dump (native frames included) of where every thread is.
source .gpuB/install.sh
# MLX's CUDA backend compiles kernels with NVRTC on first use (a 4-bit product's tile variant took tens of seconds;
# 128 agents on a fresh machine spent minutes there) and keeps the PTX in /tmp/mlx/<version>/ptx: what earlier
# calls compiled travels as .gpuE/ptx.tar.xz (carry it), and `save_ptx` returns the grown cache in $OUT.
[ -f .gpuE/ptx.tar.xz ] && tar -xJf .gpuE/ptx.tar.xz -C /tmp && echo "PTX cache: $(ls /tmp/mlx/*/ptx | wc -l) files"
save_ptx() { tar -cJf $OUT/ptx.tar.xz -C /tmp mlx; }
# the extra wheels (tomli-w, starlette, uvicorn, py-spy; openai and its needs for agent runs) in .gpuC/ and .gpuD/,
# made here by benchmarks/device/prepare_extras.sh (a new checkout has none of .gpuA-.gpuE: run both preparations)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site2 $(ls .gpuC/*.whl .gpuD/*.whl 2>/dev/null) 2>&1 | tail -2
export PYTHONPATH=$PYTHONPATH:/tmp/site2 PATH=$PATH:/tmp/site2/bin
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
step() {
  local name=$1 seconds=$2; shift 2
  echo "== $name (limit ${seconds}s) $(date +%T)" | tee -a $OUT/log.txt
  timeout "$seconds" "$@" >>$OUT/log.txt 2>&1 &
  local pid=$!
  ( for at in $((seconds / 2)) $((seconds * 3 / 4)); do
      sleep $((at - ${last:-0})); last=$at
      if kill -0 $pid 2>/dev/null; then
        echo "-- py-spy at ${at}s" >>$OUT/log.txt
        # the image has no pgrep: timeout's children from /proc; --native shows where inside MLX's C++ it is
        for child in $(cat /proc/$pid/task/*/children 2>/dev/null); do
          py-spy dump --native --pid $child >>$OUT/log.txt 2>&1 || py-spy dump --pid $child >>$OUT/log.txt 2>&1
        done
      fi
    done ) &
  local spy=$!
  wait $pid; local rc=$?
  kill $spy 2>/dev/null
  echo "== $name rc=$rc $(date +%T)" | tee -a $OUT/log.txt
  tail -4 $OUT/log.txt
}
