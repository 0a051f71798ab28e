# Chunked decode (the scheduler queues 8 decode steps between two host reads) against single steps, 0.5B shape:
# 128 agents of the 4-turn synthetic agent (16 groups x 8, prefix cache on, the two alternated in one process), then
# `artmlx run --actors 1` on --env synthetic against --rollout with --set decode_chunk=1 and =8 (one invocation).
# On a fresh machine (no PTX cache yet) kernel compilation can use up the limits.
#   bash benchmarks/device/run.sh decode_chunks
source benchmarks/device/common.sh
step synth-q05 40 python3 -m artmlx model synth qwen2.5-0.5b --out /tmp/q05
step agent-turns-chunks 170 python3 benchmarks/agent_turns.py --model /tmp/q05 --groups 16 --rows 128 --cached-only \
  --decode-chunks 1,8 --json $OUT/agent-turns-0.5b-${GPU}-chunks-1-8.json
step agent-pipeline-chunks 330 python3 benchmarks/agent_turns.py --model /tmp/q05 --pipeline-only --steps 3 \
  --decode-chunks 1,8 --json $OUT/agent-pipeline-0.5b-${GPU}-chunks-1-8.json
save_ptx
