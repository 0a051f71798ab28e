"""Chat throughput: `artmlx serve` with 32 concurrent requests vs one at a time, and vs `mlx_lm.server`.

    python benchmarks/serve_throughput.py [--model tiny|FOLDER] [--requests 32] [--max-tokens 64] [--json FILE]

A random-weight model of a real shape (`artmlx model synth qwen2.5-0.5b --out DIR`) almost never ends a
reply, so every request runs to `max_tokens`: the workload is then the same for every server.

The same requests (distinct user messages, temperature 1.0, `max_tokens`) go through the real
`openai` client to each server on loopback; throughput is completion tokens per wall second (the
servers may end replies at different lengths; tokens/s is comparable, request counts are not).
Both serve the same base model; ours carries the run's (zero) LoRA adapters, as it does in training.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from artmlx.netutil import free_port  # noqa: E402
from artmlx.model.tiny import resolve_model  # noqa: E402
from artmlx.serve import run_server  # noqa: E402
from artmlx.serve.model_server import ModelServer, ServeConfig  # noqa: E402
from serve_turns import wait_up  # noqa: E402  (this folder: the one wait for a server to listen)


def ask_all(client: openai.OpenAI, model: str, count: int, max_tokens: int, concurrent: bool) -> dict:
    results: list = [None] * count

    def ask(i: int) -> None:
        results[i] = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"Game {i}: where do you play X?"}],
            max_tokens=max_tokens, temperature=1.0)

    started = time.perf_counter()
    if concurrent:
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    else:
        for i in range(count):
            ask(i)
    seconds = time.perf_counter() - started
    tokens = sum(r.usage.completion_tokens for r in results)
    return {"seconds": seconds, "completion_tokens": tokens, "tokens_per_s": tokens / seconds}


def median_pass(client: openai.OpenAI, model: str, args) -> dict:
    """`args.repeats` concurrent passes; the one with the median throughput, with every pass's rate."""
    passes = [ask_all(client, model, args.requests, args.max_tokens, concurrent=True) for _ in range(args.repeats)]
    passes.sort(key=lambda p: p["tokens_per_s"])
    return {**passes[len(passes) // 2], "passes_tokens_per_s": [round(p["tokens_per_s"], 1) for p in passes]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--skip-mlx-lm-sequential", action="store_true", help="Only the concurrent mlx_lm run.")
    parser.add_argument("--concurrent-only", action="store_true", help="No one-at-a-time passes.")
    parser.add_argument("--repeats", type=int, default=1, help="Concurrent passes per server (the median is reported).")
    parser.add_argument("--json")
    args = parser.parse_args()
    report = {"date": time.strftime("%Y-%m-%d"), "model": args.model, "requests": args.requests,
              "max_tokens": args.max_tokens}

    server = ModelServer(ServeConfig(model=args.model, max_rows=args.requests, max_tokens=args.max_tokens))
    port, ready = free_port(), threading.Event()
    http = run_server(server, "127.0.0.1", port, "", ready=ready)
    ready.wait(60)
    ours = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", timeout=3600)
    ask_all(ours, args.model, args.requests, 8, concurrent=True)  # warm-up: kernels for every batch size compile
    forwards = server.scheduler.decode_forwards
    report["artmlx_concurrent"] = median_pass(ours, args.model, args)
    report["artmlx_concurrent"]["decode_forwards"] = (server.scheduler.decode_forwards - forwards) // args.repeats
    if not args.concurrent_only:
        report["artmlx_sequential"] = ask_all(ours, args.model, args.requests, args.max_tokens, concurrent=False)
    http.should_exit = True
    http.thread.join(10)
    server.close()

    mlx_port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "mlx_lm", "server", "--model", resolve_model(args.model),
                                "--port", str(mlx_port), "--max-tokens", str(args.max_tokens)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_up(mlx_port)
        theirs = openai.OpenAI(base_url=f"http://127.0.0.1:{mlx_port}/v1", api_key="-", timeout=3600)
        name = resolve_model(args.model)
        ask_all(theirs, name, args.requests, 8, concurrent=True)
        report["mlx_lm_concurrent"] = median_pass(theirs, name, args)
        if not (args.skip_mlx_lm_sequential or args.concurrent_only):
            report["mlx_lm_sequential"] = ask_all(theirs, name, args.requests, args.max_tokens, concurrent=False)
    finally:
        process.terminate()
        process.wait(30)
    if "artmlx_sequential" in report:
        report["concurrent_vs_sequential"] = (report["artmlx_concurrent"]["tokens_per_s"]
                                              / report["artmlx_sequential"]["tokens_per_s"])
    report["artmlx_vs_mlx_lm_concurrent"] = (report["artmlx_concurrent"]["tokens_per_s"]
                                             / report["mlx_lm_concurrent"]["tokens_per_s"])
    print(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
