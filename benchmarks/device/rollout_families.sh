# Where the hybrid's (qwen3.5-0.8b) prefill goes, one part at a time (dev/probes/hybrid_probe.py: the delta rule, the
# convolution, mlx-lm's forward, the engine's prefill), then `artmlx bench rollout`, the engine against
# mlx_lm.batch_generate at G = 8 and 64 rows, on the sliding-window (gemma-3-1b) and MoE (gpt-oss-20b) shapes.
#   bash benchmarks/device/run.sh rollout_families
source benchmarks/device/common.sh
probe="python3 dev/probes/hybrid_probe.py --arch qwen3.5-0.8b --rows 8 --tokens 128 --repeats 2"
step probe-delta 60 $probe --parts delta
step probe-conv 60 $probe --parts conv
step probe-mlxlm 90 $probe --parts mlx_lm
step probe-engine 100 $probe --parts engine
bench="python3 -m artmlx bench rollout --group-sizes 8 --prompt 128 --reply 128 --rows 64 --sequential 1 --prefill-rows 0"
step rollout-gemma 120 $bench --model gemma-3-1b --json $OUT/rollout-gemma-3-1b.json
step rollout-gptoss 150 $bench --model gpt-oss-20b --json $OUT/rollout-gpt-oss-20b.json
