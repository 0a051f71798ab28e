# 2026-12-03, fourth session, on the H200, with the PTX the earlier calls compiled (.gpuE): keeping 128 finished
# sequences and admitting their next turns row by row against together (benchmarks/prefix_ops.py, side by side),
# then 128 agents of the 4-turn synthetic agent (16 x 8, cached, chunks of 8) with the grouped prefix cache, and
# artmlx run --actors 1 on --env synthetic against --rollout with chunks of 8 (one invocation).
#   bash benchmarks/device/issue19_grouped_prefix.sh (carry .gpuB .gpuC .gpuD .gpuE)
source benchmarks/device/common.sh
step prefix-ops 50 python3 benchmarks/prefix_ops.py --rows 128 --json $OUT/prefix-ops-h200.json
step synth-q05 40 python3 -m artmlx model synth qwen2.5-0.5b --out /tmp/q05
step agent-turns-grouped 90 python3 benchmarks/agent_turns.py --model /tmp/q05 --groups 16 --rows 128 --cached-only \
  --decode-chunks 8 --json $OUT/agent-turns-0.5b-h200-grouped-prefix.json
step agent-pipeline-grouped 250 python3 benchmarks/agent_turns.py --model /tmp/q05 --pipeline-only --steps 3 \
  --decode-chunks 8 --json $OUT/agent-pipeline-0.5b-h200-grouped-prefix.json
save_ptx
