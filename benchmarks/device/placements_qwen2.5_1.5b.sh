# The 1.5B pipeline workload (qwen2.5-1.5b; a 256-token prompt, 2 replies of 64 tokens with 556-token environment
# answers between them): `train`, `run --actors 1` as processes and `run --actors 1 --placement colocated`, in one
# invocation of `artmlx bench pipeline` (4 updates each, the first left out).
#   bash benchmarks/device/run.sh placements_qwen2.5_1.5b
source benchmarks/device/common.sh
step pipeline-1.5b 540 python3 -m artmlx bench pipeline --model qwen2.5-1.5b --env-arg prompt_tokens=256 \
  --env-arg turns=2 --env-arg user_tokens=556 --set max_reply_tokens=64 --set max_turns=2 \
  --set max_episode_tokens=4096 --actors 1 --colocated --steps 4 --json $OUT/pipeline-1.5b-three-placements.json
save_ptx
