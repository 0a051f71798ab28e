# 2026-12-03, fourth session, on the H200: where chunked decode (8 steps between host reads) stalls with agents.
# The scheduler alone at 128 rows with chunks of 8 (decode_profile), then the 4-turn synthetic agent at 64 agents
# with chunks of 8 after a single-step warm-up, native stack dumps at half and three quarters of each limit.
#   bash benchmarks/device/issue19_chunk_stall.sh (carry .gpuB .gpuC .gpuD)
source benchmarks/device/common.sh
step synth-q05 40 python3 -m artmlx model synth qwen2.5-0.5b --out /tmp/q05
step profile-chunk8 150 python3 benchmarks/decode_profile.py --model /tmp/q05 --prompt 512 --rows 128 --tokens 64 \
  --repeats 1 --only scheduler --decode-chunk 8 --json $OUT/decode-profile-0.5b-128rows-chunk8.json
step agent-turns-chunk8 200 python3 benchmarks/agent_turns.py --model /tmp/q05 --groups 8 --rows 128 --cached-only \
  --decode-chunks 8 --json $OUT/agent-turns-0.5b-h200-chunk8-stall.json
