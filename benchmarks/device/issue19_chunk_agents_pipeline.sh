# 2026-12-03, fourth session, on the H200: chunked decode (8 steps between host reads) against single steps for
# 128 agents of the 4-turn synthetic agent (16 x 8, cached, alternated in one process), then artmlx run --actors 1
# on --env synthetic against --rollout with --set decode_chunk=1 and =8 (one invocation); the PTX MLX compiled
# comes back as ptx.tar.xz (MLX_PTX_CACHE_DIR for later calls).
#   bash benchmarks/device/issue19_chunk_agents_pipeline.sh (carry .gpuB .gpuC .gpuD)
source benchmarks/device/common.sh
step synth-q05 40 python3 -m artmlx model synth qwen2.5-0.5b --out /tmp/q05
step agent-turns-chunks 170 python3 benchmarks/agent_turns.py --model /tmp/q05 --groups 16 --rows 128 --cached-only \
  --decode-chunks 1,8 --json $OUT/agent-turns-0.5b-h200-chunks-1-8.json
step agent-pipeline-chunks 330 python3 benchmarks/agent_turns.py --model /tmp/q05 --pipeline-only --steps 3 \
  --decode-chunks 1,8 --json $OUT/agent-pipeline-0.5b-h200-chunks-1-8.json
tar -cJf $OUT/ptx.tar.xz -C /tmp mlx 2>/dev/null; ls -la $OUT
