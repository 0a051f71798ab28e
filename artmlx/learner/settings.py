"""The settings the GRPO trainer reads: a narrow, frozen view of the run's configuration.

`TrainConfig` (`artmlx/config.py`) documents and validates every field; the trainer takes only
these, so what it depends on is written here and nothing else reaches it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class TrainerSettings:
    temperature: float  # the sampler's: the recomputed logprobs must be the behaviour policy's
    objective: str
    eps_low: float
    eps_high: float
    kl_coef: float
    normalization: str
    constant_length: int
    scale_advantages: bool
    learning_rate: float  # the peak of the schedule
    lr_schedule: str  # "constant", "linear" or "cosine" (`schedule.py`); a config's "auto" arrives as "linear"
    warmup_steps: int
    steps: int  # the run's updates: where a decaying schedule ends
    adam_betas: tuple[float, float]
    weight_decay: float
    max_grad_norm: float
    minibatches: int
    max_batch_tokens: int
    pad_multiple: int
    compile_step: bool
    grad_checkpoint: str
    lora_dropout: float
    hint_teacher: str  # directive hints (`distill.py`): "base" (LoRA off) or "policy"
    hint_weight: float
    hint_temperature: float  # the teacher's; 0: the sampler's
    hint_baseline: str  # "none" or "episode" (`distill.token_advantages`)
    hint_topk: int  # 0: the token-level teacher advantage; K: the top-K reverse KL (`distill.topk_reverse_kl`)
    reward_weight: float
    hint_group_reward_below: float  # 0: every group's hints; r > 0: only groups whose mean reward is below r

    @classmethod
    def of(cls, config) -> "TrainerSettings":
        """These fields of a `TrainConfig`."""
        values = {f.name: getattr(config, f.name) for f in fields(cls)}
        values["adam_betas"] = tuple(values["adam_betas"])
        if values["lr_schedule"] == "auto":  # MLXBackend replaces it by "constant" (ART gives each step's rate)
            values["lr_schedule"] = "linear"
        return cls(**values)


def trainer_settings(overrides: dict | None = None) -> TrainerSettings:
    """The defaults with `overrides`, validated as a run's configuration is."""
    from ..config import load_config

    return TrainerSettings.of(load_config(None, overrides or {}))
