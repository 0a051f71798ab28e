# The fixes of 2026-12-02 on the H200: the hybrid learner (chunked recurrence and its memory plan), Gemma 3's
# decode at 256 rows (where its step time goes), and the agent turns with the prefix cache's copies queued.
#   bash benchmarks/device/issue19_20_fixes.sh (carry .gpuB .gpuC .gpuD)
source benchmarks/device/common.sh
step learner-qwen35 180 python3 -m artmlx bench learner --plain-only --groups 4 --group-size 8 --prompt 256 \
  --reply 256 --model qwen3.5-0.8b --json $OUT/learner-qwen3.5-0.8b.json
step synth-gemma 60 python3 -m artmlx model synth gemma-3-1b --out /tmp/g1
step decode-gemma-256 100 python3 benchmarks/decode_profile.py --model /tmp/g1 --prompt 128 --tokens 32 \
  --repeats 1 --rows 256 --only scheduler --json $OUT/decode-profile-gemma-256.json
step decode-gemma-256-array-masks 90 python3 benchmarks/decode_profile.py --array-masks --model /tmp/g1 --prompt 128 --tokens 32 \
  --repeats 1 --rows 256 --only scheduler --json $OUT/decode-profile-gemma-256-array-masks.json
step synth-q05 60 python3 -m artmlx model synth qwen2.5-0.5b --out /tmp/q05
step agent-turns 150 python3 benchmarks/agent_turns.py --model /tmp/q05 --json $OUT/agent-turns-0.5b.json
