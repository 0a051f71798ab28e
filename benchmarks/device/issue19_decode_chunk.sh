# 2026-12-03 on the H200: the scheduler's chunked decode (8 steps between host reads) against single steps on
# the 4-turn synthetic agent (16 x 8, 128 rows, cached; alternated in one process), then --rollout against --env
# through artmlx run (the scheduler then defaulted to chunks of 8), then artmlx serve --decode-chunk 8 against
# mlx_lm.server with an adapter. Only the serve step gave numbers: the agent steps hit their limits (README).
#   bash benchmarks/device/issue19_decode_chunk.sh (carry .gpuB .gpuC .gpuD)
source benchmarks/device/common.sh
step synth-q05 40 python3 -m artmlx model synth qwen2.5-0.5b --out /tmp/q05
step agent-turns-chunk 150 python3 benchmarks/agent_turns.py --model /tmp/q05 --rows 128 --cached-only \
  --decode-chunks 1,8 --json $OUT/agent-turns-0.5b-h200-decode-chunk.json
step agent-pipeline 210 python3 benchmarks/agent_turns.py --model /tmp/q05 --pipeline-only --steps 3 \
  --json $OUT/agent-pipeline-0.5b-h200-decode-chunk.json
step serve-turns 150 python3 benchmarks/serve_turns.py --model /tmp/q05 --adapter --decode-chunk 8 --workloads 32x1000x1,32x20x4,1x1000x4 \
  --json $OUT/serve-turns-0.5b-h200-adapter-decode-chunk.json
