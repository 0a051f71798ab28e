# Single-device GRPO trainers on mlxrl's published workload (Qwen3-0.6B shape at 4 bits, random weights, G = 4, a
# 19-word prompt, 256-token replies; benchmarks/peer_grpo.py): mlx-lm-lora's `train_grpo`, mlxrl's train loop (each
# completion alone, and with its prefix-cached batched rollout), `artmlx train` and `artmlx run --actors 1`, one
# after another in one invocation; at 1 group a step and at 16 (mlxrl's one-at-a-time rollout left out there: 64
# sequential completions a step). The peers are installed without their needs (offline: from stage_offline.sh's .gpuC).
# On an H100 one group size fills most of a 10-minute call (the peers take 20 s a step there): PEERS_GROUPS picks
# them (default "1 16").
#   bash benchmarks/device/run.sh peers_qwen3_0.6b
#   PEERS_GROUPS=16 bash benchmarks/device/run.sh peers_qwen3_0.6b
DEVICE_PEERS="mlx-lm-lora inductive-mlxrl" source benchmarks/device/common.sh
step synth-q3 60 python3 -m artmlx model synth qwen3-0.6b --out /tmp/q3
for groups in ${PEERS_GROUPS:-1 16}; do
  case $groups in
    1) step peers-g1 420 python3 benchmarks/peer_grpo.py --model /tmp/q3 --reply 256 --groups 1 --steps 3 --warmup 1 \
         --json $OUT/peer-grpo-qwen3-0.6b-${GPU}-g1.json ;;
    16) step peers-g16 420 python3 benchmarks/peer_grpo.py --model /tmp/q3 --reply 256 --groups 16 --steps 2 \
          --warmup 1 --only mlx-lm-lora --only mlxrl-prefix --only train --only run \
          --json $OUT/peer-grpo-qwen3-0.6b-${GPU}-g16.json ;;
    *) echo "PEERS_GROUPS takes 1 and 16, not $groups" >&2; exit 2 ;;
  esac
done
save_ptx
