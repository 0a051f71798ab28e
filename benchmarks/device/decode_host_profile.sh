# Where a decode step's host time goes, 0.5B shape. One row: the scheduler (chunks of 8) against mlx-lm's
# generate_step bare and with the same LoRA layers; then native py-spy profiles (raw collapsed stacks, per thread;
# dev/probes/spy_summary.py condenses them) of artmlx serve's one-conversation workload and of 128 agents (chunks of
# 8); then 128 agents with the fused LoRA product at every row count (ARTMLX_FUSED_LORA_ROWS=512; its default limit
# is 32).
#   bash benchmarks/device/run.sh decode_host_profile
source benchmarks/device/common.sh
step synth-q05 40 python3 -m artmlx model synth qwen2.5-0.5b --out /tmp/q05
step decode-1row 80 python3 dev/probes/decode_profile.py --model /tmp/q05 --rows 1 --repeats 3 --decode-chunk 8 \
  --mlx-lm-adapter --json $OUT/decode-profile-0.5b-1row-chunk8.json
step spy-serve-1conv 90 py-spy record --native --threads --format raw --rate 50 -o $OUT/spy-serve-1conv.txt -- \
  python3 benchmarks/serve_turns.py --model /tmp/q05 --adapter --decode-chunk 8 --artmlx-only --workloads 1x1000x4,1x1000x4
step spy-agents 120 py-spy record --native --threads --format raw --rate 50 -o $OUT/spy-agents-128.txt -- \
  python3 benchmarks/agent_turns.py --model /tmp/q05 --groups 16 --rows 128 --cached-only --decode-chunks 8
ARTMLX_FUSED_LORA_ROWS=512 step agents-fused-all 90 python3 benchmarks/agent_turns.py --model /tmp/q05 --groups 16 \
  --rows 128 --cached-only --decode-chunks 8 --json $OUT/agent-turns-0.5b-${GPU}-fused-lora-512.json
save_ptx
