# Issue 20: `artmlx bench learner` on the hybrid, sliding-window and MoE shapes on the H200.
#   bash benchmarks/device/issue20_family_learner.sh (carry .gpuB .gpuC .gpuD)
source benchmarks/device/common.sh
learner="python3 -m artmlx bench learner --groups 4 --group-size 8 --prompt 256 --reply 256"
step learner-qwen35 170 $learner --model qwen3.5-0.8b --json $OUT/learner-qwen3.5-0.8b.json
step learner-gemma 150 $learner --model gemma-3-1b --json $OUT/learner-gemma-3-1b.json
step learner-gptoss 250 $learner --model gpt-oss-20b --json $OUT/learner-gpt-oss-20b.json
