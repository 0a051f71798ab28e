# Where `artmlx run --actors 1 --rollout` spends the seconds per update it takes beyond `--env` on the 0.5B 4-turn
# workload (16 x 8, chunks of 8): both runs of agent_turns.py's pipeline part under `py-spy record --threads --native
# --subprocesses`; dev/probes/spy_summary.py condenses the profile per process and thread.
#   bash benchmarks/device/run.sh pipeline_profile
source benchmarks/device/common.sh
[ -d /tmp/q05 ] || step synth-q05 60 python3 -m artmlx model synth qwen2.5-0.5b --out /tmp/q05
step pipeline-profiled 400 py-spy record -r 20 --threads --native --subprocesses -f raw -o $OUT/pipeline-0.5b.raw -- \
  python3 benchmarks/agent_turns.py --model /tmp/q05 --pipeline-only --steps 3 --decode-chunks 8 \
  --json $OUT/agent-pipeline-0.5b-${GPU}-profiled.json
xz -9 $OUT/pipeline-0.5b.raw
save_ptx
