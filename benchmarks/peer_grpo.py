"""One device, GRPO steps: artmlx against mlx-lm-lora's GRPO trainer on mlxrl's published workload (issue 22).

    pip install mlx-lm-lora        # beside artmlx (it brings `datasets`); mlxrl (`inductive-mlxrl`) is not run here
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
- `artmlx train` and `artmlx run --actors 1 --placement processes`: the `synthetic` environment with a
  `--prompt`-word prompt and one reply of up to `--reply` tokens, `--groups` groups of 4 a step.

The first `--warmup` steps of each are left out (loading, kernel compilation). Reported per method: seconds a
step, generated tokens a second, and for artmlx each step's mean generated tokens (random weights rarely stop
early, so replies run to `--reply` tokens in both).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from artmlx.bench.pipeline import _launch, summarize  # noqa: E402

GROUP_SIZE = 4


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
    return {"seconds_per_step": seconds, "step_seconds": times, "gen_tokens_per_s": groups * GROUP_SIZE * reply / seconds,
            "gen_tokens_per_s_note": "assumes every reply ran to --reply tokens", "peak_gb": mx.get_peak_memory() / 2**30}


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
    parser.add_argument("--only", choices=["mlx-lm-lora", "train", "run"], action="append")
    parser.add_argument("--peer-float32", action="store_true",
                        help="Give mlx-lm-lora the model in float32, as artmlx runs it on a CPU (it keeps bfloat16).")
    parser.add_argument("--json")
    args = parser.parse_args()
    folder = model_folder(args.model)
    only = set(args.only or ["mlx-lm-lora", "train", "run"])
    report = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "model": args.model,
              "machine": platform.platform(), "blas": blas_description(), "workload": {"G": GROUP_SIZE, "groups": args.groups, "prompt_words": args.prompt,
                                                          "reply_tokens": args.reply, "steps": args.steps},
              "peer_float32": args.peer_float32, "methods": {}}
    with tempfile.TemporaryDirectory() as scratch:
        for name, run in (("mlx-lm-lora", lambda: mlx_lm_lora(folder, args.groups, args.reply, args.steps, args.warmup,
                                                             args.prompt, args.peer_float32)),
                          ("train", lambda: artmlx(["train"], folder, args.groups, args.reply, args.steps, args.warmup,
                                                   args.prompt, Path(scratch) / "train")),
                          ("run", lambda: artmlx(["run", "--actors", "1", "--placement", "processes", "--plain"], folder,
                                                 args.groups, args.reply, args.steps, args.warmup, args.prompt,
                                                 Path(scratch) / "run"))):
            if name in only:
                report["methods"][name] = run()
                print(name, json.dumps(report["methods"][name]), flush=True)
    methods = report["methods"]
    if "mlx-lm-lora" in methods:
        report["speedup_vs_mlx_lm_lora"] = {name: methods["mlx-lm-lora"]["seconds_per_step"] / m["seconds_per_step"]
                                            for name, m in methods.items() if name != "mlx-lm-lora"}
    print(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
