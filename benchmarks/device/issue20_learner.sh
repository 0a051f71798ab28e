# Issue 20 on the H200: the learner at the 7B and 14B shapes with 4,096-token episodes under a 32 GB budget,
# checkpointed and not (peaks and seconds).  bash benchmarks/device/issue20_learner.sh (carry .gpuB .gpuC .gpuD)
source benchmarks/device/common.sh
gc="python3 benchmarks/grad_checkpoint.py --groups 1 --group-size 2 --prompt 256 --reply 3840 --budget-gb 32 --settings on,off"
step learner-7b 250 $gc --arch qwen2.5-7b --json $OUT/grad-checkpoint-7b-4096.json
step learner-14b 320 $gc --arch qwen3-14b --json $OUT/grad-checkpoint-14b-4096.json
