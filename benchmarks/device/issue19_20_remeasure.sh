# Issue 20's Gemma fix and issue 19's one-process agent turns, profiled, on the H200.
#   bash benchmarks/device/issue19_20_remeasure.sh (carry .gpuB .gpuC .gpuD)
source benchmarks/device/common.sh
bench="python3 -m artmlx bench rollout --group-sizes 8 --prompt 128 --reply 128 --sequential 1 --prefill-rows 0"
step rollout-gemma-256 220 $bench --model gemma-3-1b --json $OUT/rollout-gemma-3-1b-256rows.json
step window-attention 60 python3 benchmarks/window_attention.py --json $OUT/window-attention.json
step synth-q05 60 python3 -m artmlx model synth qwen2.5-0.5b --out /tmp/q05
step agent-turns-profiled 170 py-spy record -r 40 --threads -f raw -o $OUT/agent-turns.raw -- \
  python3 benchmarks/agent_turns.py --model /tmp/q05 --json $OUT/agent-turns-0.5b.json
step decode-profile 100 python3 benchmarks/decode_profile.py --model /tmp/q05 --repeats 2 --rows 32 \
  --json $OUT/decode-profile.json
