"""The GGUF architectures artmlx imports: their mlx-lm config, weight names and layout fixes."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

# llama.cpp's tensor names (per block: blk.N.<name>) -> mlx-lm's module paths.
_BLOCK = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
_GEMMA3_BLOCK = {**_BLOCK, "ffn_norm": "pre_feedforward_layernorm", "post_attention_norm": "post_attention_layernorm",
                 "post_ffw_norm": "post_feedforward_layernorm"}
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK_NAME = re.compile(r"^blk\.(\d+)\.([a-z_0-9]+)\.(weight|bias)$")
_TOP_NAME = re.compile(r"^([a-z_0-9]+)\.(weight|bias)$")


@dataclass(frozen=True)
class ArchSpec:
    model_type: str
    block: dict
    config: Callable  # GgufFile -> mlx-lm config.json (without vocabulary and quantization)
    row_order: Callable | None = None  # (target, config, rows) -> a permutation of the rows, or None
    vector_fix: Callable = lambda target, values: values
    consumed: frozenset = field(default_factory=frozenset)  # tensors read into the config, not weights
    default_template: str = ""

    def target_name(self, name: str) -> str | None:
        if match := _BLOCK_NAME.match(name):
            index, part, kind = match.groups()
            module = self.block.get(part)
            return None if module is None else f"model.layers.{index}.{module}.{kind}"
        if (match := _TOP_NAME.match(name)) and match.group(1) in _TOP:
            return f"{_TOP[match.group(1)]}.{match.group(2)}"
        return None


def _common(gguf, arch: str, model_type: str) -> dict:
    get, need = (lambda key, default=None: gguf.get(f"{arch}.{key}", default)), (lambda key: gguf.require(f"{arch}.{key}"))
    if get("expert_count"):
        raise ValueError(f"{gguf.path.name}: a mixture-of-experts {arch} file (expert_count {get('expert_count')}) "
                         "is not supported")
    heads = int(need("attention.head_count"))
    hidden = int(need("embedding_length"))
    config = {
        "model_type": model_type,
        "hidden_size": hidden,
        "num_hidden_layers": int(need("block_count")),
        "intermediate_size": int(need("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(get("context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in gguf.tensors,
        "head_dim": int(get("attention.key_length", hidden // heads)),
    }
    scaling = get("rope.scaling.type")
    if scaling and scaling != "none":
        if scaling != "linear":
            raise ValueError(f"{gguf.path.name}: rotary scaling {scaling!r} is not supported (linear is)")
        config["rope_scaling"] = {"type": "linear", "factor": float(need("rope.scaling.factor"))}
    return config


def _llama_config(gguf) -> dict:
    config = _common(gguf, "llama", "llama")
    if "rope_freqs.weight" in gguf.tensors:
        config["rope_scaling"] = _llama3_scaling(gguf, config)
    return config


def _llama3_scaling(gguf, config: dict) -> dict:
    """Llama 3.1+'s rotary scaling, recognised from the frequency factors llama.cpp stored."""
    type_name, raw, shape = gguf.raw("rope_freqs.weight")
    from .gguf_tensors import dequantized

    stored = dequantized(type_name, raw, shape)
    dims = config["head_dim"]
    wavelengths = 2 * np.pi * config["rope_theta"] ** (np.arange(0, dims, 2, dtype=np.float64) / dims)
    for factor in (8.0, 16.0, 32.0, 4.0, 2.0):
        for original in (8192, 4096, 16384, 32768):
            low, high = original / 1.0, original / 4.0
            smooth = (original / wavelengths - 1.0) / (4.0 - 1.0)
            expected = np.where(wavelengths < high, 1.0,
                                np.where(wavelengths > low, factor, 1.0 / ((1 - smooth) / factor + smooth)))
            if np.allclose(stored, expected, rtol=1e-3):
                return {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": original}
    raise ValueError(f"{gguf.path.name}: its rope_freqs tensor matches no Llama 3 rotary scaling (not supported)")


def _unpermute(target: str, config: dict, rows: int):
    """llama.cpp's Q/K row order for interleaved rotary, undone: per head, rows (0, 2, 4, ..., 1, 3, ...)
    were written as (0, 1, 2, 3, ...)."""
    if target.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias")):
        heads = config["num_attention_heads"]
    elif target.endswith(("self_attn.k_proj.weight", "self_attn.k_proj.bias")):
        heads = config["num_key_value_heads"]
    else:
        return None
    half = rows // heads // 2
    # stored row (h, i, j) <- original row (h, j, i): original = stored.reshape(h, half, 2).swap -> (h, 2, half)
    return np.arange(rows).reshape(heads, half, 2).transpose(0, 2, 1).reshape(rows)


def _qwen2_config(gguf) -> dict:
    return _common(gguf, "qwen2", "qwen2")


def _qwen3_config(gguf) -> dict:
    return _common(gguf, "qwen3", "qwen3")


def _gemma3_config(gguf) -> dict:
    config = _common(gguf, "gemma3", "gemma3_text")
    del config["tie_word_embeddings"]  # mlx-lm's gemma3_text ties when the weights have no lm_head
    layers = config["num_hidden_layers"]
    big = layers >= 62  # the 27B: llama.cpp scales queries by hidden / heads there, by head_dim elsewhere
    config.update(
        sliding_window=int(gguf.get("gemma3.attention.sliding_window", 512)),
        sliding_window_pattern=_window_period(gguf, layers),
        rope_local_base_freq=10000.0,
        query_pre_attn_scalar=config["hidden_size"] // config["num_attention_heads"] if big else config["head_dim"],
    )
    if "rope_scaling" in config:
        config["rope_scaling"] = {"rope_type": "linear", "factor": config["rope_scaling"]["factor"]}
    return config


def _window_period(gguf, layers: int) -> int:
    """Every how many layers one is global: the file's `sliding_window_pattern` (a period, or a flag per layer,
    true for a window layer), else llama.cpp's 6 for Gemma 3."""
    pattern = gguf.get("gemma3.attention.sliding_window_pattern")
    if pattern is None:
        return 6
    if isinstance(pattern, (int, np.integer)):
        return int(pattern)
    flags = [bool(flag) for flag in pattern]
    for period in range(1, layers + 1):
        if flags == [(i + 1) % period != 0 for i in range(len(flags))]:
            return period
    raise ValueError(f"{gguf.path.name}: its sliding-window layers {flags} repeat with no period (mlx-lm's gemma3_text "
                     "needs one global layer every N)")


def _gemma_norm(target: str, values: np.ndarray) -> np.ndarray:
    return values - 1.0 if target.endswith("norm.weight") else values


# Gemma 3's chat template (its tokenizer_config.json, text only), for files that carry none: the
# base model's GGUF conversions do not.
GEMMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
# ChatML, for Qwen and SmolLM files without a template.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

ARCHITECTURES = {
    "llama": ArchSpec("llama", _BLOCK, _llama_config, row_order=_unpermute, consumed=frozenset({"rope_freqs.weight"}),
                      default_template=CHATML_TEMPLATE),
    "qwen2": ArchSpec("qwen2", _BLOCK, _qwen2_config, default_template=CHATML_TEMPLATE),
    "qwen3": ArchSpec("qwen3", _BLOCK, _qwen3_config, default_template=CHATML_TEMPLATE),
    "gemma3": ArchSpec("gemma3_text", _GEMMA3_BLOCK, _gemma3_config, vector_fix=_gemma_norm,
                       default_template=GEMMA3_TEMPLATE),
}


def chat_template_for(gguf, spec: ArchSpec) -> tuple[str, str]:
    """The file's chat template, or the architecture's standard one (said so), and where it came from."""
    template = gguf.get("tokenizer.chat_template")
    if template:
        return str(template), "from the file"
    tokens = set(gguf.get("tokenizer.ggml.tokens", []))
    needed = ("<start_of_turn>", "<end_of_turn>") if spec.model_type.startswith("gemma") else ("<|im_start|>", "<|im_end|>")
    if not all(token in tokens for token in needed):
        raise ValueError(f"{gguf.path.name} has no chat template and its vocabulary lacks {needed}: artmlx cannot "
                         "build chat prompts for it")
    name = "Gemma 3's" if spec.model_type.startswith("gemma") else "ChatML"
    return spec.default_template, f"{name} standard template (the file has none)"
