# 2026-12-02 (second session) on the H200: where Gemma 3's rollout decode loses (scheduler steps, the engine's
# decode loop, and that loop with lengths known on the host, one process), then the hybrid learner through the
# delta rule's closed form.  bash benchmarks/device/issue19_20_dec02c.sh (carry .gpuB .gpuC .gpuD)
source benchmarks/device/common.sh
step synth-gemma 60 python3 -m artmlx model synth gemma-3-1b --out /tmp/g1
step decode-gemma-256 260 python3 benchmarks/decode_profile.py --model /tmp/g1 --prompt 128 --tokens 64 \
  --repeats 0 --rows 256 --only scheduler --json $OUT/decode-profile-gemma-3-1b-256rows-engine.json
step learner-qwen35 260 python3 -m artmlx bench learner --plain-only --groups 4 --group-size 8 --prompt 256 \
  --reply 256 --model qwen3.5-0.8b --json $OUT/learner-qwen3.5-0.8b.json
