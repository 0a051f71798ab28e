# 2026-12-03, fourth session, on the H200, with the PTX the earlier calls compiled (.gpuE): chunked decode against
# single steps for 128 agents (16 x 8, 4-turn synthetic agent, cached, alternated), then artmlx run --actors 1 on
# --env synthetic against --rollout with --set decode_chunk=8 (one invocation).
#   bash benchmarks/device/issue19_chunk_pipeline.sh (carry .gpuB .gpuC .gpuD .gpuE)
source benchmarks/device/common.sh
step synth-q05 40 python3 -m artmlx model synth qwen2.5-0.5b --out /tmp/q05
step agent-turns-chunks 120 python3 benchmarks/agent_turns.py --model /tmp/q05 --groups 16 --rows 128 --cached-only \
  --decode-chunks 1,8 --json $OUT/agent-turns-0.5b-h200-chunks-1-8.json
step agent-pipeline-chunk8 250 python3 benchmarks/agent_turns.py --model /tmp/q05 --pipeline-only --steps 3 \
  --decode-chunks 8 --json $OUT/agent-pipeline-0.5b-h200-chunk8.json
save_ptx
