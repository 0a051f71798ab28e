# `artmlx serve` as its own process against mlx_lm.server (both serving the same nonzero adapter) on
# benchmarks/serve_turns.py's four multi-turn workloads, with each turn's median request time; then artmlx's server
# inside the benchmark's process (--in-process) on the one-conversation workload, with its scheduler's counts.
# SERVE_LIMIT sets the first step's limit.
#   bash benchmarks/device/run.sh serve_turns
source benchmarks/device/common.sh
[ -d /tmp/qwen2.5-0.5b ] || step synth-q05 60 python3 -m artmlx model synth qwen2.5-0.5b --out /tmp/qwen2.5-0.5b
step serve-process ${SERVE_LIMIT:-330} python3 benchmarks/serve_turns.py --model /tmp/qwen2.5-0.5b --adapter \
  --json $OUT/serve-turns-0.5b-${GPU}-process.json
step serve-in-process 100 python3 benchmarks/serve_turns.py --model /tmp/qwen2.5-0.5b --adapter --in-process \
  --artmlx-only --workloads 1x1000x4 --json $OUT/serve-turns-0.5b-${GPU}-in-process-1conv.json
save_ptx
