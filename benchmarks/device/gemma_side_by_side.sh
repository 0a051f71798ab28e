# Gemma 3 1B's `bench rollout` side by side with mlx_lm.batch_generate at G = 8 and the memory rule's 256 rows, in
# one call long enough for both methods' first-call kernel compilation (on a fresh machine the warm-up alone took
# over 250 s).
#   bash benchmarks/device/run.sh gemma_side_by_side
source benchmarks/device/common.sh
bench="python3 -m artmlx bench rollout --group-sizes 8 --prompt 128 --reply 128 --sequential 1 --prefill-rows 0"
step rollout-gemma-256 540 $bench --model gemma-3-1b --json $OUT/rollout-gemma-3-1b-256rows-side-by-side.json
