# Parked rows (a finished request's row stays in the batch's cache and its conversation's next turn is prefilled into
# it in place) against finished rows leaving for the prefix cache at once, in one process, each arm twice,
# alternated (128 agents of the 4-turn synthetic agent, 16 x 8, chunks of 8): park=0 (rows leave), park=64 (in place
# when 3/4 of the forward's tokens are new turns), park=64:0 (always in place); then one conversation served
# (1 x 1,000 x 4) against `mlx_lm.server`, twice (SERVE=four: the four serving workloads once instead). ARMS and
# SERVE select what runs.
# Parked rows were taken out of the scheduler afterwards (benchmarks/RESULTS.md): this script needs the code of
# commit f5a1a0f or fae8823, where `agent_turns.py --park-forwards` exists.
#   bash benchmarks/device/parked_rows.sh (carry .gpuB .gpuC .gpuD .gpuE)
source benchmarks/device/common.sh
[ -d /tmp/q05 ] || step synth-q05 60 python3 -m artmlx model synth qwen2.5-0.5b --out /tmp/q05
ARMS=${ARMS:-0,64,64:0} SERVE=${SERVE:-1conv}
step agent-turns-park 300 python3 benchmarks/agent_turns.py --model /tmp/q05 --groups 16 --rows 128 --cached-only \
  --park-forwards $ARMS --json $OUT/agent-turns-0.5b-h200-park-${ARMS//[,:]/_}.json
if [ "$SERVE" = four ]; then
  step serve-four 200 python3 benchmarks/serve_turns.py --model /tmp/q05 --adapter --json $OUT/serve-turns-0.5b-h200-park.json
else
  for pass in 1 2; do
    step serve-1conv-$pass 90 python3 benchmarks/serve_turns.py --model /tmp/q05 --adapter --workloads 1x1000x4 \
      --json $OUT/serve-turns-0.5b-h200-park-1conv-pass$pass.json
  done
fi
save_ptx
