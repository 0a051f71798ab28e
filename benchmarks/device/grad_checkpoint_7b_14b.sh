# Gradient checkpointing on and off (benchmarks/grad_checkpoint.py): the learner at the 7B (qwen2.5-7b) and 14B
# (qwen3-14b) shapes with 4,096-token episodes (a 256-token prompt, a 3,840-token reply) under a 32 GB budget, peak
# memory and seconds.
#   bash benchmarks/device/run.sh grad_checkpoint_7b_14b
source benchmarks/device/common.sh
gc="python3 benchmarks/grad_checkpoint.py --groups 1 --group-size 2 --prompt 256 --reply 3840 --budget-gb 32 --settings on,off"
step learner-7b 250 $gc --arch qwen2.5-7b --json $OUT/grad-checkpoint-7b-4096.json
step learner-14b 320 $gc --arch qwen3-14b --json $OUT/grad-checkpoint-14b-4096.json
