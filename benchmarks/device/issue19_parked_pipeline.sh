# 2026-12-04 (eighth session) on the H200, with parked rows: `artmlx run --actors 1`, --rollout against --env on the
# 0.5B 4-turn workload (16 x 8, chunks of 8), twice in one call (env, rollout, env, rollout): issue 19's <= 1.15x.
# Without parked rows the same script (issue19_rollout_env_twice.sh) gave 1.45x and 1.27x earlier the same day.
#   bash benchmarks/device/issue19_parked_pipeline.sh (carry .gpuB .gpuC .gpuD .gpuE)
source benchmarks/device/common.sh
[ -d /tmp/q05 ] || step synth-q05 60 python3 -m artmlx model synth qwen2.5-0.5b --out /tmp/q05
for pass in 1 2; do
  step agent-pipeline-$pass 260 python3 benchmarks/agent_turns.py --model /tmp/q05 --pipeline-only --steps 3 \
    --decode-chunks 8 --json $OUT/agent-pipeline-0.5b-h200-parked-pass$pass.json
done
save_ptx
