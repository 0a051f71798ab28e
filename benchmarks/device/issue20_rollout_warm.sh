# 2026-12-02 (second session) on the H200: `bench rollout` on the sliding-window and hybrid shapes again, now that
# its warm-up runs both batched methods at the measured batch shapes (kernel compilation had been paid by the
# engine, which runs first).  bash benchmarks/device/issue20_rollout_warm.sh (carry .gpuB .gpuC .gpuD)
source benchmarks/device/common.sh
bench="python3 -m artmlx bench rollout --group-sizes 8 --prompt 128 --reply 128 --sequential 1 --prefill-rows 0"
step rollout-gemma-256 250 $bench --model gemma-3-1b --json $OUT/rollout-gemma-3-1b-256rows-warm.json
step rollout-qwen35-256 250 $bench --model qwen3.5-0.8b --json $OUT/rollout-qwen3.5-0.8b-256rows-warm.json
