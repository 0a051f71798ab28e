# 2026-12-02 (second session) on the H200: the scheduler's decode step against the rollout engine's at the
# agent workload's rows (issue 19: agent turns decode at a third of the env path's tokens/s), and Gemma 3's
# `bench rollout` at 256 rows with window layers given no mask (issue 20).
#   bash benchmarks/device/issue19_20_dec02b.sh (carry .gpuB .gpuC .gpuD)
source benchmarks/device/common.sh
step synth-q05 60 python3 -m artmlx model synth qwen2.5-0.5b --out /tmp/q05
step decode-q05-128 170 python3 benchmarks/decode_profile.py --model /tmp/q05 --prompt 512 --tokens 64 \
  --repeats 1 --rows 128 --only scheduler --json $OUT/decode-profile-0.5b-128rows.json
bench="python3 -m artmlx bench rollout --group-sizes 8 --prompt 128 --reply 128 --sequential 1 --prefill-rows 0"
step rollout-gemma-256 300 $bench --model gemma-3-1b --json $OUT/rollout-gemma-3-1b-256rows.json
