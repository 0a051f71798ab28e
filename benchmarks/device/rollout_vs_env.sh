# `artmlx run --actors 1`, --rollout against --env on the 0.5B 4-turn workload (16 x 8, chunks of 8), twice in one
# call (env, rollout, env, rollout): seconds per update of each and the run-to-run spread of their ratio. TAG, if
# set, is added to the result files' names.
#   bash benchmarks/device/run.sh rollout_vs_env
source benchmarks/device/common.sh
[ -d /tmp/q05 ] || step synth-q05 60 python3 -m artmlx model synth qwen2.5-0.5b --out /tmp/q05
for pass in 1 2; do
  step agent-pipeline-$pass 250 python3 benchmarks/agent_turns.py --model /tmp/q05 --pipeline-only --steps 3 \
    --decode-chunks 8 --json $OUT/agent-pipeline-0.5b-${GPU}${TAG}-pass$pass.json
done
save_ptx
