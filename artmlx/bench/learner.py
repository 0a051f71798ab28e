"""`artmlx bench learner`: trained tokens/s of our GRPO step against a plain mlx-lm LoRA step.

Both train the same LoRA adapters of one model on the same sequences: `groups` x G episodes of a
`prompt`-token prompt (shared within a group) and a `reply`-token policy reply, in micro-batches of
the same padded token budget (the memory plan's, or `--batch-tokens`), gradients accumulated, one
AdamW update. Tokens/s counts every token of every sequence, prompt included, for both.
- artmlx: `GRPOTrainer.train_step` (clipped-ratio loss against behaviour logprobs; each group's
  prompt computed once; the vocabulary projection only at policy tokens, in checkpointed chunks);
- mlx-lm: `mlx_lm.tuner.trainer.default_loss` (cross-entropy on every position, as `mlx_lm.lora`
  trains), under `nn.value_and_grad`.
Each runs plain and under `mx.compile` (mlx-lm compiles its step the same way), after one warm-up
step of the same shapes; peak memory (MLX's counter) is reported per run.
"""

from __future__ import annotations

import time

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_map

from ..engine.loading import open_policy
from ..engine.memory import GB
from ..learner.settings import trainer_settings
from ..learner.trainer import GRPOTrainer
from ..model.families import vocab_size
from ..model.policy import LoraSpec
from ..trajectory import Episode, Group


def make_groups(groups: int, group_size: int, prompt: int, reply: int, vocab: int, seed: int = 0) -> list[Group]:
    """Episodes of random tokens with the shapes of a real update: shared prompts, sampled replies."""
    rng = np.random.default_rng(seed)
    out = []
    for g in range(groups):
        shared = rng.integers(0, vocab, size=prompt).tolist()
        episodes = []
        for _ in range(group_size):
            answer = rng.integers(0, vocab, size=reply).tolist()
            episodes.append(Episode(shared + answer, [False] * prompt + [True] * reply,
                                    [0.0] * prompt + (-np.log(vocab) + rng.normal(0, 0.1, reply)).tolist(),
                                    reward=float(rng.random())))
        out.append(Group(seed=g, episodes=episodes, policy_version=0))
    return out


def _peak_and_time(fn):
    mx.synchronize()
    mx.clear_cache()
    mx.reset_peak_memory()
    start = time.perf_counter()
    fn()
    mx.synchronize()
    return time.perf_counter() - start, mx.get_peak_memory() / GB


class MlxLmStep:
    """A LoRA step as mlx-lm trains: cross-entropy on all positions, micro-batches accumulated, AdamW."""

    def __init__(self, model: nn.Module, compiled: bool, learning_rate: float = 1e-5):
        from mlx_lm.tuner.trainer import default_loss

        self.model = model
        self.optimizer = optim.AdamW(learning_rate=learning_rate)
        self.optimizer.init(model.trainable_parameters())
        value_and_grad = nn.value_and_grad(model, default_loss)
        step = lambda batch, lengths: value_and_grad(model, batch, lengths)  # noqa: E731
        self.grad_step = mx.compile(step, inputs=[model.state], outputs=[model.state]) if compiled else step

    def __call__(self, sequences: list[list[int]], rows_per_batch: int) -> None:
        grads = None
        for start in range(0, len(sequences), rows_per_batch):
            part = sequences[start : start + rows_per_batch]
            width = max(map(len, part))
            batch = np.zeros((len(part), width), np.int32)
            for row, seq in enumerate(part):
                batch[row, : len(seq)] = seq
            lengths = mx.array([[1, len(seq) - 1] for seq in part])
            (loss, _), micro = self.grad_step(mx.array(batch), lengths)
            grads = micro if grads is None else tree_map(mx.add, grads, micro)
            mx.eval(grads, loss)
        self.optimizer.update(self.model, grads)
        mx.eval(self.model.trainable_parameters(), self.optimizer.state)


def run(model_path: str, groups: int, group_size: int, prompt: int, reply: int, batch_tokens: int = 0,
        budget_gb: float = 0.0, rank: int = 16, echo=print, compiled: tuple[bool, ...] = (False, True)) -> dict:
    opened = open_policy(model_path, LoraSpec(rank=rank), budget_gb, training=True, seed=0)
    model, trainable, plan, budget = opened.model, opened.trainable, opened.plan, opened.budget
    data = make_groups(groups, group_size, prompt, reply, vocab_size(model))
    sequences = [e.tokens for g in data for e in g.episodes]
    tokens = sum(map(len, sequences))
    probe = GRPOTrainer(model, trainer_settings({"max_batch_tokens": batch_tokens}), plan)
    budget_tokens = probe.batch_tokens([e for g in data for e in g.episodes])
    rows_per_batch = max(1, budget_tokens // (prompt + reply))
    echo(f"model {model_path}: {groups} x {group_size} episodes of {prompt} + {reply} tokens ({tokens:,} tokens), "
         f"LoRA rank {rank} ({trainable:,} parameters), micro-batches of {budget_tokens:,} padded tokens "
         f"({rows_per_batch} sequences for mlx-lm)")
    results = {"groups": groups, "group_size": group_size, "prompt_tokens": prompt, "reply_tokens": reply,
               "tokens_per_step": tokens, "batch_tokens": budget_tokens, "lora_rank": rank,
               "trainable_parameters": trainable, "budget_gb": budget / GB, "runs": []}
    for compiled_step in compiled:
        trainer = GRPOTrainer(model, trainer_settings({"max_batch_tokens": budget_tokens, "compile_step": compiled_step,
                                                        "learning_rate": 1e-5, "groups_per_step": groups,
                                                        "group_size": group_size}), plan)
        mlx_lm_step = MlxLmStep(model, compiled_step)
        metrics: dict = {}
        for name, step in (("artmlx GRPO", lambda: metrics.update(trainer.train_step(data))),
                           ("mlx-lm LoRA (cross-entropy)", lambda: mlx_lm_step(sequences, rows_per_batch))):
            step()  # warm-up: same shapes, compiles kernels (and the step when compiled)
            seconds, peak = _peak_and_time(step)
            results["runs"].append({"method": name, "compiled": compiled_step, "seconds": seconds,
                                    "tok_s": tokens / seconds, "peak_gb": peak})
            if name == "artmlx GRPO":  # the step must also be right: a finite loss and gradient, applied
                results["runs"][-1].update({key: metrics[key] for key in ("loss", "grad_norm", "updates_skipped_nonfinite")})
            echo(f"{name:<28} {'compiled' if compiled_step else 'plain':>8}: {tokens / seconds:,.0f} tok/s "
                 f"({seconds:.2f} s), peak {peak:.2f} GB")
    by = {(r["method"], r["compiled"]): r for r in results["runs"]}
    for compiled_step in compiled:
        ours, theirs = by[("artmlx GRPO", compiled_step)], by[("mlx-lm LoRA (cross-entropy)", compiled_step)]
        name = "compiled" if compiled_step else "plain"
        results[f"ratio_{name}"] = ours["tok_s"] / theirs["tok_s"]
        echo(f"artmlx / mlx-lm tokens/s, {name}: {results[f'ratio_{name}']:.2f}x")
    return results
