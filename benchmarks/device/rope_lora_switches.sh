# Where MLX's fused RoPE launches and agrees with the portable rotation (dev/probes/rope_probe.py), then 128 agents
# (16 x 8, chunks of 8) as they run by default against the fused RoPE in pieces of 127 rows (ARTMLX_ROPE_PIECES=1)
# with the fused LoRA product up to 256 rows (ARTMLX_FUSED_LORA_ROWS=256), each in its own process.
#   bash benchmarks/device/run.sh rope_lora_switches
source benchmarks/device/common.sh
step rope-probe 60 python3 dev/probes/rope_probe.py --json $OUT/rope-probe-${GPU}.json
step synth-q05 40 python3 -m artmlx model synth qwen2.5-0.5b --out /tmp/q05
step agents-default 85 python3 benchmarks/agent_turns.py --model /tmp/q05 --groups 16 --rows 128 --cached-only \
  --decode-chunks 8 --json $OUT/agent-turns-0.5b-${GPU}-default.json
step agents-rope-pieces-lora256 85 env ARTMLX_ROPE_PIECES=1 ARTMLX_FUSED_LORA_ROWS=256 python3 benchmarks/agent_turns.py \
  --model /tmp/q05 --groups 16 --rows 128 --cached-only --decode-chunks 8 \
  --json $OUT/agent-turns-0.5b-${GPU}-rope-pieces-lora256.json
save_ptx
