# Sibling projections grouped (q/k/v and gate/up as one product and one LoRA term, model/lora_groups.py,
# ARTMLX_LORA_GROUPS=1) against each alone (ARTMLX_LORA_GROUPS=0), 0.5B shape, each arm in its own process: one
# conversation served (1 x 1,000 x 4) against mlx_lm.server, and 128 agents (16 x 8, chunks of 8); then their tests
# on CUDA (TEST_LIMIT sets that step's limit).
#   bash benchmarks/device/run.sh lora_groups
source benchmarks/device/common.sh
[ -d /tmp/qwen2.5-0.5b ] || step synth-q05 60 python3 -m artmlx model synth qwen2.5-0.5b --out /tmp/qwen2.5-0.5b
for groups in 1 0; do
  step serve-1conv-groups-$groups 80 env ARTMLX_LORA_GROUPS=$groups python3 benchmarks/serve_turns.py \
    --model /tmp/qwen2.5-0.5b --adapter --workloads 1x1000x4 --json $OUT/serve-turns-0.5b-${GPU}-1conv-groups-$groups.json
done
for groups in 1 0; do
  step agents-groups-$groups 85 env ARTMLX_LORA_GROUPS=$groups python3 benchmarks/agent_turns.py --model /tmp/qwen2.5-0.5b \
    --groups 16 --rows 128 --cached-only --decode-chunks 8 --json $OUT/agent-turns-0.5b-${GPU}-groups-$groups.json
done
step tests ${TEST_LIMIT:-120} python3 -m pytest -q -p no:cacheprovider tests/model/test_lora_groups.py tests/model/test_lora_kernel.py
save_ptx
