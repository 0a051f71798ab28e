"""Multi-turn chat serving: `artmlx serve` against `mlx_lm.server`, side by side, on agent-shaped workloads.

    python benchmarks/serve_turns.py --model FOLDER [--workloads 32x1000x4,32x1000x1,32x20x4,1x1000x4] [--json FILE]

A workload CxSxT is C concurrent conversations, each with the same system prompt of S random
three-letter words (one token each on `artmlx model synth` tokenizers), then T turns of a 32-word
user message and a reply of `--max-tokens` tokens; each turn resends the whole conversation with
the previous replies as text (what an agent does). Throughput is completion tokens per wall second
through the real `openai` client on loopback, each server a process of its own as its users run it
(`--in-process` runs artmlx's in this one instead, to read its scheduler's counts), with the median
time of each turn's request. A random-weight model almost never ends a reply, so
every reply runs to `--max-tokens` on both servers. Each server gets a warm-up pass first.

`--adapter` gives both servers the same trained-looking LoRA adapter (random, nonzero; mlx-lm's format,
`mlx_lm.server --adapter-path`): what serving a policy under training costs. Without it artmlx serves
its fresh (zero) adapter through the LoRA layers while mlx_lm.server runs the bare base.
"""

from __future__ import annotations

import argparse
import json
import random
import string
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from artmlx.model.tiny import resolve_model  # noqa: E402
from artmlx.netutil import free_port  # noqa: E402
from artmlx.serve import run_server  # noqa: E402
from artmlx.serve.model_server import ModelServer, ServeConfig  # noqa: E402


def words(rng: random.Random, count: int) -> str:
    return " ".join("".join(rng.choice(string.ascii_lowercase) for _ in range(3)) for _ in range(count))


def conversations(client: openai.OpenAI, model: str, count: int, system: int, turns: int, max_tokens: int,
                  seed: int) -> dict:
    shared = words(random.Random(seed), system)
    tokens = [0] * count
    turn_seconds = [[] for _ in range(turns)]  # each turn's request time, over the conversations

    def talk(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        messages = [{"role": "system", "content": shared}]
        for _ in range(turns):
            messages.append({"role": "user", "content": words(rng, 32)})
            asked = time.perf_counter()
            reply = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                                   temperature=1.0)
            turn_seconds[len(messages) // 2 - 1].append(time.perf_counter() - asked)
            tokens[i] += reply.usage.completion_tokens
            messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})

    started = time.perf_counter()
    threads = [threading.Thread(target=talk, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    return {"seconds": round(seconds, 2), "completion_tokens": sum(tokens), "tokens_per_s": sum(tokens) / seconds,
            "turn_seconds_median": [round(float(np.median(t)), 4) for t in turn_seconds]}


def run_workloads(client, model: str, workloads, max_tokens: int) -> dict:
    # Warm-up: every workload once with other text, unmeasured. On MLX's CUDA backend each new kernel shape
    # is compiled on first use and cached on disk for later processes: without this the first server
    # measured pays for both (measured: artmlx 188 tok/s on a fresh H200 against 1,004 warm, 32x1000x4).
    for count, system, turns in workloads:
        conversations(client, model, count, system, turns, max_tokens, seed=2)
    out = {}
    for count, system, turns in workloads:
        out[f"{count}x{system}x{turns}"] = conversations(client, model, count, system, turns, max_tokens, seed=1)
        print(f"  {count}x{system}x{turns}: {out[f'{count}x{system}x{turns}']}", flush=True)
    return out


def write_adapter(model: str, folder: Path) -> Path:
    """A LoRA adapter of artmlx's default layout with random, nonzero A and B (a policy after training)."""
    import mlx.core as mx

    from artmlx.config import TrainConfig
    from artmlx.model.policy import LoraSpec, adapter_weights, load_policy, save_adapters, set_adapter_weights

    spec = LoraSpec.from_config(TrainConfig())
    policy, _, _ = load_policy(model, spec)
    weights = {name: mx.random.normal(v.shape, key=mx.random.key(i)).astype(v.dtype) * 0.01
               for i, (name, v) in enumerate(sorted(adapter_weights(policy).items()))}
    set_adapter_weights(policy, weights)
    save_adapters(policy, folder, spec, model)
    return folder


def wait_up(port: int, process: subprocess.Popen | None = None, log: Path | None = None) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited ({process.returncode}): {log.read_text()[-2000:] if log else ''}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("the server did not come up")


def as_process(command: list[str], label: str, model: str, workloads, max_tokens: int) -> dict:
    """The workloads against a server started as its own process (as a user runs it) on a free port."""
    port, log = free_port(), Path(tempfile.mkdtemp()) / "server.log"
    with log.open("w") as out:
        process = subprocess.Popen([*command, "--port", str(port)], stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_up(port, process, log)
        print(label, flush=True)
        return run_workloads(openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", timeout=3600),
                             model, workloads, max_tokens)
    finally:
        process.terminate()
        process.wait(30)


def in_process(args, adapter, rows: int, workloads, report: dict) -> dict:
    """artmlx's server in this process (its scheduler's counts are then read into `report`); the clients'
    threads share the interpreter with it, which a server of its own does not."""
    server = ModelServer(ServeConfig(model=args.model, adapters=str(adapter or ""), max_rows=rows,
                                     max_tokens=args.max_tokens, max_prompt_tokens=16384,
                                     prefix_cache_mb=args.prefix_cache_mb, decode_chunk=args.decode_chunk))
    port, ready = free_port(), threading.Event()
    http = run_server(server, "127.0.0.1", port, "", ready=ready)
    ready.wait(60)
    print("artmlx serve (in this process)", flush=True)
    out = run_workloads(openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", timeout=3600),
                        args.model, workloads, args.max_tokens)
    report["artmlx_prefix"] = server.scheduler.prefix.stats if server.scheduler.prefix else None
    report["artmlx_prefill_tokens"], report["artmlx_prompt_tokens"] = (server.scheduler.prefill_tokens,
                                                                       server.scheduler.prompt_tokens)
    report["artmlx_conversation_hits"] = server.conversations.hits
    report["artmlx_scheduler"] = {**server.scheduler.counts, "decode_forwards": server.scheduler.decode_forwards,
                                  "tokens_sampled": server.scheduler.tokens_sampled}
    http.should_exit = True
    http.thread.join(10)
    server.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--workloads", default="32x1000x4,32x1000x1,32x20x4,1x1000x4")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prefix-cache-mb", type=int, default=1024)
    parser.add_argument("--artmlx-only", action="store_true", help="No mlx_lm.server runs (profiling).")
    parser.add_argument("--adapter", action="store_true", help="Both servers serve the same nonzero LoRA adapter.")
    parser.add_argument("--decode-chunk", type=int, default=0, help="artmlx serve's --decode-chunk (0: its default)")
    parser.add_argument("--in-process", action="store_true",
                        help="Run artmlx's server in this process, beside the clients' threads, and report its "
                             "scheduler's counts (otherwise `artmlx serve` runs as its own process, as mlx_lm.server does).")
    parser.add_argument("--json")
    args = parser.parse_args()
    workloads = [tuple(int(x) for x in w.split("x")) for w in args.workloads.split(",")]
    rows = max(c for c, _, _ in workloads)
    report = {"date": time.strftime("%Y-%m-%d"), "model": args.model, "max_tokens": args.max_tokens,
              "command": " ".join(sys.argv)}

    adapter = write_adapter(args.model, Path(tempfile.mkdtemp()) / "adapter") if args.adapter else None
    report["adapter"], report["decode_chunk"] = bool(adapter), args.decode_chunk
    if args.in_process:
        report["artmlx"] = in_process(args, adapter, rows, workloads, report)
    else:
        report["artmlx"] = as_process([sys.executable, "-m", "artmlx", "serve", "--model", args.model,
                                       *(["--adapters", str(adapter)] if adapter else []),
                                       "--max-rows", str(rows), "--max-tokens", str(args.max_tokens),
                                       "--prefix-cache-mb", str(args.prefix_cache_mb),
                                       "--decode-chunk", str(args.decode_chunk)],
                                      "artmlx serve", args.model, workloads, args.max_tokens)
    if args.artmlx_only:
        print(json.dumps({k: report[k] for k in report if k.startswith("artmlx")}, indent=1))
    else:
        report["mlx_lm"] = as_process([sys.executable, "-m", "mlx_lm", "server", "--model",
                                       resolve_model(args.model), "--max-tokens", str(args.max_tokens),
                                       *(["--adapter-path", str(adapter)] if adapter else [])],
                                      "mlx_lm.server", resolve_model(args.model), workloads, args.max_tokens)
        report["ratio"] = {name: report["artmlx"][name]["tokens_per_s"] / report["mlx_lm"][name]["tokens_per_s"]
                           for name in report["artmlx"]}
        print(json.dumps(report["ratio"], indent=1))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
