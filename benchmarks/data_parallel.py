"""Data-parallel GRPO updates over mx.distributed's ring backend (issue 23), on local processes.

    python benchmarks/data_parallel.py --ranks 2 --threads 1 --json out.json --adapters out.safetensors

starts `--ranks` processes (MLX_RANK, a ring hostfile of local ports, `--threads` BLAS threads each) as
`artmlx run --learner-ranks` does: rank 0 loads the embedded model with perturbed adapters, plays tic-tac-toe
groups, hands its state and then each update's groups to the other ranks (`artmlx/apps/learner_ranks.py`), and
runs `--steps` GRPO updates, each rank training its share of the groups (`artmlx/learner/data_parallel.py`).
Rank 0 writes the adapters after the last update and the seconds per update. With `--ranks 1` it is the
single-process trainer, so two invocations compare the update (equivalence) and the time (2 ranks x 1 thread
against 1 x 2 threads).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def launch(args) -> int:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": str(args.threads), "OMP_NUM_THREADS": str(args.threads),
           "PYTHONPATH": str(ROOT)}
    hostfile = Path(args.json).with_suffix(".hosts.json")
    hostfile.write_text(json.dumps([[f"127.0.0.1:{port}"] for port in _free_ports(args.ranks)]))
    command = [sys.executable, __file__, "--worker", *sys.argv[1:]]
    procs = [subprocess.Popen(command, env={**env, "MLX_RANK": str(rank), "MLX_HOSTFILE": str(hostfile)})
             for rank in range(args.ranks)]
    # A rank that fails must end the others: the ring raises in a survivor's next collective for small
    # messages, but a survivor blocked in a large all_sum was seen waiting for good (mlx 0.32.4, CPU).
    deadline = time.monotonic() + args.timeout
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        if any(p.poll() for p in procs):
            break
        time.sleep(0.2)
    # Every rank that failed by now is named: the survivor of a lost peer may fail within the same poll.
    for rank, p in enumerate(procs):
        if p.poll():
            print(f"rank {rank} exited with {p.returncode}", flush=True)
    if any(p.poll() is None for p in procs):
        print("stopping the other ranks", flush=True)
    for p in procs:
        if p.poll() is None:
            p.terminate()
    codes = [p.wait() for p in procs]
    print(f"ranks exited with {codes}", flush=True)
    return 1 if any(codes) else 0


def worker(args) -> None:
    """Rank 0 plays the groups and hands each update's to the other ranks through the learner's own `RankLink`
    (its state first, as a resumed run's checkpoint); the others run the learner's `follow` loop as
    `artmlx learner` ranks do. With one rank it is the single-process trainer on the same groups."""
    import tempfile

    import mlx.core as mx
    from mlx.utils import tree_flatten

    from artmlx.apps.learner_ranks import check_same_start, follow, rank_link
    from artmlx.config import load_config
    from artmlx.engine.loading import open_policy
    from artmlx.envs import make_env
    from artmlx.learner.checkpoint import save_checkpoint
    from artmlx.learner.settings import TrainerSettings
    from artmlx.learner.trainer import GRPOTrainer
    from artmlx.model.policy import LoraSpec
    from artmlx.protocol.convert import group_to_message, message_to_group
    from artmlx.rollout.episodes import EpisodeRollouts, SamplingParams

    link = rank_link() if args.ranks > 1 else None
    config = load_config(None, {"learning_rate": 1e-3, "minibatches": args.minibatches, "lora_rank": 8,
                                "max_batch_tokens": args.batch_tokens, "seed": 0})
    if link is not None and link.rank > 0:
        if link.rank == args.exit_rank:  # a rank lost (the fault test): once it has taken rank 0's state
            link.broadcast()
            os._exit(3)
        follow(config, link)
        return
    spec = LoraSpec.from_config(config)
    opened = open_policy("tiny", spec, seed=0, training=True)
    model = opened.model
    noisy = [(k, mx.random.normal(v.shape) * 0.01) for k, v in tree_flatten(model.trainable_parameters())]
    model.load_weights(noisy, strict=False)  # not the seed's adapters: the other ranks must take these
    trainer = GRPOTrainer(model, TrainerSettings.of(config), opened.plan, group=link.group if link else None)
    engine = EpisodeRollouts(model, opened.tokenizer, lambda: make_env("tictactoe"), SamplingParams())
    messages = [[group_to_message(g, "rank0", "tictactoe", "bench") for g in
                 engine.play(list(range(step * args.groups, (step + 1) * args.groups)), args.group_size,
                             mx.random.key(step))] for step in range(args.steps + 1)]
    if link is not None:
        with tempfile.TemporaryDirectory() as run_dir:
            link.send_state(save_checkpoint(Path(run_dir), trainer, spec, "tiny"))
        check_same_start(link, trainer)

    def update(batch):
        if link is not None:
            link.send_update(batch)
        return trainer.train_step([message_to_group(m) for m in batch])

    update(messages[0])  # warm-up: the first update's shapes
    started = time.perf_counter()
    rows = [update(batch) for batch in messages[1:]]
    seconds = (time.perf_counter() - started) / args.steps
    if link is not None:
        link.send_stop()
    mx.save_safetensors(args.adapters, dict(tree_flatten(model.trainable_parameters())))
    Path(args.json).write_text(json.dumps({
        "ranks": args.ranks, "threads_per_rank": args.threads, "seconds_per_update": seconds,
        "groups": args.groups, "group_size": args.group_size, "steps": args.steps,
        "tokens_trained": [r["tokens_trained"] for r in rows], "loss": [r["loss"] for r in rows],
        "grad_norm": [r["grad_norm"] for r in rows]}, indent=1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads per rank")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2, help="timed updates after one warm-up update")
    parser.add_argument("--minibatches", type=int, default=1)
    parser.add_argument("--batch-tokens", type=int, default=0, help="max_batch_tokens (0: the default)")
    parser.add_argument("--json", required=True)
    parser.add_argument("--adapters", required=True)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--exit-rank", type=int, default=-1, help="this rank exits once it has the state (a fault)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
