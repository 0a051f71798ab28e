# Single-device GRPO trainers on mlxrl's published workload (Qwen3-0.6B shape at 4 bits, random weights, G = 4, a
# 19-word prompt, 256-token replies; benchmarks/peer_grpo.py): mlx-lm-lora's `train_grpo`, mlxrl's train loop (each
# completion alone, and with its prefix-cached batched rollout), `artmlx train` and `artmlx run --actors 1`, one
# after another in one invocation; at 1 group a step and at 16 (mlxrl's one-at-a-time rollout left out there: 64
# sequential completions a step). The peers are installed without their needs (offline: from stage_offline.sh's .gpuC).
#   bash benchmarks/device/run.sh peers_qwen3_0.6b
DEVICE_PEERS="mlx-lm-lora inductive-mlxrl" source benchmarks/device/common.sh
step synth-q3 60 python3 -m artmlx model synth qwen3-0.6b --out /tmp/q3
step peers-g1 260 python3 benchmarks/peer_grpo.py --model /tmp/q3 --reply 256 --groups 1 --steps 3 --warmup 1 \
  --json $OUT/peer-grpo-qwen3-0.6b-${GPU}-g1.json
step peers-g16 260 python3 benchmarks/peer_grpo.py --model /tmp/q3 --reply 256 --groups 16 --steps 2 --warmup 1 \
  --only mlx-lm-lora --only mlxrl-prefix --only train --only run --json $OUT/peer-grpo-qwen3-0.6b-${GPU}-g16.json
save_ptx
