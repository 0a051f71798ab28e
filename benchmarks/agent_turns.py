"""Multi-turn agents at a real vocabulary: token-exact turns and the prefix cache, side by side in one run.

Part 1 (one process, `--groups` groups of `--group-size` agents of examples/synthetic_agent.py, every
reply appended as text and the conversation resent, through the real openai client on the engine's
scheduler): the same workload three ways on one loaded model,
  - `text`:     the server renders every request's messages again (conversation memory off) and
                prefills every prompt whole (prefix cache off): what artmlx did before;
  - `exact`:    conversation memory on (token-exact prompts), prefix cache off;
  - `cached`:   both on (the default).
For each: groups kept (a group needs all G trajectories), trajectories refused and why, prompt
tokens submitted against tokens prefilled, wall time, decode forwards and the CPU seconds of the
agents' thread (the openai client, HTTP and the API all run there, beside the scheduler's thread,
under one GIL). `--decode-chunks 1,8` repeats `cached` at each number of decode steps the scheduler
queues between two host reads (`Scheduler.decode_chunk`), alternated.

Part 2 (`--pipeline`): `artmlx run --actors 1` on `--env synthetic` against the same workload through
`--rollout examples/synthetic_agent.py:rollout`, seconds per update in the steady state (with `--decode-chunks`,
one `--rollout` run per value, `--set decode_chunk=N`), `--groups` x `--group-size` episodes an update, the
workload's lengths from the SYNTHETIC_* environment variables of examples/synthetic_agent.py.

    python benchmarks/agent_turns.py [--model PATH] [--groups 16 --group-size 8] [--pipeline] --json OUT.json

Without `--model` it builds Qwen2.5's 151,936-token BPE over two small random layers (as the tests do).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def small_synth() -> str:
    from artmlx.model.synth import synthesize

    out = Path(tempfile.gettempdir()) / "artmlx-bench-qwen-small"
    if not (out / "config.json").exists():
        synthesize("qwen2.5-0.5b", out, shape_overrides={"hidden_size": 128, "num_hidden_layers": 2,
                                                         "intermediate_size": 256, "num_attention_heads": 4,
                                                         "num_key_value_heads": 2})
    return str(out)


def play(model: str, groups: int, group_size: int, rows: int, decode_chunks: list[int],
         cached_only: bool = False) -> dict:
    from artmlx.rollout.agent_code import load_rollout
    from artmlx.rollout.agents import MODEL_NAME, AgentRollouts
    from artmlx.serve.model_server import ModelServer, ServeConfig

    rollout = load_rollout(str(ROOT / "examples" / "synthetic_agent.py") + ":rollout")
    server = ModelServer(ServeConfig(model=model, name=MODEL_NAME, max_rows=rows, max_prompt_tokens=16384,
                                     max_tokens=1024))
    rollouts = AgentRollouts(server, rollout, [], temperature=1.0)
    cache, capacity = server.scheduler.prefix, server.conversations.capacity
    results = {}
    rollouts.play(list(range(1000, 1000 + max(1, rows // group_size))), group_size)  # warm-up: compile kernels
    modes = [] if cached_only else [("text", False, False, None), ("exact", True, False, None)]
    modes += [("cached", True, True, None)] if not decode_chunks else \
        [(f"cached,chunk={chunk}#{r}", True, True, chunk) for r in (1, 2) for chunk in decode_chunks]
    default_chunk = server.scheduler.decode_chunk
    for name, exact, cached, chunk in modes:
        server.scheduler.decode_chunk = chunk or default_chunk
        scheduler = server.scheduler
        scheduler.prefix = cache if cached else None
        if cached:
            cache.entries.clear(), cache.index.clear()
            cache.nbytes = 0
        server.conversations.capacity = capacity if exact else 0
        server.conversations._replies.clear()
        before = (scheduler.prompt_tokens, scheduler.prefill_tokens, collections.Counter(rollouts.failures.counts),
                  collections.Counter(scheduler.counts), scheduler.decode_forwards)
        started, cpu_started = time.perf_counter(), time.thread_time()
        kept = []
        for start in range(0, groups, max(1, rows // group_size)):
            seeds = list(range(start, min(groups, start + max(1, rows // group_size))))
            kept += rollouts.play(seeds, group_size)
        wall, agents_cpu = time.perf_counter() - started, time.thread_time() - cpu_started
        refused = rollouts.failures.counts - before[2]
        results[name] = {
            "groups": groups, "groups_kept": len(kept), "groups_kept_frac": len(kept) / groups,
            "trajectories": groups * group_size, "trajectories_refused": sum(refused.values()),
            "refusal_reasons": {reason[:160]: n for reason, n in refused.most_common(3)},
            "prompt_tokens": scheduler.prompt_tokens - before[0], "prefill_tokens": scheduler.prefill_tokens - before[1],
            "wall_s": round(wall, 2), "decode_chunk": server.scheduler.decode_chunk,
            "decode_forwards": scheduler.decode_forwards - before[4], "agents_thread_cpu_s": round(agents_cpu, 2),
            # where the scheduler's thread spent it (admit_s: prefills and joins; decode_s: decode steps, of
            # which sync_s waiting for the device and remember_s keeping finished sequences' KV)
            "scheduler": {k: round(v - before[3].get(k, 0), 3) for k, v in scheduler.counts.items()}}
        results[name]["prefill_frac"] = results[name]["prefill_tokens"] / max(results[name]["prompt_tokens"], 1)
        print(f"{name:7s}: {len(kept)}/{groups} groups kept, {results[name]['trajectories_refused']} trajectories "
              f"refused, prefilled {results[name]['prefill_tokens']:,} of {results[name]['prompt_tokens']:,} prompt "
              f"tokens ({results[name]['prefill_frac']:.1%}), {wall:.1f} s, {results[name]['decode_forwards']} decode "
              f"forwards, agents' thread {agents_cpu:.1f} CPU s", flush=True)
    rollouts.close()
    return results


def pipeline(model: str, steps: int, out: Path, decode_chunks: list[int], settings: list[str]) -> dict:
    from artmlx.bench.pipeline import _launch, _env_setting, summarize

    workload = {"prompt_tokens": int(os.environ.get("SYNTHETIC_PROMPT_TOKENS", "256")),
                "turns": int(os.environ.get("SYNTHETIC_TURNS", "4")),
                "user_tokens": int(os.environ.get("SYNTHETIC_USER_TOKENS", "32"))}
    reply = os.environ.get("SYNTHETIC_MAX_TOKENS", "64")
    common = ["run", "--actors", "1", "--plain", "--model", model, "--env", "synthetic", "--steps", str(steps),
              "--set", "eval_every=0", "--set", f"checkpoint_every={steps}", "--set", f"max_reply_tokens={reply}",
              "--set", _env_setting(workload), "--set", "actor_groups_per_batch=16",
              *[item for setting in settings for item in ("--set", setting)]]
    results = {}
    agent = ["--rollout", str(ROOT / "examples/synthetic_agent.py") + ":rollout"]
    runs = [("env", [])] + ([("rollout", agent)] if not decode_chunks else
                            [(f"rollout,chunk={chunk}", [*agent, "--set", f"decode_chunk={chunk}"]) for chunk in decode_chunks])
    for name, extra in runs:
        run_dir = out / name
        wall = _launch([*common, "--out", str(run_dir), *extra], out / f"{name}.log")
        results[name] = {"wall_s": wall, **summarize(run_dir, warmup=1)}
        final = next(json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                     if json.loads(line).get("final"))
        results[name]["final"] = {k: final.get(k) for k in ("groups_trained", "groups_stale", "rollouts_played",
                                                             "trajectories_refused", "groups_dropped",
                                                             "prompt_tokens", "prefill_tokens")}
        print(f"{name}: {results[name]['seconds_per_update']:.2f} s/update, {results[name]['final']}", flush=True)
    for name, _ in runs[1:]:
        ratio = results[name]["seconds_per_update"] / results["env"]["seconds_per_update"]
        results[name.replace("rollout", "rollout_over_env")] = ratio
        print(f"--rollout ({name}) / --env time per update: {ratio:.2f}x", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="")
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--rows", type=int, default=64, help="requests decoded together")
    parser.add_argument("--pipeline", action="store_true")
    parser.add_argument("--pipeline-only", action="store_true", help="Part 2 alone.")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--decode-chunks", default="",
                        help="comma-separated Scheduler.decode_chunk values for `cached` and for the pipeline's --rollout runs")
    parser.add_argument("--cached-only", action="store_true", help="Part 1 without the text and exact modes")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="Part 2: a run setting for both runs (`--groups`/`--group-size` are passed as theirs).")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    model = args.model or small_synth()
    report = {"command": shlex.join(sys.argv), "model": model,
              "workload": {k: os.environ.get(k) for k in ("SYNTHETIC_PROMPT_TOKENS", "SYNTHETIC_TURNS",
                                                          "SYNTHETIC_USER_TOKENS", "SYNTHETIC_MAX_TOKENS")},
              "turns": None if args.pipeline_only else play(model, args.groups, args.group_size, args.rows,
                                                              [int(x) for x in args.decode_chunks.split(",") if x],
                                                              args.cached_only)}
    if args.pipeline or args.pipeline_only:
        report["pipeline"] = pipeline(model, args.steps, Path(tempfile.mkdtemp(prefix="agent-turns-")),
                                      [int(x) for x in args.decode_chunks.split(",") if x],
                                      [f"groups_per_step={args.groups}", f"group_size={args.group_size}", *args.set])
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
