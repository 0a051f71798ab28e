# 2026-12-03, fourth session, on the H200, with the PTX the earlier calls compiled (.gpuE): 128 agents of the 4-turn
# synthetic agent (16 x 8, cached) after finished sequences are kept one gather per layer for the rows that end
# together and an admission's prefixes come out of those buffers; chunks of 8 and single steps, alternated.
#   bash benchmarks/device/issue19_grouped_prefix.sh (carry .gpuB .gpuC .gpuD .gpuE)
source benchmarks/device/common.sh
step synth-q05 40 python3 -m artmlx model synth qwen2.5-0.5b --out /tmp/q05
step agent-turns-grouped 130 python3 benchmarks/agent_turns.py --model /tmp/q05 --groups 16 --rows 128 --cached-only \
  --decode-chunks 1,8 --json $OUT/agent-turns-0.5b-h200-grouped-prefix.json
save_ptx
