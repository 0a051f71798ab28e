"""One GRPO update over the LoRA parameters: advantages, micro-batched gradients, AdamW.

The frozen (quantized) base gets no gradient: `nn.value_and_grad(model, ...)` differentiates the
model's trainable parameters only, which after `attach_lora` are the adapters. Micro-batches keep a
group's episodes together so its prompt is computed once (`batching.py`, `forward.py`); their size
is `max_batch_tokens`, or, when that is 0, what the memory plan's workspace holds
(`engine/memory.py`). Gradients of the micro-batches of one optimizer step are summed (the loss
weights already normalise over the whole step), clipped by global norm, and applied; `mx.eval`
closes every micro-batch and every step. An optimizer step whose loss or gradient norm is not
finite is not applied (the adapters and AdamW state stay as they were) and is counted in
`updates_skipped_nonfinite`: one bad batch must not turn every later adapter into NaN.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_map

from ..engine.memory import MemoryPlan
from ..model.parts import model_parts
from ..model.policy import lora_disabled
from ..trajectory import Episode, Group
from .batching import MicroBatch, make_microbatch, make_units, pack_units
from .checkpointing import checkpointed
from .data_parallel import shard_groups, sum_across, sum_scalars, zeros_like_tree
from .distill import token_advantages, topk_reverse_kl
from .forward import policy_logprobs, teacher_topk
from .grpo import LossSettings, group_advantages, policy_loss, token_weights
from .schedule import learning_rate_at
from .settings import TrainerSettings

log = logging.getLogger("artmlx.learner")
FALLBACK_BATCH_TOKENS = 8192  # without a memory plan and with max_batch_tokens = 0


@dataclass
class _StepData:
    episodes: list[Episode]
    advantages: np.ndarray
    groups: list[list[int]]  # indices into `episodes`, one list per group
    skipped_episodes: int = 0  # episodes of zero-variance groups: counted by the seq_mean / constant denominators
    token_advantages: dict | None = None  # episode index -> per-token advantages, for hinted episodes
    teacher_topk: dict | None = None  # episode index -> the teacher's top-K (ids, logprobs), hint_topk > 0


class GRPOTrainer:
    def __init__(self, model: nn.Module, config: TrainerSettings, plan: MemoryPlan | None = None,
                 group: mx.distributed.Group | None = None):
        """`group`: the ranks of a data-parallel learner (`data_parallel.py`); each trains a share of every step."""
        if not isinstance(config, TrainerSettings):
            raise TypeError(f"GRPOTrainer takes TrainerSettings (TrainerSettings.of(config)), "
                            f"not {type(config).__name__}")
        self.model = model
        self.config = config
        self.plan = plan
        self.parts = model_parts(model)
        if config.hint_topk and self.parts.vocab_size and config.hint_topk > self.parts.vocab_size:
            raise ValueError(f"hint_topk = {config.hint_topk} is more than the model's {self.parts.vocab_size} tokens")
        self.group = group if group is not None and group.size() > 1 else None
        self.optimizer = optim.AdamW(
            learning_rate=config.learning_rate,
            betas=list(config.adam_betas),
            weight_decay=config.weight_decay,
        )
        self.optimizer.init(model.trainable_parameters())
        self.step = 0
        self.policy_version = 0
        self._grad_step = self._make_grad_step()

    def _make_grad_step(self):
        """The loss's value and gradient. Compiled per input shape (batching pads lengths to `pad_multiple` to
        keep shapes few), with the loss settings fixed at each trace: `apply` makes a new one."""
        model = self.model
        value_and_grad = nn.value_and_grad(model, self._loss)
        grad_step = lambda *arrays: value_and_grad(model, *arrays)  # noqa: E731
        if not self.config.compile_step:
            return grad_step
        return mx.compile(grad_step, inputs=[model.state], outputs=[model.state])

    @property
    def settings(self) -> LossSettings:
        """The loss's settings, derived from the trainer's (so `apply` changes both at once)."""
        config = self.config
        return LossSettings(config.objective, config.eps_low, config.eps_high, config.kl_coef)

    def apply(self, config: TrainerSettings) -> None:
        """Train from now on with `config` (ART sends the loss and learning rate with every step); the
        optimizer's state is kept, its learning rate follows."""
        if not isinstance(config, TrainerSettings):
            raise TypeError(f"apply takes TrainerSettings, not {type(config).__name__}")
        changed = config != self.config
        self.config = config
        self.optimizer.learning_rate = config.learning_rate
        if changed and config.compile_step:  # a compiled step keeps the settings it was traced with
            self._grad_step = self._make_grad_step()

    def position(self) -> dict:
        """Where training stands, as every metrics row starts: updates done and the policy version."""
        return {"step": self.step, "policy_version": self.policy_version}

    def _loss(self, model, prefix_inputs, prefix_lengths, row_prefix, inputs, targets, positions, gather_back,
              behaviour, advantages, mask, weights, *optional):
        """The micro-batch's loss; `optional` holds, as the config says, the base's logprobs (kl_coef > 0),
        then the hinted teacher's top-K ids, logprobs and mask (hint_topk > 0; `distill.topk_reverse_kl`)."""
        optional = list(optional)
        base_logp = optional.pop(0) if self.config.kl_coef > 0 else None
        arrays = (prefix_inputs, prefix_lengths, row_prefix, inputs, targets, positions, gather_back)
        if not self.config.hint_topk:
            logp = policy_logprobs(self.parts, self.config.temperature, *arrays)
            return policy_loss(logp, behaviour, advantages, mask, weights, self.settings, base_logp)
        topk_ids, topk_teacher, topk_mask = optional
        logp, student_topk = policy_logprobs(self.parts, self.config.temperature, *arrays, extra_targets=topk_ids)
        kl = topk_reverse_kl(student_topk, topk_teacher) * topk_mask  # (n,) at policy positions
        kl_tokens = mx.concatenate([kl, mx.zeros((1,), kl.dtype)])[gather_back].reshape(mask.shape)
        loss, metrics = policy_loss(logp, behaviour, advantages, mask, weights, self.settings, base_logp,
                                    extra_per_token=self.config.hint_weight * kl_tokens)
        metrics["hint_kl_sum"] = mx.stop_gradient(kl.sum())
        metrics["hint_tokens"] = topk_mask.sum()
        return loss, metrics

    def policy_logprobs(self, batch: MicroBatch, temperature: float = 0.0) -> mx.array:
        """Current policy's logprobs (B, T) of the targets at policy positions, 0 elsewhere (no gradient), at
        `temperature` (0: the sampler's)."""
        return policy_logprobs(self.parts, temperature or self.config.temperature, *batch.arrays())

    def checkpoints(self, episodes: list[Episode]) -> bool:
        """Whether this update's layers are checkpointed (`grad_checkpoint`; "auto" asks the memory plan)."""
        setting = self.config.grad_checkpoint
        if setting != "auto":
            return setting == "on"
        if self.plan is None or self.config.lora_dropout > 0 or self.config.max_batch_tokens:
            return False
        return self.plan.needs_checkpointing(max(len(e.tokens) for e in episodes), _policy_fraction(episodes))

    def batch_tokens(self, episodes: list[Episode]) -> int:
        """Padded tokens per micro-batch: the config's, or what the memory plan's workspace holds."""
        if self.config.max_batch_tokens:
            return self.config.max_batch_tokens
        if self.plan is None:
            return FALLBACK_BATCH_TOKENS
        return self.plan.train_tokens(max(len(e.tokens) for e in episodes), _policy_fraction(episodes),
                                      self.checkpoints(episodes))

    def microbatches(self, episodes: list[Episode], advantages: np.ndarray,
                     groups: list[list[int]], token_advantages: dict | None = None,
                     teacher_topk: dict | None = None) -> list[MicroBatch]:
        """The micro-batches of the given groups (each a list of indices into `episodes`)."""
        config = self.config
        budget = self.batch_tokens([episodes[i] for members in groups for i in members])
        units = make_units(episodes, groups, budget, config.pad_multiple)
        return [make_microbatch(episodes, advantages, packed, config.pad_multiple, token_advantages,
                                config.hint_topk, teacher_topk)
                for packed in pack_units(units, budget, config.pad_multiple)]

    def teacher_logprobs(self, episodes: list[Episode], groups: list[list[int]]) -> dict[int, np.ndarray]:
        """For each hinted episode (index into `episodes`), the teacher's logprobs of its sampled tokens, in
        order: the episode re-scored after its teacher prompt (`Episode.teacher_episode`) by the frozen base
        (`hint_teacher = "base"`: LoRA off) or the current policy, without gradient (`distill.py`)."""
        return {i: logp for i, (logp, _) in self.teacher_pass(episodes, groups).items()}

    def teacher_pass(self, episodes: list[Episode], groups: list[list[int]]) -> dict[int, tuple]:
        """`teacher_logprobs`, each with the teacher's top-K at those tokens when `hint_topk` = K > 0: episode
        index -> (logprobs (n,), (ids (n, K), logprobs (n, K)) or None), n the episode's sampled tokens."""
        hinted = [[i for i in members if episodes[i].teacher_prompt is not None] for members in groups]
        hinted = [members for members in hinted if members]
        if not hinted:
            return {}
        teacher = {i: episodes[i].teacher_episode() for members in hinted for i in members}
        order = sorted(teacher)
        local = {i: k for k, i in enumerate(order)}
        batches = self.microbatches([teacher[i] for i in order], np.zeros(len(order), np.float32),
                                    [[local[i] for i in members] for members in hinted])
        out, k_top = {}, self.config.hint_topk
        temperature = self.config.hint_temperature or self.config.temperature
        with lora_disabled(self.model) if self.config.hint_teacher == "base" else contextlib.nullcontext():
            for batch in batches:
                top = None
                if k_top:
                    logp, ids, values = teacher_topk(self.parts, temperature, k_top, *batch.arrays())
                    logp, ids, values = np.array(logp), np.array(ids), np.array(values)
                else:
                    logp = np.array(self.policy_logprobs(batch, temperature))
                mask, at = np.array(batch.mask) > 0, 0
                for row, k in enumerate(batch.episodes):
                    here = int(mask[row].sum())
                    if k_top:  # the policy positions are row-major: this row's are the next `here`
                        top = (ids[at:at + here], values[at:at + here])
                    out[order[k]] = (logp[row][mask[row]], top)
                    at += here
        return out

    def recompute(self, groups: list[Group]) -> tuple[np.ndarray, np.ndarray]:
        """This learner's logprobs of every policy token of `groups` and the sampler's, as flat arrays.

        The same micro-batches and forward as training (no gradient): with unchanged weights their
        difference is the sampler/learner numeric mismatch alone.
        """
        episodes = [e for g in groups for e in g.episodes]
        members, start = [], 0
        for group in groups:
            members.append(list(range(start, start + len(group.episodes))))
            start += len(group.episodes)
        learner, behaviour = [], []
        for batch in self.microbatches(episodes, np.zeros(len(episodes), np.float32), members):
            mask = np.array(batch.mask) > 0
            learner.append(np.array(self.policy_logprobs(batch))[mask])
            behaviour.append(np.array(batch.behaviour_logprobs)[mask])
        return np.concatenate(learner), np.concatenate(behaviour)

    def prepare(self, groups: list[Group]) -> tuple[_StepData, dict]:
        """Advantages per episode; groups with zero reward variance are dropped and counted."""
        if len({len(g.episodes) for g in groups}) == 1:
            rewards = mx.array(np.stack([g.rewards for g in groups]))
            advantages, zero_variance = group_advantages(rewards, self.config.scale_advantages)
            advantages, zero_variance = np.array(advantages), np.array(zero_variance)
        else:  # groups of different sizes (ART groups that lost trajectories): one group at a time
            rows = [group_advantages(mx.array(g.rewards)[None], self.config.scale_advantages) for g in groups]
            advantages = [np.array(a)[0] for a, _ in rows]
            zero_variance = np.array([bool(np.array(z)[0]) for _, z in rows])
            rewards = np.concatenate([g.rewards for g in groups])
        hinted = [self.hints_count(group) for group in groups]
        episodes, episode_advantages, members, hint_members, skipped = [], [], [], [], 0
        for g, group in enumerate(groups):
            if zero_variance[g] and not hinted[g]:  # a flat group with hints still trains through them
                skipped += len(group.episodes)
                continue
            members.append(list(range(len(episodes), len(episodes) + len(group.episodes))))
            if hinted[g]:
                hint_members.append(members[-1])
            episodes += group.episodes
            episode_advantages += advantages[g].tolist()
        stats = {
            "groups": len(groups),
            "groups_zero_variance": int(zero_variance.sum()),
            "reward_mean": float(np.asarray(rewards).mean()),
            "reward_std": float(np.asarray(rewards).std()),
        }
        data = _StepData(episodes, np.asarray(episode_advantages, np.float32), members, skipped)
        stats.update(self._hint_advantages(data, hint_members))
        if any(group.hinted for group in groups) and self.config.hint_group_reward_below:
            stats["hint_groups_frac"] = sum(hinted) / len(groups)
        return data, stats

    def hints_count(self, group: Group) -> bool:
        """Whether the group's hints train this update: it has one, and its mean reward is below
        `hint_group_reward_below` where that is set."""
        return group.hints_count(self.config.hint_group_reward_below)

    def _hint_advantages(self, data: _StepData, hint_groups: list[list[int]]) -> dict:
        """The teacher pass over `hint_groups` (indices into `data.episodes`) and their hinted episodes'
        per-token advantages; its metrics (none without hints)."""
        if not hint_groups:
            return {}
        config = self.config
        started = time.perf_counter()
        teacher = self.teacher_pass(data.episodes, hint_groups)
        teacher_seconds = time.perf_counter() - started
        data.token_advantages, data.teacher_topk, gaps = {}, {}, []
        for i, (logp, top) in teacher.items():
            episode = data.episodes[i]
            mask = np.asarray(episode.policy_mask, bool)
            # with hint_topk the hint acts through the loss's top-K term; the advantage keeps the reward's part
            data.token_advantages[i] = token_advantages(float(data.advantages[i]), mask, np.asarray(episode.logprobs),
                                                        None if top else logp, config.reward_weight,
                                                        config.hint_weight, config.hint_baseline)
            if top:
                data.teacher_topk[i] = top
            gaps.append(logp - np.asarray(episode.logprobs, np.float32)[mask])
        reward_sum = sum(abs(config.reward_weight * float(a)) * e.policy_tokens for a, e in zip(data.advantages, data.episodes))
        gap = np.concatenate(gaps) if gaps else np.zeros(0, np.float32)
        all_tokens = max(1, sum(e.policy_tokens for e in data.episodes))
        return {"hinted_token_frac": len(gap) / all_tokens, "teacher_seconds": teacher_seconds,
                "hint_logratio_mean": float(gap.mean()) if len(gap) else 0.0,
                # how much of the update's advantage came from each term (mean absolute value per token)
                "advantage_reward_abs": reward_sum / all_tokens,
                "advantage_hint_abs": 0.0 if config.hint_topk else float(np.abs(config.hint_weight * gap).sum() / all_tokens)}

    def train_step(self, groups: list[Group]) -> dict:
        """One batch of groups -> `minibatches` optimizer steps. Returns metrics."""
        data, stats = self.prepare(groups)
        self.step += 1
        config = self.config
        learning_rate = learning_rate_at(self.step, config.steps, config.learning_rate, config.lr_schedule,
                                         config.warmup_steps)
        self.optimizer.learning_rate = learning_rate
        totals = {"tokens": 0.0, "ratio_sum": 0.0, "ratio_max": 0.0, "clipped_sum": 0.0,
                  "mismatch_kl_sum": 0.0, "abs_logratio_sum": 0.0, "kl_base_sum": 0.0, "loss": 0.0}
        if self.config.hint_topk:
            totals.update(hint_kl_sum=0.0, hint_tokens=0.0)
        grad_norms, skipped = [], 0
        if data.episodes:
            # Minibatches split whole groups, so a group's episodes stay together (and share their prompt).
            # Dropout in the learner's forward only. Recurrent layers train too: mlx-lm's Gated DeltaNet takes
            # its Metal kernel, which has no gradient, unless the layer is training (then its plain ops).
            self.model.train(self.config.lora_dropout > 0 or bool(self.parts.recurrent))
            for part in np.array_split(np.arange(len(data.groups)), self.config.minibatches):
                if len(part):
                    flat_share = data.skipped_episodes * len(part) / len(data.groups)
                    norm = self._optimizer_step(data, [data.groups[g] for g in part], totals, flat_share)
                    if norm is None:
                        skipped += 1
                    else:
                        grad_norms.append(norm)
            self.model.eval()  # sampling (rollouts, evaluation) never drops out
            if grad_norms:  # the adapters changed: a new policy version
                self.policy_version += 1
        tokens = max(totals["tokens"], 1.0)
        return {
            **stats,
            "episodes_trained": len(data.episodes),
            "tokens_trained": sum(len(e.tokens) for e in data.episodes),
            "policy_tokens": int(totals["tokens"]),
            "loss": totals["loss"] / max(len(grad_norms), 1),  # mean over the optimizer steps applied
            "grad_norm": float(np.mean(grad_norms)) if grad_norms else 0.0,
            "ratio_mean": totals["ratio_sum"] / tokens,
            "ratio_max": totals["ratio_max"],
            "clip_frac": totals["clipped_sum"] / tokens,
            "mismatch_kl": totals["mismatch_kl_sum"] / tokens,
            "abs_logratio_mean": totals["abs_logratio_sum"] / tokens,
            "kl_base": totals["kl_base_sum"] / tokens,
            "updates_skipped_nonfinite": skipped,
            "learning_rate": learning_rate,
            **({"hint_topk_kl": totals["hint_kl_sum"] / max(totals["hint_tokens"], 1.0)} if self.config.hint_topk else {}),
            "grad_checkpointed": bool(totals.get("checkpointed", False)),
        }

    def _optimizer_step(self, data: _StepData, groups: list[list[int]], totals: dict,
                        flat_episodes: float = 0.0) -> float | None:
        """Accumulate the groups' gradients and apply them; the gradient norm, or None if not applied.

        `flat_episodes`: this minibatch's share of the zero-variance groups' episodes (denominators)."""
        config = self.config
        episodes = [data.episodes[i] for members in groups for i in members]
        policy_tokens = sum(e.policy_tokens for e in episodes)
        grads, sums = None, {"loss": 0.0, "ratio_max": 0.0}
        checkpoints = self.checkpoints(episodes)
        totals["checkpointed"] = totals.get("checkpointed", False) or checkpoints
        share = groups
        if self.group is not None:  # this rank's whole groups; the weights above still count the whole step's
            costs = [sum(len(data.episodes[i].tokens) for i in members) for members in groups]
            share = [groups[g] for g in shard_groups(costs, self.group.size())[self.group.rank()]]
        for batch in (self.microbatches(data.episodes, data.advantages, share, data.token_advantages, data.teacher_topk)
                      if share else []):
            weights = token_weights(batch.mask, config.normalization, len(episodes) + flat_episodes, policy_tokens,
                                    config.constant_length)
            base_logp = None
            if config.kl_coef > 0:
                with lora_disabled(self.model):
                    base_logp = mx.stop_gradient(self.policy_logprobs(batch))
            arrays = [*batch.arrays(), batch.behaviour_logprobs, batch.advantages, batch.mask, weights]
            if base_logp is not None:
                arrays.append(base_logp)
            if config.hint_topk:
                arrays += [batch.topk_ids, batch.topk_teacher, batch.topk_mask]
            with checkpointed(self.model, checkpoints):
                (loss, metrics), micro_grads = self._grad_step(*arrays)
            grads = micro_grads if grads is None else tree_map(mx.add, grads, micro_grads)
            mx.eval(grads, loss, metrics)
            sums["loss"] += loss.item()
            for name, value in metrics.items():
                sums[name] = max(sums[name], value.item()) if name == "ratio_max" else sums.get(name, 0.0) + value.item()
        if grads is None:  # a rank whose share of this step is empty
            grads = zeros_like_tree(self.model.trainable_parameters())
        if self.group is not None:
            grads = sum_across(grads, self.group)
            sums = sum_scalars({n: sums.get(n, 0.0) for n in totals if n != "checkpointed"}, self.group, ("ratio_max",))
        step_loss = sums.pop("loss")
        for name, value in sums.items():
            totals[name] = max(totals[name], value) if name == "ratio_max" else totals[name] + value
        grads, grad_norm = optim.clip_grad_norm(grads, config.max_grad_norm or float("inf"))
        norm = grad_norm.item()
        if not (math.isfinite(norm) and math.isfinite(step_loss)):
            log.warning("update %d: %s is not finite; this optimizer step is skipped and the adapters are kept",
                        self.step, "the loss" if not math.isfinite(step_loss) else "the gradient norm")
            return None
        totals["loss"] += step_loss
        self.optimizer.update(self.model, grads)
        mx.eval(self.model.trainable_parameters(), self.optimizer.state)
        return norm


def _policy_fraction(episodes: list[Episode]) -> float:
    return sum(e.policy_tokens for e in episodes) / max(1, sum(len(e.tokens) for e in episodes))
