"""ART's knobs mapped onto artmlx's: `backend.train(...)` keywords, `TrainableModel(lora_config=...)`,
`_internal_config` and the OpenAI server config. Every name ART defines is implemented, accepted with
its meaning here stated, or refused by name; none is dropped without a word.

`backend.train` keywords (openpipe-art 0.5.18 to 0.5.23, `LocalBackend.train`'s signature):
- implemented: `learning_rate`; `loss_fn` "cispo" | "ppo" (with `importance_sampling_level`
  "sequence", "ppo" is GSPO's sequence ratio); `epsilon` / `epsilon_high` (the clip range);
  `scale_rewards` / `normalize_advantages` (advantages divided by the group's reward std);
  `kl_penalty_coef` (a k3 KL to the base model in the loss, from the current learner's logprobs,
  `kl_penalty_source` "current_learner"; reference step 0 is the base: step 0 is the fresh adapter,
  every LoRA B zero); `save_checkpoint`; `verbose`.
- accepted, meaning stated (`NOTED`): knobs of how ART's trainers lay out memory or disk, which
  artmlx decides by itself.
- refused when set away from their default (`INERT`): the rest.
"""

from __future__ import annotations

import math
from dataclasses import replace

from ..model.policy import LoraSpec

NOTED = {
    "logprob_calculation_chunk_size": "memory only: artmlx's learner sizes its micro-batches to the memory budget",
    "grad_accumulation_sequences": "memory only: artmlx's learner sizes its micro-batches to the memory budget "
                                   "(one optimizer step per train call either way)",
    "packed_sequence_length": "memory only: artmlx does not pack sequences; the memory plan sizes micro-batches",
    "optimizer_save_interval": "every artmlx checkpoint holds the AdamW state, so it is saved at every interval",
    "final_training_step": "ART saves the optimizer at its last step; every artmlx checkpoint holds it already",
}
INERT = {"loss_fn_config": None, "adam_params": None, "kl_ref_adapter_path": None, "advantage_balance": 0.0,
         "max_negative_advantage_importance_sampling_weight": None, "mask_prob_ratio": False,
         "kimi_k2_tau": None, "precalculate_logprobs": False, "allow_training_without_logprobs": False,
         "plot_tensors": False, "truncated_importance_sampling": None,
         "scale_learning_rate_by_reward_std_dev": False, "num_trajectories_learning_rate_multiplier_power": 0.0}
IMPLEMENTED = {"learning_rate", "loss_fn", "epsilon", "epsilon_high", "scale_rewards", "normalize_advantages",
               "kl_penalty_coef", "kl_penalty_reference_step", "kl_penalty_source", "importance_sampling_level",
               "save_checkpoint", "verbose"}


def train_settings(kwargs: dict, eps_low: float, eps_high: float) -> dict:
    """The settings of one `backend.train` call (defaults: ART's), or the error naming the argument."""
    unknown = sorted(set(kwargs) - IMPLEMENTED - set(NOTED) - set(INERT))
    if unknown:
        raise TypeError(f"MLXBackend.train got unexpected keyword arguments {unknown}")
    active = sorted(name for name, default in INERT.items() if name in kwargs and kwargs[name] != default)
    if active:
        raise ValueError(f"MLXBackend does not implement {active}; leave them at their defaults")
    loss_fn = kwargs.get("loss_fn", "cispo")
    if loss_fn not in ("cispo", "ppo"):
        raise ValueError(f"loss_fn must be 'cispo' or 'ppo', got {loss_fn!r}")
    level = kwargs.get("importance_sampling_level", "token")
    if level not in ("token", "sequence") or (level == "sequence" and loss_fn != "ppo"):
        raise ValueError(f"importance_sampling_level={level!r} with loss_fn={loss_fn!r} is not implemented: "
                         "artmlx has 'token', and 'sequence' with loss_fn='ppo' (GSPO)")
    kl_coef = float(kwargs.get("kl_penalty_coef", 0.0))
    reference = kwargs.get("kl_penalty_reference_step")
    if reference not in (None, 0):
        raise ValueError(f"kl_penalty_reference_step={reference}: artmlx's KL reference is the base model "
                         "(step 0); leave it None or 0")
    if kl_coef > 0 and kwargs.get("kl_penalty_source", "current_learner") != "current_learner":
        raise ValueError("kl_penalty_source='sample' is not implemented: artmlx computes the KL term from the "
                         "current learner's logprobs ('current_learner')")
    for name in ("optimizer_save_interval", "final_training_step", "grad_accumulation_sequences",
                 "logprob_calculation_chunk_size", "packed_sequence_length"):
        value = kwargs.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive whole number, got {value!r}")
    epsilon = kwargs.get("epsilon")
    epsilon_high = kwargs.get("epsilon_high", epsilon)
    scale = kwargs.get("scale_rewards", True) and kwargs.get("normalize_advantages", True)
    return {"learning_rate": float(kwargs.get("learning_rate", 5e-6)),
            "objective": "gspo" if level == "sequence" else loss_fn,
            "eps_low": eps_low if epsilon is None else float(epsilon),
            "eps_high": eps_high if epsilon_high is None else float(epsilon_high),
            "scale_advantages": bool(scale), "kl_coef": kl_coef,
            "save_checkpoint": bool(kwargs.get("save_checkpoint", True)), "verbose": bool(kwargs.get("verbose"))}


# TrainableModel(lora_config=...) keys (ART's dev.LoRAConfig), PEFT's meaning.
_LORA_DEFAULTS = {"bias": "none", "layers_to_transform": None, "layers_pattern": None, "modules_to_save": None,
                  "init_weights": True, "loftq_config": None, "temporary_location": None, "random_state": None}
_LORA_NOTED = {"use_gradient_checkpointing": "memory only: artmlx's learner sizes micro-batches to its budget",
               "max_seq_length": "the longest prompt the server accepts"}


def lora_spec(lora_config: dict | None, spec: LoraSpec) -> tuple[LoraSpec, int | None]:
    """`spec` with ART's LoRA settings applied: rank; alpha -> mlx-lm's scale alpha / rank (PEFT's
    scaling; alpha / sqrt(rank) with use_rslora); dropout; target_modules (module names such as
    "q_proj", matched in every layer). Returns (spec, max_seq_length or None)."""
    if not lora_config:
        return spec, None
    config = dict(lora_config)
    unknown = sorted(set(config) - {"rank", "alpha", "dropout", "target_modules", "use_rslora"}
                     - set(_LORA_DEFAULTS) - set(_LORA_NOTED))
    if unknown:
        raise ValueError(f"lora_config has keys ART does not define: {unknown}")
    active = sorted(k for k, default in _LORA_DEFAULTS.items() if k in config and config[k] not in (default, None)
                    and not (k == "init_weights" and config[k] is True))
    if active:
        raise ValueError(f"lora_config {active} are not implemented by MLXBackend; leave them unset")
    rank = int(config.get("rank", spec.rank))
    alpha = float(config.get("alpha", spec.scale * rank))
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    targets = config.get("target_modules")
    keys = tuple(targets) if targets else spec.keys
    dropout = float(config.get("dropout", spec.dropout))
    return replace(spec, rank=rank, scale=scale, dropout=dropout, keys=keys), config.get("max_seq_length")


# TrainableModel(_internal_config=...) keys: ART's dev.InternalModelConfig.
_INTERNAL_NOTED = {
    "init_args": {"max_seq_length": "the longest prompt the server accepts",
                  "gpu_memory_utilization": "artmlx sizes memory from its own budget (memory_budget_gb)",
                  "load_in_4bit": "the base is loaded as its folder stores it (mlx-community models are 4-bit)",
                  "fast_inference": "the one engine serves and trains"},
    "engine_args": {"enforce_eager": "MLX has no CUDA graphs: always eager",
                    "gpu_memory_utilization": "artmlx sizes memory from its own budget (memory_budget_gb)",
                    "max_model_len": "the longest prompt the server accepts"},
}


def internal_settings(internal: dict | None) -> dict:
    """What `_internal_config` sets here: {"max_prompt_tokens": N, "chat_template_kwargs": {...}} (either
    may be missing); any key artmlx does not implement or note is refused by name."""
    out: dict = {}
    for key, value in dict(internal or {}).items():
        if value in (None, {}, []):
            continue
        if key == "chat_template_kwargs":
            if not isinstance(value, dict):
                raise ValueError("_internal_config['chat_template_kwargs'] must be a dict")
            out["chat_template_kwargs"] = dict(value)
        elif key in _INTERNAL_NOTED:
            for name, setting in dict(value).items():
                if name not in _INTERNAL_NOTED[key]:
                    raise ValueError(f"_internal_config[{key!r}][{name!r}] is not implemented by MLXBackend; "
                                     f"implemented or noted: {sorted(_INTERNAL_NOTED[key])}")
                if name in ("max_seq_length", "max_model_len") and setting is not None:
                    out["max_prompt_tokens"] = int(setting)
        else:
            raise ValueError(f"_internal_config[{key!r}] is not implemented by MLXBackend")
    return out


def server_settings(config: dict | None) -> dict:
    """ART's OpenAI server config (`model.register(backend, _openai_client_config)`): server_args
    host, port and api_key are honoured; everything else is refused by name."""
    out = {}
    for key, value in dict(config or {}).items():
        if key != "server_args":
            if value:
                raise ValueError(f"OpenAI server config {key!r} is not implemented by MLXBackend")
            continue
        for name, setting in dict(value or {}).items():
            if name not in ("host", "port", "api_key"):
                raise ValueError(f"server_args[{name!r}] is not implemented by MLXBackend (host, port, api_key are)")
            out[name] = setting
    return out
