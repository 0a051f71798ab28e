# 2026-12-03 on the H200, second call: the scheduler's chunked decode against single steps on the 4-turn synthetic
# agent at 128 rows (8 groups x 8, cached mode, alternated in one process); the first call's 16-group run did not
# finish in its 150 s.   bash benchmarks/device/issue19_decode_chunk_agents.sh (carry .gpuB .gpuC .gpuD)
source benchmarks/device/common.sh
step synth-q05 40 python3 -m artmlx model synth qwen2.5-0.5b --out /tmp/q05
step agent-turns-chunk 170 python3 benchmarks/agent_turns.py --model /tmp/q05 --groups 8 --rows 128 --cached-only \
  --decode-chunks 1,8 --json $OUT/agent-turns-0.5b-h200-decode-chunk-8groups.json
