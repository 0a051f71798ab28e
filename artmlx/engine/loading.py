"""Opening a policy for a process: one startup sequence for every command that loads a model.

The order matters: the memory budget goes to MLX (`apply_limits`) before the model is loaded, so the
load itself is held to it; a training process picks MLX's own attention kernels on CUDA before its
first attention (`model/backend.prefer_mlx_attention`); the plan is sized from the loaded model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ..model.backend import prefer_mlx_attention
from ..model.policy import LoraSpec, load_policy, load_policy_with_adapters
from .memory import MemoryPlan, apply_limits, plan_for, resolve_budget


@dataclass
class OpenPolicy:
    model: nn.Module
    tokenizer: object
    trainable: int  # parameters the adapters train (0 for saved adapters, which are only evaluated or served)
    budget: int  # bytes
    plan: MemoryPlan


def open_policy(model_name: str | None, spec: LoraSpec | None = None, budget_gb: float = 0.0, *,
                training: bool = False, seed: int | None = None, adapters: Path | None = None) -> OpenPolicy:
    """The base with fresh LoRA adapters of `spec` (or the saved `adapters` on their recorded base),
    loaded inside the process's budget (`budget_gb`, 0 for the default share), with its memory plan.
    `seed` seeds MLX's global generator before the adapters are initialised."""
    if training:
        prefer_mlx_attention()
    budget = resolve_budget(budget_gb)
    apply_limits(budget)
    if seed is not None:
        mx.random.seed(seed)
    if adapters is not None:
        model, tokenizer = load_policy_with_adapters(Path(adapters), model_name)
        trainable = 0
    else:
        model, tokenizer, trainable = load_policy(model_name, spec or LoraSpec())
    return OpenPolicy(model, tokenizer, trainable, budget, plan_for(model, budget))
