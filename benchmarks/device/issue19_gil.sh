# 2026-12-03 on the H200: the agents' thread and the scheduler's under one GIL. Part 1 of agent_turns (16 groups
# x 8 agents, 128 rows, the 4-turn synthetic agent, cached mode) at GIL switch intervals 5 ms (Python's default),
# 1 ms and 0.2 ms, alternated; then --rollout against --env through artmlx run (agents at the new default 0.5 ms).
#   bash benchmarks/device/issue19_gil.sh (carry .gpuB .gpuC .gpuD)
source benchmarks/device/common.sh
step synth-q05 50 python3 -m artmlx model synth qwen2.5-0.5b --out /tmp/q05
step agent-turns-gil 200 python3 benchmarks/agent_turns.py --model /tmp/q05 --rows 128 --cached-only \
  --switch-intervals 0.005,0.001,0.0002 --json $OUT/agent-turns-0.5b-h200-gil.json
step agent-pipeline 320 python3 benchmarks/agent_turns.py --model /tmp/q05 --pipeline-only --steps 3 \
  --json $OUT/agent-pipeline-0.5b-h200-gil.json
