# For the next H200 session (written 2026-12-02, not run yet): issue 22's colocated placement against `train`
# and actor processes on the issue's two workloads, then issue 20's Gemma 3 `bench rollout` side by side (its
# first 256-row call compiles kernels for minutes on a fresh machine: give it the time).
#   bash benchmarks/device/issue20_22_next.sh (carry .gpuB .gpuC .gpuD)
source benchmarks/device/common.sh
step pipeline-1.5b 580 python3 -m artmlx bench pipeline --model qwen2.5-1.5b --env-arg prompt_tokens=256 \
  --env-arg turns=2 --env-arg user_tokens=556 --set max_reply_tokens=64 --set max_turns=2 \
  --set max_episode_tokens=4096 --actors 1 --colocated --steps 5 --json $OUT/pipeline-1.5b-colocated.json
# a second call:
# step pipeline-0.5b-4turn 580 python3 -m artmlx bench pipeline --model qwen2.5-0.5b --env-arg prompt_tokens=256 \
#   --env-arg turns=4 --env-arg user_tokens=32 --set max_reply_tokens=64 --set max_turns=4 --actors 1 --colocated \
#   --steps 5 --json $OUT/pipeline-0.5b-4turn-colocated.json
# step rollout-gemma-256 580 python3 -m artmlx bench rollout --group-sizes 8 --prompt 128 --reply 128 --sequential 1 \
#   --prefill-rows 0 --model gemma-3-1b --json $OUT/rollout-gemma-3-1b-256rows-warm.json
