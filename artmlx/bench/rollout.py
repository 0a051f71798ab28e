"""`artmlx bench rollout`: generated tokens/s of our engine against mlx-lm, same model, same lengths.

One model object (loaded as artmlx loads it, LoRA attached) serves every method, so each measures
only its way of generating. For each group size G, with the synthetic workload (a prompt of
`prompt` tokens, one reply of up to `reply` tokens, temperature 1):
- engine: `EpisodeRollouts` plays `rows // G` groups of G episodes at once, `rows` being the
  engine's own rule for this budget (`engine/memory.py`) unless `--rows` sets it; each prompt is
  prefilled once for its group; sampler logprobs are recorded;
- batch_generate: `mlx_lm.batch_generate` on the same prompts, each repeated G times, with the
  completion and prefill batch both equal to the engine's rows (no logprobs: its fastest mode);
- sequential: `mlx_lm.stream_generate` (what `mlx_lm.generate` runs) one sample at a time, over
  `sequential` samples (tokens/s does not depend on how many).
Each method is warmed up first (kernel compilation is not timed). Also measured:
- prefill memory: the peak of prefilling `prefill_rows` prompts with logits at every position (what
  the engine did before) against logits at each row's last position only;
- sampler/learner agreement: the learner's recomputed logprobs of the engine's G = 8 episodes
  against the sampler's (ratio mean and max |difference|) at this model size, and the learner's against
  its own in float32: how far rounding to bfloat16 alone moves this model's logprobs, the scale by which
  a GPU's sampler/learner difference is noise (random-weight Gemma and GPT-OSS shapes: up to 2-3 nats);
- rows sweep (optional): engine decode tokens/s at several batch sizes, for the rows rule.
"""

from __future__ import annotations

import time

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from ..chat import ChatFormat
from ..engine.loading import open_policy
from ..engine.memory import GB
from ..envs.base import make_env
from ..learner.settings import trainer_settings
from ..learner.trainer import GRPOTrainer
from ..model.policy import LoraSpec
from ..rollout.episodes import EpisodeRollouts, SamplingParams


def _timed(fn):
    mx.synchronize()
    mx.clear_cache()
    mx.reset_peak_memory()
    start = time.perf_counter()
    result = fn()
    mx.synchronize()
    return result, time.perf_counter() - start, mx.get_peak_memory() / GB


class RolloutBench:
    def __init__(self, model_path: str, prompt: int, reply: int, budget_gb: float = 0.0):
        opened = open_policy(model_path, LoraSpec(), budget_gb)
        self.model, self.tokenizer, self.plan, self.budget = opened.model, opened.tokenizer, opened.plan, opened.budget
        self.prompt, self.reply = prompt, reply
        self.chat = ChatFormat(self.tokenizer)
        env_args = {"prompt_tokens": prompt, "turns": 1}
        self.make_env = lambda: make_env("synthetic", env_args)
        # Room for the prompt as this tokenizer makes it (one token a word only on the synth tokenizers).
        prompt_ids = len(self.chat.prompt_ids(self.make_env().reset(0)))
        self.sampling = SamplingParams(temperature=1.0, max_reply_tokens=reply, max_turns=1,
                                       max_episode_tokens=2 * max(prompt, prompt_ids) + reply + 64)

    def rollouts(self, max_tokens: int | None = None) -> EpisodeRollouts:
        sampling = self.sampling if max_tokens is None else SamplingParams(
            1.0, max_tokens, 1, self.sampling.max_episode_tokens)
        return EpisodeRollouts(self.model, self.tokenizer, self.make_env, sampling, self.plan)

    def prompts(self, seeds: list[int]) -> list[list[int]]:
        return [self.chat.prompt_ids(self.make_env().reset(seed)) for seed in seeds]

    def engine(self, seeds: list[int], group_size: int):
        rollouts = self.rollouts()
        rollouts.plan = None  # one batch of exactly these groups (prefill chunks still follow the plan)
        groups, seconds, peak = _timed(lambda: rollouts.play(seeds, group_size, mx.random.key(0)))
        tokens = sum(g.policy_tokens for g in groups)
        return groups, {"tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds, "peak_gb": peak}

    def batch_generate(self, seeds: list[int], group_size: int, rows: int, max_tokens: int | None = None) -> dict:
        from mlx_lm.generate import batch_generate
        from mlx_lm.sample_utils import make_sampler

        prompts = [p for p in self.prompts(seeds) for _ in range(group_size)]
        response, seconds, peak = _timed(lambda: batch_generate(
            self.model, self.tokenizer, prompts, max_tokens=max_tokens or self.reply, sampler=make_sampler(temp=1.0),
            completion_batch_size=rows, prefill_batch_size=rows, return_token_ids=True))
        tokens = sum(len(t) for t in response.token_ids)
        return {"tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds, "peak_gb": peak}

    def sequential(self, seeds: list[int], max_tokens: int | None = None) -> dict:
        from mlx_lm.generate import stream_generate
        from mlx_lm.sample_utils import make_sampler

        def run():
            count = 0
            for prompt in self.prompts(seeds):
                for response in stream_generate(self.model, self.tokenizer, prompt, max_tokens=max_tokens or self.reply,
                                                sampler=make_sampler(temp=1.0)):
                    pass
                count += response.generation_tokens
            return count

        tokens, seconds, peak = _timed(run)
        return {"tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds, "peak_gb": peak}

    def warm_up(self, rows: int, group_sizes: list[int]) -> None:
        """Both batched methods once at the measured batch shapes, a few tokens each: on MLX's CUDA backend the
        first call of a shape compiles kernels (tens of seconds for Gemma 3), which whichever method ran
        first at that shape would otherwise pay inside its timing."""
        for group_size in group_sizes:
            seeds = list(range(999_000, 999_000 + max(1, rows // group_size)))
            rollouts = self.rollouts(max_tokens=8)
            rollouts.plan = None  # one batch, as `engine` plays
            rollouts.play(seeds, group_size, mx.random.key(1))
            self.batch_generate(seeds, group_size, len(seeds) * group_size, max_tokens=8)
        self.sequential(seeds[:1], max_tokens=4)

    def prefill_memory(self, rows: int) -> dict:
        """Peak memory of one prefill: logits at every position (before) vs at the last position only."""
        prompts = self.prompts(list(range(rows)))
        width = max(map(len, prompts))
        padded = mx.array(np.array([p + [0] * (width - len(p)) for p in prompts], np.int32))
        engine = self.rollouts().engine

        def every_position():
            cache = engine.new_cache(rows)
            lengths = mx.array([len(p) for p in prompts])
            logits = cache.forward(lambda x, c: self.model(x, cache=c), padded, lengths)
            last = mx.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0]
            mx.eval(last)
            return last

        def last_only():
            last = engine.prefill(engine.new_cache(rows), prompts)
            mx.eval(last)
            return last

        before, t_before, peak_before = _timed(every_position)
        after, t_after, peak_after = _timed(last_only)
        return {"rows": rows, "prompt_tokens": width, "peak_gb_all_positions": peak_before,
                "peak_gb_last_position": peak_after, "seconds_all_positions": t_before,
                "seconds_last_position": t_after,
                "max_abs_logit_diff": float(mx.abs(before.astype(mx.float32) - after.astype(mx.float32)).max())}

    def agreement(self, groups) -> dict:
        """The learner's recomputed logprobs of `groups` against the sampler's, and, as the scale to read that by,
        against the learner's own in float32 (every floating-point array of the model widened, exactly: what
        rounding to the model's dtype alone moves; the model is restored after)."""
        trainer = GRPOTrainer(self.model, trainer_settings({"temperature": 1.0}), self.plan)
        learner, behaviour = trainer.recompute(groups)
        diff = learner - behaviour
        original = tree_flatten(self.model.parameters())
        self.model.set_dtype(mx.float32)
        learner32, _ = trainer.recompute(groups)
        self.model.load_weights(original)
        rounding = np.abs(learner - learner32)
        return {"policy_tokens": int(diff.size), "ratio_mean": float(np.exp(diff).mean()),
                "max_abs_logprob_diff": float(np.abs(diff).max()),
                "max_abs_logprob_diff_vs_float32": float(rounding.max()),
                "mean_abs_logprob_diff_vs_float32": float(rounding.mean())}

    def rows_sweep(self, rows_list: list[int], tokens: int) -> list[dict]:
        out = []
        for rows in rows_list:
            rollouts = self.rollouts(max_tokens=tokens)
            rollouts.plan = None
            groups, seconds, peak = _timed(lambda: rollouts.play(list(range(rows)), 1, mx.random.key(2)))
            generated = sum(g.policy_tokens for g in groups)
            out.append({"rows": rows, "tok_s": generated / seconds, "peak_gb": peak})
        return out


def run(model_path: str, group_sizes: list[int], prompt: int, reply: int, rows: int = 0, sequential: int = 2,
        prefill_rows: int = 0, sweep: list[int] | None = None, budget_gb: float = 0.0, echo=print) -> dict:
    bench = RolloutBench(model_path, prompt, reply, budget_gb)
    budget = bench.budget
    natural_rows = bench.rollouts().max_rows
    rows = rows or natural_rows
    echo(f"model {model_path}: prompt {prompt}, reply {reply} tokens; memory budget {budget / GB:.1f} GB, "
         f"engine rows by its rule {natural_rows}, used {rows}")
    bench.warm_up(rows, group_sizes)
    results: dict = {"prompt_tokens": prompt, "reply_tokens": reply, "rows_by_rule": natural_rows,
                     "budget_gb": budget / GB, "plan": bench.plan.describe(bench.sampling.slots_per_row), "groups": []}
    agreement_size = 8 if 8 in group_sizes else group_sizes[0]
    for group_size in group_sizes:
        n_groups = max(1, rows // group_size)
        seeds = list(range(1000 * group_size, 1000 * group_size + n_groups))
        groups, engine = bench.engine(seeds, group_size)
        batched = bench.batch_generate(seeds, group_size, n_groups * group_size)
        seq = bench.sequential(seeds[:1] * sequential)
        row = {"G": group_size, "groups": n_groups, "rows": n_groups * group_size, "engine": engine,
               "batch_generate": batched, "sequential": seq,
               "engine_vs_sequential": engine["tok_s"] / seq["tok_s"],
               "engine_vs_batch_generate": engine["tok_s"] / batched["tok_s"]}
        if group_size == agreement_size:
            results["agreement"] = {"G": group_size, **bench.agreement(groups)}
        results["groups"].append(row)
        echo(f"G={group_size:>2} rows {row['rows']:>4}: engine {engine['tok_s']:,.0f} tok/s, batch_generate "
             f"{batched['tok_s']:,.0f}, sequential {seq['tok_s']:,.0f} -> {row['engine_vs_sequential']:.2f}x sequential, "
             f"{row['engine_vs_batch_generate']:.2f}x batch_generate; peak {engine['peak_gb']:.2f} / "
             f"{batched['peak_gb']:.2f} / {seq['peak_gb']:.2f} GB")
    if prefill_rows:
        results["prefill_memory"] = bench.prefill_memory(prefill_rows)
        p = results["prefill_memory"]
        echo(f"prefill {p['rows']} x {p['prompt_tokens']}: peak {p['peak_gb_all_positions']:.2f} GB with logits at "
             f"every position, {p['peak_gb_last_position']:.2f} GB at the last only")
    if sweep:
        results["rows_sweep"] = bench.rows_sweep(sweep, min(reply, 64))
        echo("rows sweep: " + ", ".join(f"{r['rows']}: {r['tok_s']:,.0f} tok/s" for r in results["rows_sweep"]))
    if "agreement" in results:
        a = results["agreement"]
        echo(f"sampler vs learner: ratio mean {a['ratio_mean']:.5f}, max |d logprob| {a['max_abs_logprob_diff']:.4f} "
             f"over {a['policy_tokens']} tokens (the learner in its dtype against float32: max "
             f"{a['max_abs_logprob_diff_vs_float32']:.4f}, rounding alone)")
    return results
