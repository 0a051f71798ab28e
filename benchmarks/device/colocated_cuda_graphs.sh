# The 1.5B pipeline workload colocated (`artmlx run --actors 1 --placement colocated`, 3 updates) with MLX's
# CUDA-graph cache made larger (MLX_CUDA_GRAPH_CACHE_SIZE=4000) and with CUDA graphs off (MLX_USE_CUDA_GRAPHS=0). The
# profile of the default run (colocated_profile.sh) found the learner's update spending most of its host time in
# MLX's CUDA-graph bookkeeping (instantiate, exec destroy) beside the actor thread, which shares the process's cache.
#   bash benchmarks/device/run.sh colocated_cuda_graphs
source benchmarks/device/common.sh
[ -d /tmp/q15 ] || step synth-q15 120 python3 -m artmlx model synth qwen2.5-1.5b --out /tmp/q15
for setting in MLX_CUDA_GRAPH_CACHE_SIZE=4000 MLX_USE_CUDA_GRAPHS=0; do
  step colocated-$setting 175 env $setting python3 -m artmlx run --actors 1 --placement colocated --plain \
    --model /tmp/q15 --env synthetic --out /tmp/run-$setting --steps 3 --set eval_every=0 --set checkpoint_every=3 \
    --set max_reply_tokens=64 --set max_turns=2 --set max_episode_tokens=4096 \
    --set "env_args={prompt_tokens = 256, turns = 2, user_tokens = 556}"
  grep "train step" $OUT/log.txt | tail -3
done
