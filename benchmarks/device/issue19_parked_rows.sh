# 2026-12-04 (eighth session) on the H200: parked rows (a finished request's row stays in the batch's cache and its
# conversation's next turn is prefilled into it in place) against finished rows leaving for the prefix cache at
# once, in one process, each arm twice, alternated (128 agents of the 4-turn synthetic agent, 16 x 8, chunks of 8);
# then `artmlx serve` against `mlx_lm.server` on the four workloads of issue 19's table (parked rows on).
#   bash benchmarks/device/issue19_parked_rows.sh (carry .gpuB .gpuC .gpuD .gpuE)
source benchmarks/device/common.sh
[ -d /tmp/q05 ] || step synth-q05 60 python3 -m artmlx model synth qwen2.5-0.5b --out /tmp/q05
step agent-turns-park 260 python3 benchmarks/agent_turns.py --model /tmp/q05 --groups 16 --rows 128 --cached-only \
  --park-forwards 0,64 --json $OUT/agent-turns-0.5b-h200-park.json
step serve-four 200 python3 benchmarks/serve_turns.py --model /tmp/q05 --adapter --json $OUT/serve-turns-0.5b-h200-park.json
save_ptx
