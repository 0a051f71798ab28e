# One conversation served (1 x 1,000 x 4: a 1,000-word system prompt, then 4 turns; both servers given the same
# nonzero adapter), `artmlx serve` against `mlx_lm.server` through benchmarks/serve_turns.py, three times in one call:
# the run-to-run spread of that ratio. Then the grouped projections' and the fused LoRA kernel's tests on CUDA.
#   bash benchmarks/device/run.sh serve_one_conversation
source benchmarks/device/common.sh
[ -d /tmp/q05 ] || step synth-q05 60 python3 -m artmlx model synth qwen2.5-0.5b --out /tmp/q05
for pass in 1 2 3; do
  step serve-1conv-$pass 90 python3 benchmarks/serve_turns.py --model /tmp/q05 --adapter --workloads 1x1000x4 \
    --json $OUT/serve-turns-0.5b-${GPU}-1conv-pass$pass.json
done
step tests 120 python3 -m pytest -q -p no:cacheprovider tests/model/test_lora_groups.py tests/model/test_lora_kernel.py
save_ptx
