"""Learning over wall time: mlx-lm-lora's GRPO trainer on artmlx's `math` task, scored by artmlx's evaluator.

    .venv/bin/pip install --no-deps mlx-lm-lora   # 5.10.2: its GRPO trainer imports only mlx, mlx-lm, numpy, tqdm
    python benchmarks/peer_learn.py [--minutes 20] [--group-size 16] [--groups 8] [--max-tokens 16] \
        [--eval-every-s 120] [--eval-episodes 200] [--out DIR] [--json FILE]

What it measures: held-out accuracy of SmolLM2-135M-Instruct's adapters against seconds of training, for
mlx-lm-lora's `train_grpo` (`mlx_lm_lora/trainer/grpo_trainer.py`), to set beside an `artmlx train` run of
the same settings (`env = "math"`, `group_size`, `groups_per_step`, `max_reply_tokens`, `learning_rate`,
`seed`). Every `--eval-every-s` seconds of training (the clock stops while adapters are saved) the adapters
are saved under `--out` as `step-NNNNNN/` with artmlx's `adapter_config.json`; the untrained LoRA (zero
`lora_b`, i.e. the base) is saved as step 0. After training each is scored by artmlx's `artmlx eval` code
(`apps/evaluate.run_eval`) on `--eval-episodes` held-out questions at `--temperature`; `--out/config.toml`
holds the sampling settings, so `artmlx eval --adapters OUT/step-NNNNNN` repeats a point.

The same as an `artmlx train` run of these settings: the base folder; LoRA rank 16, scale 20 on every
linear layer of every block (`LoraSpec()`, mlx-lm's `linear_to_lora_layers`); prompt token ids
(`ChatFormat.prompt_ids` of `MathQuestion().reset(seed)`); step k's task seeds (`train_seeds(seed, k,
groups)`, fed through our own `iterate_batches`: mlx-lm-lora's own sorts prompts by length and shuffles);
the reward (`MathQuestion().step(text).reward`: 1 right, 0.1 a wrong number, 0 none); G; temperature 1 with
no top-p/top-k; no KL term (beta 0, no reference pass); AdamW, betas (0.9, 0.999), no weight decay, the
given learning rate; one optimizer step per batch of rollouts; generation stops at EOS only (its
`end_answer_token` "</answer>" is switched off); the evaluator, its seeds and its sampling seed (`--seed`).
mlx-lm-lora's own defaults would be: Adam at 1e-5 (CLI), group size 4, beta 0.1, temperature 0.8,
top-p 0.95, top-k 20, 512-token completions, LoRA rank 8, scale 10.

Not the same (facts of the code, not measured here):
- compute: mlx-lm-lora runs the model as loaded (float16 scales and norms, MLX's 4-bit kernels for
  generation and loss; `--float32` casts its floating parameters to float32, `--dense` also dequantizes the
  base with mlx-lm's `dequantize_model`); artmlx on the CPU casts to float32 and dequantizes a small base once
  (`model/backend.py`). The evaluator uses artmlx's loading for
  every point, so the scores compare; the training speed is each trainer's own;
- generation: `BatchGenerator` with `completion_batch_size` = `--groups`, so only `--groups` sequences decode
  at once and a step's groups x G replies go through in waves (continuous batching), each prompt prefilled
  once and its cache forked for its G replies;
- advantages: (r - mean) / (std + 1e-4) per group (GRPO's scaling; artmlx's default `scale_advantages =
  false` leaves them unscaled); flat groups are trained (zero advantage), where `artmlx train` replaces them
  by fresh tasks (`dynamic_sampling_rounds = 4`);
- loss: `grpo_loss_type = "grpo"`, each reply's token mean averaged over replies (artmlx: `token_mean`
  over all tokens, `--set normalization=seq_mean` to match); clip epsilon 1e-4 on an on-policy ratio of
  exactly 1, so no clipping acts (artmlx: 0.2/0.28, also on-policy with `minibatches = 1`); no gradient-norm
  clipping (artmlx: 1.0); the loss is computed in micro-batches of `--groups` rows;
- time: loading, LoRA setup and the final evaluation are outside the clock; the first step's compilation
  is inside it, as in artmlx's own wall time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import sys
import time
from importlib.metadata import version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODEL, TASK = "smollm2-135m-instruct", "math"


class BudgetSpent(Exception):
    """Raised from the report callback: `train_grpo` has no time limit, and its report is a step boundary."""


def math_reward(prompts, completions, answer, types=None) -> list[float]:
    """artmlx's reward for each reply; `types` carries each reply's task seed (see `seeded_batches`)."""
    from artmlx.envs.math_question import MathQuestion

    env, rewards = MathQuestion(), []
    for seed, text in zip(types, completions):
        env.reset(seed)
        rewards.append(env.step(text).reward)
    return rewards


def seeded_batches(tokenizer, seed: int, groups: int):
    """An `iterate_batches` for `train_grpo` whose k-th batch (k from 0) is artmlx's step-k prompts."""
    from artmlx.chat import ChatFormat
    from artmlx.envs.math_question import MathQuestion
    from artmlx.seeds import train_seeds

    chat = ChatFormat(tokenizer)

    def iterate(dataset, batch_size, max_seq_length, train=False):
        step = 0
        while True:
            seeds = train_seeds(seed, step, groups)
            ids = [chat.prompt_ids(MathQuestion().reset(s)) for s in seeds]
            # (prompt ids, answer ids, prompt text, answer text, types): the reward reads the seed from types
            yield ids, [[0]] * groups, [tokenizer.decode(p) for p in ids], [""] * groups, seeds
            step += 1

    return iterate


def train(args, out: Path) -> tuple[list[dict], list[dict]]:
    """Train until `--minutes` of training time; returns (checkpoints, per-step log)."""
    import mlx.core as mx
    import mlx.optimizers as optim
    from mlx_lm import load
    from mlx_lm.tuner.callbacks import TrainingCallback
    from mlx_lm.tuner.utils import linear_to_lora_layers
    from mlx_lm_lora.trainer.grpo_trainer import GRPOTrainingArgs, train_grpo

    from artmlx.model.policy import LoraSpec, save_adapters
    from artmlx.model.tiny import resolve_model

    model, tokenizer = load(resolve_model(MODEL))
    if args.dense:  # what artmlx's CPU backend does for a small base (`model/backend.py`)
        from mlx_lm.utils import dequantize_model

        model = dequantize_model(model)
    if args.float32 or args.dense:
        model.set_dtype(mx.float32)
    mx.random.seed(args.seed)  # LoRA initialisation and sampling
    spec = LoraSpec()
    model.freeze()
    linear_to_lora_layers(model, spec.layers_for(model), spec.mlx_lm_parameters())
    checkpoints, log, console = [], [], sys.stdout

    def checkpoint(step: int, seconds: float) -> None:
        folder = out / f"step-{step:06d}"
        save_adapters(model, folder, spec, MODEL)  # adapters.safetensors + mlx-lm's adapter_config.json
        checkpoints.append({"train_seconds": seconds, "step": step, "adapters": str(folder)})
        print(f"saved {folder.name} at {seconds:.1f} s of training", file=console, flush=True)

    class Clock(TrainingCallback):
        """Reported after every step (`steps_per_report=1`): the training clock, checkpoints and the budget."""

        def __init__(self):
            self.started, self.paused, self.next_save = time.perf_counter(), 0.0, args.eval_every_s

        def on_train_loss_report(self, info):
            now = time.perf_counter()
            seconds, step = now - self.started - self.paused, info["iteration"]
            log.append({"step": step, "train_seconds": seconds, "reward_mean": info["train_total_rewards_mean"],
                        "generated_tokens_mean": info["train_average_generated_tokens"]})
            spent = seconds >= args.minutes * 60
            if seconds >= self.next_save or spent:
                checkpoint(step, seconds)
                self.paused += time.perf_counter() - now  # saving is not training
                while self.next_save <= seconds:
                    self.next_save += args.eval_every_s
            if spent:
                raise BudgetSpent

    checkpoint(0, 0.0)  # zero lora_b: the base, scored through the same path as every other point
    settings = GRPOTrainingArgs(
        batch_size=args.groups, group_size=args.group_size, iters=10**9, max_completion_length=args.max_tokens,
        beta=0.0, temperature=args.temperature, top_p=1.0, top_k=0, min_p=0.0, steps_per_report=1,
        steps_per_eval=10**9, steps_per_save=10**9, adapter_file=str(out / "last.safetensors"))
    optimizer = optim.AdamW(learning_rate=args.learning_rate, betas=[0.9, 0.999], weight_decay=0.0)
    with open(out / "trainer.log", "w") as trainer_log:  # its 30-line report per step and progress bar
        with contextlib.redirect_stdout(trainer_log), contextlib.redirect_stderr(trainer_log):
            try:
                # the dataset is a placeholder: `seeded_batches` makes every batch
                train_grpo(model, None, tokenizer, optimizer, [((0,), (0,), "", "")] * args.groups, None,
                           reward_funcs=[math_reward], args=settings, training_callback=Clock(),
                           iterate_batches=seeded_batches(tokenizer, args.seed, args.groups), end_answer_token="")
            except BudgetSpent:
                pass
    return checkpoints, log


def main() -> None:
    from artmlx.fast_blas import blas_description, reexec_with_fast_blas

    reexec_with_fast_blas()  # mlx-lm-lora trains in this process: the BLAS `artmlx train` gets
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0, help="Training wall-clock budget.")
    parser.add_argument("--group-size", type=int, default=16)
    parser.add_argument("--groups", type=int, default=8, help="Prompts (groups) per step.")
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--max-tokens", type=int, default=16, help="Most tokens in a reply (training and eval).")
    parser.add_argument("--temperature", type=float, default=1.0, help="Sampling temperature (training and eval).")
    parser.add_argument("--eval-every-s", type=float, default=120.0, help="Save adapters every this many seconds.")
    parser.add_argument("--eval-episodes", type=int, default=200)
    parser.add_argument("--float32", action="store_true", help="Cast mlx-lm-lora's model to float32 first.")
    parser.add_argument("--dense", action="store_true",
                        help="Dequantize the 4-bit base with mlx-lm's `dequantize_model` and cast it to float32 first "
                             "(MLX's CPU multiplies 4-bit weights at ~1.5 GFLOP/s; artmlx's CPU backend does the same "
                             "for a small base).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/peer-learn")
    parser.add_argument("--json")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from artmlx.apps.evaluate import run_eval
    from artmlx.config import TrainConfig, config_to_toml

    # `artmlx eval --adapters OUT/step-N` reads its sampling settings from OUT/config.toml (else 8-token replies).
    config = TrainConfig(model=MODEL, env=TASK, seed=args.seed, group_size=args.group_size,
                         groups_per_step=args.groups, temperature=args.temperature,
                         max_reply_tokens=args.max_tokens, learning_rate=args.learning_rate,
                         eval_episodes=args.eval_episodes, out=str(out))
    (out / "config.toml").write_text(config_to_toml(config))

    checkpoints, log = train(args, out)
    steps, seconds = log[-1]["step"], log[-1]["train_seconds"]
    print(f"trained {steps} steps in {seconds:.1f} s ({seconds / steps:.2f} s a step)", flush=True)
    points = []
    for point in checkpoints:
        row = run_eval(point["adapters"], MODEL, TASK, [], args.eval_episodes, args.temperature, args.seed)
        points.append({**point, **{key: row[key] for key in ("eval_score", "eval_score_ci_low", "eval_score_ci_high")}})
        print(f"{point['train_seconds']:8.1f} s  step {point['step']:5d}  score {row['eval_score']:.3f} "
              f"({row['eval_score_ci_low']:.3f}-{row['eval_score_ci_high']:.3f})", flush=True)

    report = {"method": "mlx-lm-lora", "version": version("mlx-lm-lora"), "model": MODEL, "task": TASK,
              "blas": blas_description(),
              "settings": {"minutes": args.minutes, "group_size": args.group_size, "groups": args.groups,
                           "learning_rate": args.learning_rate, "optimizer": "AdamW(betas=(0.9, 0.999), wd=0)",
                           "max_tokens": args.max_tokens, "temperature": args.temperature, "beta": 0.0,
                           "grpo_loss_type": "grpo", "eval_every_s": args.eval_every_s,
                           "eval_episodes": args.eval_episodes, "float32": args.float32, "dense": args.dense,
                           "seed": args.seed},
              "command": shlex.join([Path(sys.executable).name, *sys.argv]),
              "points": points, "seconds_per_step": seconds / steps, "steps": log}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
