# 2026-12-04 on the H200: is Gemma's sampler/learner gap bfloat16 noise? For each family's synth shape, the engine's
# G = 8 episodes (8 groups, 128-token prompts and replies), the learner's recompute in bfloat16 and in float32
# (benchmarks/bf16_noise.py).  bash benchmarks/device/issue20_bf16_noise.sh (carry .gpuB .gpuC .gpuD .gpuE)
# On a machine without the PTX cache each model compiles its kernels first: every 150-s limit ran out in the first
# call; the next call, warm, finished Gemma in 44 s and Qwen2.5 in 26 s (Qwen3.5 was not run again).
source benchmarks/device/common.sh
for arch in qwen2.5-0.5b gemma-3-1b qwen3.5-0.8b; do
  step synth-$arch 60 python3 -m artmlx model synth $arch --out /tmp/$arch
done
for arch in qwen2.5-0.5b gemma-3-1b qwen3.5-0.8b; do
  step bf16-$arch ${BF16_LIMIT:-150} python3 benchmarks/bf16_noise.py --model /tmp/$arch --json $OUT/bf16-noise-$arch.json
done
save_ptx
