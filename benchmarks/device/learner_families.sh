# `artmlx bench learner` (4 groups of 8, 256-token prompts and replies) on the hybrid (qwen3.5-0.8b), sliding-window
# (gemma-3-1b) and MoE (gpt-oss-20b) shapes.
#   bash benchmarks/device/run.sh learner_families
source benchmarks/device/common.sh
learner="python3 -m artmlx bench learner --groups 4 --group-size 8 --prompt 256 --reply 256"
step learner-qwen35 170 $learner --model qwen3.5-0.8b --json $OUT/learner-qwen3.5-0.8b.json
step learner-gemma 150 $learner --model gemma-3-1b --json $OUT/learner-gemma-3-1b.json
step learner-gptoss 250 $learner --model gpt-oss-20b --json $OUT/learner-gpt-oss-20b.json
