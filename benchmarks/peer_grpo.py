"""One device, GRPO steps: artmlx against mlx-lm-lora's GRPO trainer on mlxrl's published workload (issue 22).

    pip install mlx-lm-lora inductive-mlxrl   # beside artmlx (mlx-lm-lora brings `datasets`; `--no-deps` suffices)
    python benchmarks/peer_grpo.py [--model qwen3-0.6b] [--reply 256] [--groups 1] [--steps 3] [--json OUT]

mlxrl's table (M4 Max, MLX 0.31.2, Qwen3-0.6B 4-bit, G = 4, a ~19-token prompt, 256-token replies): mlx-lm-lora
2.4 s a step, mlxrl 3.5 s, mlx-tune 7.7 s. Here the same workload runs three ways, one after another on this
machine, on one random-weight model folder (`artmlx model synth`, real shape, vocabulary and template):

- `mlx-lm-lora`: its `train_grpo` (generation through mlx-lm's `BatchGenerator` with a shared prompt cache,
  then its loss and update), LoRA of the same rank, scale and layers as ours (mlx-lm's own LoRA layers),
  temperature 1 with no top-p/top-k, `beta` 0 (no reference pass; artmlx's `kl_coef` is 0 too), `--groups`
  prompts of G = 4 a step, a hashed reward per completion; each iteration timed from its report callback;
  (`--peer-float32`: its floating-point parameters in float32; its 4-bit layers stay 4-bit, where artmlx's
  CPU backend multiplies dequantized float32 copies through the BLAS, `model/backend.py`);
- `mlxrl` (pip `inductive-mlxrl`): its `train` command's loop (`mlxrl.cli._phase1_gsm8k`) on the same prompts and
  reward, LoRA of our rank and scale on mlx-lm's default layers (its `load_policy_with_lora`), its GRPO loss with
  `beta` 0; it generates each completion alone (`generate_group_rollouts`). `mlxrl-prefix`: the same loop with its
  batched, prefix-cached rollout (`generate_prefix_cached_group_rollouts(batch_groups=True)`), which its loop does
  not use but a user could;
- `artmlx train` and `artmlx run --actors 1 --placement processes`: the `synthetic` environment with a
  `--prompt`-word prompt and one reply of up to `--reply` tokens, `--groups` groups of 4 a step.

The first `--warmup` steps of each are left out (loading, kernel compilation). Reported per method: seconds a
step, generated tokens a second, and for artmlx each step's mean generated tokens (random weights rarely stop
early, so replies run to `--reply` tokens in both).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from artmlx.bench.pipeline import _launch, summarize  # noqa: E402

GROUP_SIZE = 4
OURS = ("train", "run")
METHODS = ["mlx-lm-lora", "mlxrl", "mlxrl-prefix", *OURS]


def model_folder(arch: str) -> str:
    if Path(arch).is_dir():
        return arch
    out = Path(tempfile.gettempdir()) / f"artmlx-peer-{arch}"
    if not (out / "config.json").exists():
        subprocess.run([sys.executable, "-m", "artmlx", "model", "synth", arch, "--out", str(out)], check=True)
    return str(out)


def prompts(folder: str, count: int, words: int) -> list[list[int]]:
    """The synthetic environment's opening prompts through the model's chat template, as artmlx sends them."""
    from mlx_lm.utils import load_tokenizer

    from artmlx.chat import ChatFormat
    from artmlx.envs.synthetic import Synthetic

    chat = ChatFormat(load_tokenizer(Path(folder)))
    return [chat.prompt_ids(Synthetic(words, 1, 8).reset(seed)) for seed in range(count)]


def hashed_reward(prompts, completions, answer, types=None) -> list[float]:
    return [int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF for text in completions]


def mlx_lm_lora(folder: str, groups: int, reply: int, steps: int, warmup: int, words: int, float32: bool) -> dict:
    import mlx.core as mx
    import mlx.optimizers as optim
    from mlx_lm import load
    from mlx_lm.tuner.callbacks import TrainingCallback
    from mlx_lm.tuner.utils import linear_to_lora_layers
    from mlx_lm_lora.trainer.grpo_trainer import GRPOTrainingArgs, train_grpo

    from artmlx.model.policy import LoraSpec

    model, tokenizer = load(folder)
    if float32:  # what artmlx does on a CPU (`model/backend.py`): MLX's CPU computes bfloat16 slowly
        model.set_dtype(mx.float32)
    spec = LoraSpec()
    model.freeze()
    linear_to_lora_layers(model, spec.layers_for(model), spec.mlx_lm_parameters())
    ids = prompts(folder, groups * (steps + warmup), words)
    dataset = [(p, [0], tokenizer.decode(p), "") for p in ids]
    stamps: list[float] = []

    class Clock(TrainingCallback):
        def on_train_loss_report(self, info):
            stamps.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as scratch:
        args = GRPOTrainingArgs(batch_size=groups, iters=steps + warmup, group_size=GROUP_SIZE,
                                max_completion_length=reply, beta=0.0, temperature=1.0, top_p=1.0, top_k=0,
                                steps_per_report=1, steps_per_eval=10**9, steps_per_save=10**9,
                                adapter_file=str(Path(scratch) / "adapters.safetensors"), max_seq_length=4096)
        started = time.perf_counter()
        mx.reset_peak_memory()
        train_grpo(model, None, tokenizer, optim.Adam(learning_rate=1e-5), dataset, None,
                   reward_funcs=[hashed_reward], args=args, training_callback=Clock())
    times = [b - a for a, b in zip([started, *stamps], stamps)][warmup:]
    seconds = statistics.mean(times)
    return {"seconds_per_step": seconds, "step_seconds": times,
            "gen_tokens_per_s": groups * GROUP_SIZE * reply / seconds,
            "gen_tokens_per_s_note": "assumes every reply ran to --reply tokens",
            "peak_gb": mx.get_peak_memory() / 2**30}


def mlxrl(folder: str, groups: int, reply: int, steps: int, warmup: int, words: int, float32: bool,
          prefix_cached: bool) -> dict:
    """mlxrl's `train` loop (`mlxrl.cli._phase1_gsm8k`: rollouts, `batch_from_rollouts`, `optimizer_step`) on our
    prompts and reward. Its loop generates through `generate_group_rollouts` (each completion alone, a fresh KV
    cache each); `prefix_cached` swaps in its `generate_prefix_cached_group_rollouts(batch_groups=True)` (one prompt
    prefill per group, the group's rows decoded together), which its loop does not use."""
    import mlx.core as mx
    import mlx.optimizers as optim
    from mlxrl.algo.grpo import GRPOAlgorithm
    from mlxrl.policy.logprobs import pad_token_id_from_tokenizer
    from mlxrl.policy.model import LoRAConfig, load_policy_with_lora
    from mlxrl.rollout.naive import SamplingConfig, generate_group_rollouts
    from mlxrl.rollout.optimized import generate_prefix_cached_group_rollouts
    from mlxrl.train.grpo import batch_from_rollouts, optimizer_step

    from artmlx.model.policy import LoraSpec

    spec = LoraSpec()
    model, tokenizer, _ = load_policy_with_lora(folder, LoRAConfig(rank=spec.rank, scale=spec.scale))
    if float32:
        model.set_dtype(mx.float32)
    texts = [tokenizer.decode(p) for p in prompts(folder, groups * (steps + warmup), words)]
    sampling = SamplingConfig(max_tokens=reply, temperature=1.0, top_p=1.0, min_p=0.0, top_k=0)
    optimizer, algorithm = optim.Adam(learning_rate=1e-5), GRPOAlgorithm()
    pad = pad_token_id_from_tokenizer(tokenizer)
    times, generated = [], []
    mx.reset_peak_memory()
    for step in range(steps + warmup):
        started = time.perf_counter()
        batch_prompts = texts[step * groups:(step + 1) * groups]
        if prefix_cached:
            completions = generate_prefix_cached_group_rollouts(model, tokenizer, batch_prompts, GROUP_SIZE, sampling,
                                                                seed=step, use_chat_template=False, batch_groups=True)
        else:
            completions = generate_group_rollouts(model, tokenizer, batch_prompts, GROUP_SIZE, sampling, seed=step,
                                                  use_chat_template=False)
        rewards = hashed_reward(None, [c.text for c in completions], None)
        batch = batch_from_rollouts(model, completions, rewards, GROUP_SIZE, pad, algorithm, compute_reference=False)
        optimizer_step(model, optimizer, batch, beta=0.0, pad_token_id=pad, algorithm=algorithm)
        mx.synchronize()
        times.append(time.perf_counter() - started)
        generated.append(sum(len(c.completion_tokens) for c in completions))
    seconds = statistics.mean(times[warmup:])
    return {"seconds_per_step": seconds, "step_seconds": times[warmup:],
            "gen_tokens_per_s": statistics.mean(generated[warmup:]) / seconds,
            "mean_generated_tokens": statistics.mean(generated[warmup:]) / (groups * GROUP_SIZE),
            "peak_gb": mx.get_peak_memory() / 2**30}


def artmlx(command: list[str], folder: str, groups: int, reply: int, steps: int, warmup: int, words: int,
           out: Path) -> dict:
    settings = {"model": json.dumps(folder), "env": '"synthetic"',
                "env_args": f"{{prompt_tokens = {words}, turns = 1, user_tokens = 8}}", "group_size": GROUP_SIZE,
                "groups_per_step": groups, "max_reply_tokens": reply, "max_turns": 1, "eval_every": 0,
                "checkpoint_every": steps + warmup}
    overrides = [item for key, value in settings.items() for item in ("--set", f"{key}={value}")]
    wall = _launch([*command, "--out", str(out), "--steps", str(steps + warmup), *overrides], out.with_suffix(".log"))
    summary = summarize(out, warmup)
    return {"seconds_per_step": summary["seconds_per_update"], "gen_tokens_per_s": summary["gen_tokens_per_s"],
            "wall_s": wall, "peak_gb": summary["learner_peak_gb"], "actors_peak_gb": summary["actors_peak_gb"]}


def main() -> None:
    from artmlx.fast_blas import blas_description, reexec_with_fast_blas

    reexec_with_fast_blas()  # mlx-lm-lora runs in this process: the BLAS the `artmlx` commands get, for both
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen3-0.6b", help="A synth architecture or a model folder.")
    parser.add_argument("--prompt", type=int, default=19, help="Prompt words (one token each on synth tokenizers).")
    parser.add_argument("--reply", type=int, default=256)
    parser.add_argument("--groups", type=int, default=1, help="Prompts (groups of 4) a step.")
    parser.add_argument("--steps", type=int, default=3, help="Timed steps per method.")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--only", choices=METHODS, action="append")
    parser.add_argument("--peer-float32", action="store_true",
                        help="Give mlx-lm-lora the model in float32, as artmlx runs it on a CPU (it keeps bfloat16).")
    parser.add_argument("--json")
    args = parser.parse_args()
    folder = model_folder(args.model)
    only = set(args.only or METHODS)
    workload = {"G": GROUP_SIZE, "groups": args.groups, "prompt_words": args.prompt, "reply_tokens": args.reply,
                "steps": args.steps}
    report = {"date": time.strftime("%Y-%m-%d"), "command": shlex.join(sys.argv), "model": args.model,
              "machine": platform.platform(), "blas": blas_description(), "workload": workload,
              "peer_float32": args.peer_float32, "methods": {}}
    with tempfile.TemporaryDirectory() as scratch:
        for name, run in (("mlx-lm-lora", lambda: mlx_lm_lora(folder, args.groups, args.reply, args.steps, args.warmup,
                                                             args.prompt, args.peer_float32)),
                          ("mlxrl", lambda: mlxrl(folder, args.groups, args.reply, args.steps, args.warmup,
                                                 args.prompt, args.peer_float32, prefix_cached=False)),
                          ("mlxrl-prefix", lambda: mlxrl(folder, args.groups, args.reply, args.steps, args.warmup,
                                                        args.prompt, args.peer_float32, prefix_cached=True)),
                          ("train", lambda: artmlx(["train"], folder, args.groups, args.reply, args.steps, args.warmup,
                                                   args.prompt, Path(scratch) / "train")),
                          ("run", lambda: artmlx(["run", "--actors", "1", "--placement", "processes", "--plain"],
                                                 folder, args.groups, args.reply, args.steps, args.warmup, args.prompt,
                                                 Path(scratch) / "run"))):
            if name in only:
                report["methods"][name] = run()
                # The peers run in this process: hand their freed buffers back before the next method (on an
                # 80 GB card mlxrl's 66 GB cache left artmlx's learner process too little).
                gc.collect()
                mx.clear_cache()
                print(name, json.dumps(report["methods"][name]), flush=True)
                write(report, args.json)  # after each method: a device call cut short keeps what finished


def write(report: dict, path: str | None) -> None:
    """The report with each artmlx method's speed against every peer and against the fastest peer."""
    methods = report["methods"]
    peers = {name: m["seconds_per_step"] for name, m in methods.items() if name not in OURS}
    if peers:
        best = min(peers, key=peers.get)
        report["best_peer"] = best
        report["speedup_vs_best_peer"] = {name: peers[best] / m["seconds_per_step"]
                                          for name, m in methods.items() if name in OURS}
        report["speedup_vs_peers"] = {peer: {name: seconds / m["seconds_per_step"] for name, m in methods.items()
                                             if name in OURS} for peer, seconds in peers.items()}
    print(json.dumps(report, indent=1), flush=True)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
