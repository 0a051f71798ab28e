# Where the colocated learner's update goes beside its actor thread on the 1.5B pipeline workload: `artmlx run
# --placement colocated` (4 updates) under `py-spy record --threads --native --subprocesses` (dev/probes/spy_summary.py
# condenses it per thread).
#   bash benchmarks/device/run.sh colocated_profile
source benchmarks/device/common.sh
step synth-q15 120 python3 -m artmlx model synth qwen2.5-1.5b --out /tmp/q15
step colocated-profiled 330 py-spy record -r 20 --threads --native --subprocesses -f raw -o $OUT/colocated-1.5b.raw -- \
  python3 -m artmlx run --actors 1 --placement colocated --plain --model /tmp/q15 --env synthetic --out /tmp/runc \
  --steps 4 --set eval_every=0 --set checkpoint_every=4 --set max_reply_tokens=64 --set max_turns=2 \
  --set max_episode_tokens=4096 --set "env_args={prompt_tokens = 256, turns = 2, user_tokens = 556}"
grep -h "train step" /tmp/runc/*.log $OUT/log.txt 2>/dev/null | tail -5
xz -9 $OUT/colocated-1.5b.raw
