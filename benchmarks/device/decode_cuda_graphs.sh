# MLX's CUDA-graph switches against a decode step's host time, 0.5B shape: 128 agents (16 x 8, chunks of 8) and one
# row (dev/probes/decode_profile.py) under MLX_MAX_OPS_PER_BUFFER=1000 (MLX's default on an H100/H200 is 100),
# MLX_USE_CUDA_GRAPHS=0, and MLX_MAX_OPS_PER_BUFFER=1000 with MLX_CUDA_GRAPH_CACHE_SIZE=4000, each in its own process
# (MLX reads them once). First the fused LoRA kernel against mlx-lm's LoRA product (cases from its tests).
#   bash benchmarks/device/run.sh decode_cuda_graphs
source benchmarks/device/common.sh
# the fused LoRA kernel (layer sizes read at run time) against mlx-lm's LoRA product, its tests' cases
step lora-kernel 120 python3 -c "
import sys; sys.path.insert(0, 'tests/model')
import types; sys.modules.setdefault('pytest', types.SimpleNamespace(mark=types.SimpleNamespace(
    skipif=lambda *a, **k: (lambda f: f), parametrize=lambda *a, **k: (lambda f: f))))
import test_lora_kernel as t
for case in [(1, 896, 896, 16), (7, 896, 128, 8), (32, 896, 4864, 16), (32, 4864, 896, 64), (3, 1536, 256, 1), (128, 896, 4864, 16)]:
    t.test_kernel_equals_mlx_lm_lora_up_to_bfloat16_rounding(*case); print('ok', case)
t.test_fused_layer_uses_the_kernel_only_inside_inference(); print('ok inside inference')
"
step synth-q05 40 python3 -m artmlx model synth qwen2.5-0.5b --out /tmp/q05
for setting in MLX_MAX_OPS_PER_BUFFER=1000 MLX_USE_CUDA_GRAPHS=0 "MLX_MAX_OPS_PER_BUFFER=1000 MLX_CUDA_GRAPH_CACHE_SIZE=4000"; do
  tag=$(echo $setting | tr ' =' '_-')
  step "agents $setting" 90 env $setting python3 benchmarks/agent_turns.py --model /tmp/q05 --groups 16 --rows 128 \
    --cached-only --decode-chunks 8 --json $OUT/agent-turns-0.5b-${GPU}-$tag.json
  step "1row $setting" 60 env $setting python3 dev/probes/decode_profile.py --model /tmp/q05 --rows 1 --repeats 2 \
    --decode-chunk 8 --only scheduler --json $OUT/decode-profile-0.5b-1row-$tag.json
done
save_ptx
