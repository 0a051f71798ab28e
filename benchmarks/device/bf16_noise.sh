# Is the sampler/learner gap bfloat16 noise? For the qwen2.5-0.5b, gemma-3-1b and qwen3.5-0.8b synth shapes: the
# engine's G = 8 episodes (8 groups, 128-token prompts and replies), the learner's recompute in bfloat16 and in
# float32 (dev/probes/bf16_noise.py). Without the PTX cache each model compiles its kernels first and can use up its
# 150-s limit (BF16_LIMIT sets it); with the cache Gemma took 44 s and Qwen2.5 26 s.
#   bash benchmarks/device/run.sh bf16_noise
source benchmarks/device/common.sh
for arch in qwen2.5-0.5b gemma-3-1b qwen3.5-0.8b; do
  step synth-$arch 60 python3 -m artmlx model synth $arch --out /tmp/$arch
done
for arch in qwen2.5-0.5b gemma-3-1b qwen3.5-0.8b; do
  step bf16-$arch ${BF16_LIMIT:-150} python3 dev/probes/bf16_noise.py --model /tmp/$arch --json $OUT/bf16-noise-$arch.json
done
save_ptx
