# `artmlx train` on the 1.5B pipeline workload with MLX's defaults (ARTMLX_ARM=defaults only names the arm) against
# CUDA graphs off (MLX_USE_CUDA_GRAPHS=0), 3 updates each (the first left out), one JSON line per arm: is `train`
# itself faster without graphs (to set beside colocated_cuda_graphs.sh)?
#   bash benchmarks/device/run.sh train_cuda_graphs
source benchmarks/device/common.sh
[ -d /tmp/q15 ] || step synth-q15 120 python3 -m artmlx model synth qwen2.5-1.5b --out /tmp/q15
for setting in ARTMLX_ARM=defaults MLX_USE_CUDA_GRAPHS=0; do
  step train-$setting 140 env $setting python3 -m artmlx train --model /tmp/q15 --env synthetic \
    --out /tmp/train-$setting --steps 3 --set eval_every=0 --set checkpoint_every=3 --set max_reply_tokens=64 \
    --set max_turns=2 --set max_episode_tokens=4096 --set "env_args={prompt_tokens = 256, turns = 2, user_tokens = 556}"
  python3 -c "import json, sys; from pathlib import Path; from artmlx.bench.pipeline import summarize
s = summarize(Path('/tmp/train-$setting'), warmup=1); s['setting'] = '$setting'; print(json.dumps(s))" \
    | tee -a $OUT/train-1.5b-graphs.jsonl
done
