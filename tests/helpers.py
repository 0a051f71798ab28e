"""Shared test helpers: the embedded model with LoRA, and adapters moved off zero."""

import contextlib
import os

import mlx.core as mx
from mlx.utils import tree_flatten

from artmlx.model.policy import LoraSpec, load_policy


def tiny_policy(rank: int = 8, perturb: float = 0.0, seed: int = 0):
    """The embedded model with fresh LoRA; `perturb` > 0 makes the adapters non-zero."""
    mx.random.seed(seed)
    model, tokenizer, _ = load_policy("tiny", LoraSpec(rank=rank, scale=20.0))
    if perturb:
        noisy = [(k, mx.random.normal(v.shape) * perturb) for k, v in tree_flatten(model.trainable_parameters())]
        model.load_weights(noisy, strict=False)
        mx.eval(model.parameters())
    return model, tokenizer



def learner_logprobs(model, groups, temperature: float, **settings):
    """The learner's recomputed logprobs and the sampler's at every policy token of `groups` (numpy)."""
    from artmlx.learner.settings import trainer_settings
    from artmlx.learner.trainer import GRPOTrainer

    return GRPOTrainer(model, trainer_settings({"temperature": temperature, **settings})).recompute(groups)


TINY_DIMS = {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6, "vocab_size": 128,
             "max_position_embeddings": 4096, "tie_word_embeddings": True}
"""Small dimensions every family's config below shares (divisible by the 4-bit group size, 64)."""

FAMILY_CONFIGS = {
    "qwen3": {"model_type": "qwen3", **TINY_DIMS, "rope_theta": 10000.0},
    # mixture of experts (Qwen3-30B-A3B's family): 4-bit experts (SwitchGLU) in every layer
    "qwen3_moe": {"model_type": "qwen3_moe", **TINY_DIMS, "rope_theta": 10000.0, "num_experts": 4,
                  "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [],
                  "moe_intermediate_size": 64, "norm_topk_prob": True},
    # Ministral 3 as published: a multimodal wrapper whose config nests the language model
    "mistral3": {"model_type": "mistral3", "text_config": {
        "model_type": "ministral3", **TINY_DIMS, "rope_parameters": {
            "rope_theta": 10000.0, "rope_type": "default", "llama_4_scaling_beta": 0.1,
            "original_max_position_embeddings": 4096}}},
    # a hybrid: short-convolution layers (ArraysCache) and attention layers
    "lfm2": {"model_type": "lfm2", **TINY_DIMS, "norm_eps": 1e-5, "conv_bias": False, "conv_L_cache": 3,
             "block_dim": 64, "block_multiple_of": 64, "block_ffn_dim_multiplier": 1.0,
             "block_auto_adjust_ff_dim": False, "block_ff_dim": 128, "full_attn_idxs": [1]},
    # Qwen3.5 as published: a multimodal wrapper; layer 0 Gated DeltaNet (ArraysCache), layer 1 attention
    "qwen3_5": {"model_type": "qwen3_5", "text_config": {
        "model_type": "qwen3_5_text", **TINY_DIMS, "linear_num_value_heads": 4, "linear_num_key_heads": 2,
        "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
        "full_attention_interval": 2, "rope_parameters": {
            "type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 0]}}},
    # Qwen3-Next: the same hybrid, flat config, mixture-of-experts layers
    "qwen3_next": {"model_type": "qwen3_next", **TINY_DIMS, "linear_num_value_heads": 4, "linear_num_key_heads": 2,
                   "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
                   "full_attention_interval": 2, "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                   "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1,
                   "shared_expert_intermediate_size": 64, "moe_intermediate_size": 64, "norm_topk_prob": True,
                   "mlp_only_layers": []},
    # Gemma 4's text model: sliding and full layers of different head sizes, per-layer input embeddings, and
    # KV-shared layers (the last 2 reuse the keys and values of the last earlier layer of their kind)
    "gemma4_text": {"model_type": "gemma4_text", **TINY_DIMS, "num_hidden_layers": 4, "global_head_dim": 32,
                    "num_kv_shared_layers": 2, "sliding_window": 8, "sliding_window_pattern": 2,
                    "hidden_size_per_layer_input": 64, "vocab_size_per_layer_input": 128,
                    "final_logit_softcapping": 30.0, "use_double_wide_mlp": True},
    # Gemma 3 and Gemma 4 as published (4B and up): multimodal wrappers whose config nests the text model; the
    # wrapper's vocabulary size is the one that counts
    "gemma3": {"model_type": "gemma3", "vocab_size": 128, "text_config": {
        "model_type": "gemma3_text", **TINY_DIMS, "sliding_window": 8, "sliding_window_pattern": 2,
        "query_pre_attn_scalar": 16}},
    "gemma4": {"model_type": "gemma4", "vocab_size": 128, "text_config": {
        "model_type": "gemma4_text", **TINY_DIMS, "num_hidden_layers": 4, "global_head_dim": 32,
        "num_kv_shared_layers": 2, "sliding_window": 8, "sliding_window_pattern": 2,
        "hidden_size_per_layer_input": 64, "vocab_size_per_layer_input": 128, "final_logit_softcapping": 30.0}},
    # a pure state-space model: its layers ignore padding masks, so it is refused by name
    "mamba": {"model_type": "mamba", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 128,
              "state_size": 16, "num_hidden_layers": 2, "conv_kernel": 4, "use_bias": False, "use_conv_bias": True,
              "time_step_rank": 64, "tie_word_embeddings": True},
    # sliding-window layers (mlx-lm makes RotatingKVCache for them)
    "gemma3_text": {"model_type": "gemma3_text", **TINY_DIMS, "sliding_window": 8, "sliding_window_pattern": 2,
                    "query_pre_attn_scalar": 16},
    "olmo3": {"model_type": "olmo3", **TINY_DIMS, "sliding_window": 8, "rope_theta": 10000.0,
              "layer_types": ["sliding_attention", "full_attention"]},
    # sliding window, attention sinks and 4-bit mixture-of-experts layers (SwitchGLU)
    "gpt_oss": {"model_type": "gpt_oss", **TINY_DIMS, "intermediate_size": 64, "num_local_experts": 4,
                "num_experts_per_tok": 2, "sliding_window": 8, "rope_theta": 10000.0,
                "layer_types": ["sliding_attention", "full_attention"]},
}


def family_folder(root, family: str, name: str = "", **overrides):
    """A tiny random-weight 4-bit folder of an mlx-lm model family (its own model class lays out the
    parameters), with the embedded model's tokenizer: what `mlx_lm.load` and artmlx load as a download."""
    import json
    import shutil
    from pathlib import Path

    from artmlx.model.synth import parameter_layout, random_tensors
    from artmlx.model.tiny import tiny_model_path

    folder = Path(root) / (name or family)
    config = {**json.loads(json.dumps(FAMILY_CONFIGS[family])), **overrides,
              "quantization": {"group_size": 64, "bits": 4, "mode": "affine"}}
    config = {key: value for key, value in config.items() if value is not None}  # an override of None drops a key
    tiny = tiny_model_path()
    config["eos_token_id"] = json.loads((tiny / "config.json").read_text()).get("eos_token_id")
    folder.mkdir(parents=True)
    mx.save_safetensors(str(folder / "model.safetensors"), dict(random_tensors(parameter_layout(config), seed=3)),
                        metadata={"format": "mlx"})
    (folder / "config.json").write_text(json.dumps(config))
    for path in tiny.iterdir():
        if path.name.startswith(("tokenizer", "special_tokens", "chat_template", "vocab", "merges")):
            shutil.copy(path, folder / path.name)
    return folder


@contextlib.contextmanager
def per_call_dequantizing():
    """Load models with the large 4-bit layers that dequantize per product (model/backend.py), not the dense base
    a small model gets on the CPU: the path of the GPU's prefill and of CPU models over the dense-base limit."""
    saved = os.environ.get("ARTMLX_DENSE_BASE_GB")
    os.environ["ARTMLX_DENSE_BASE_GB"] = "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("ARTMLX_DENSE_BASE_GB", None)
        else:
            os.environ["ARTMLX_DENSE_BASE_GB"] = saved
