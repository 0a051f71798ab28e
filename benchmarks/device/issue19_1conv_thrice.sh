# 2026-12-04 (seventh session) on the H200: one conversation served (1 x 1,000 x 4, both servers with the same nonzero
# adapter), artmlx serve against mlx_lm.server, three times in one call (the run-to-run spread that issue 19's >= 1x
# target sits in); then the grouped projections' CUDA tests (corrected after the last call, not run since).
#   bash benchmarks/device/issue19_1conv_thrice.sh (carry .gpuB .gpuC .gpuD .gpuE)
source benchmarks/device/common.sh
[ -d /tmp/q05 ] || step synth-q05 60 python3 -m artmlx model synth qwen2.5-0.5b --out /tmp/q05
for pass in 1 2 3; do
  step serve-1conv-$pass 90 python3 benchmarks/serve_turns.py --model /tmp/q05 --adapter --workloads 1x1000x4 \
    --json $OUT/serve-turns-0.5b-h200-1conv-pass$pass.json
done
step tests 120 python3 -m pytest -q -p no:cacheprovider tests/model/test_lora_groups.py tests/model/test_lora_kernel.py
save_ptx
