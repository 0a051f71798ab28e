# 2026-12-04 (eighth session) on the H200: `artmlx train` on issue 22's 1.5B workload with MLX's defaults against
# CUDA graphs off (MLX_USE_CUDA_GRAPHS=0), 3 updates each (the first left out). The seventh session measured the
# colocated run with graphs off at 19.0 s/update (62.6 GB) against `train`'s 19.61 s with graphs on: is `train`
# itself faster without graphs?
#   bash benchmarks/device/issue22_train_graphs.sh (carry .gpuB .gpuC .gpuD .gpuE)
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
