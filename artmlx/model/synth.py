"""Benchmark models: real architectures and vocabularies with random 4-bit weights, built offline.

`artmlx model synth ARCH --out DIR` writes an ordinary mlx-lm model folder (`config.json`,
`model-*.safetensors`, a Hugging Face tokenizer with a chat template) whose shapes are those of a
published model: same layers, heads, KV heads, hidden and MLP sizes, vocabulary, tied or untied
head, quantized to 4 bits with group size 64 as mlx-community's `-4bit` conversions are. The weights
are random, so it answers nonsense; speed and memory, which depend only on shapes, are real. It
exists so that benchmarks run where nothing can be downloaded. For real work `--model` takes a hub
id or a local folder, as always.

How the folder is made:
- Parameter names and shapes come from mlx-lm's own model class, instantiated lazily and quantized
  (nothing is evaluated), so every architecture mlx-lm knows has exactly the layout it loads.
- Each 4-bit matrix is random packed codes with one affine scale/bias per tensor chosen so the
  dequantized weights have mean 0 and std 1/sqrt(fan_in) (embeddings: 0.02): activations stay finite
  and the next-token distribution is close to uniform over the vocabulary, so a reply runs to its
  token limit (an end-of-turn token is 1 in ~150,000) and lengths are set by the workload.
- The tokenizer is byte-level BPE of the real vocabulary size: the 256 byte symbols, then words
  " a".." zz".." zzz" and four-letter words built by merges until the regular vocabulary is full, then
  the family's special tokens (Qwen's ChatML ones, Llama 3's header and end-of-turn ones, GPT-OSS's
  harmony ones) at their real ids; Gemma's come first, from id 0, as in its vocabulary. A space followed
  by a lowercase three-letter word is exactly one token, which is how the synthetic environment sets
  prompt lengths in tokens. GPT-OSS's template is harmony's final channel only (no reasoning, no tools).
"""

from __future__ import annotations

import json
import shutil
import string
import tempfile
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path

import numpy as np

GROUP_SIZE = 64
BITS = 4
SHARD_BYTES = 2 << 30

QWEN_SPECIALS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
]
QWEN_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3_SPECIALS = (
    ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
     "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
     "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
    + [f"<|reserved_special_token_{i}|>" for i in range(3, 248)]
)
LLAMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n{{ message['content'] }}<|eot_id|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


GEMMA_SPECIALS = (["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "[@BOS@]"] + [f"<unused{i}>" for i in range(99)]
                  + ["<start_of_turn>", "<end_of_turn>"])
# Gemma's template folds a system message into the first user turn and calls the assistant "model"
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}{% set prefix = messages[0]['content'] + '\n\n' %}"
    "{% set turns = messages[1:] %}{% else %}{% set prefix = '' %}{% set turns = messages %}{% endif %}"
    "{% for message in turns %}"
    "<start_of_turn>{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{{ (prefix if loop.first else '') + message['content'] }}<end_of_turn>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
# GPT-OSS's o200k_harmony specials from id 199,998 (the reserved ids between them included)
HARMONY_NAMES = {199998: "<|startoftext|>", 199999: "<|endoftext|>", 200002: "<|return|>", 200003: "<|constrain|>",
                 200005: "<|channel|>", 200006: "<|start|>", 200007: "<|end|>", 200008: "<|message|>",
                 200012: "<|call|>", 200018: "<|endofprompt|>"}
HARMONY_SPECIALS = [HARMONY_NAMES.get(i, f"<|reserved_{i}|>") for i in range(199998, 200019)]
# the harmony format's final channel only (no analysis channel, no tools): what a reply without reasoning renders as
HARMONY_TEMPLATE = (
    "{% for message in messages %}"
    "<|start|>{{ message['role'] }}{% if message['role'] == 'assistant' %}<|channel|>final{% endif %}"
    "<|message|>{{ message['content'] }}<|end|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant<|channel|>final<|message|>{% endif %}"
)


@dataclass(frozen=True)
class Family:
    """Tokenizer conventions of a model family: its specials follow the regular tokens (Qwen, Llama,
    GPT-OSS) or, with `specials_first`, come before them from id 0 (Gemma)."""

    regular_tokens: int
    specials: list = field(hash=False)
    chat_template: str = ""
    eos: tuple[str, ...] = ()
    bos: str | None = None
    pad: str | None = None
    specials_first: bool = False

    def special_ids(self) -> dict[str, int]:
        base = 0 if self.specials_first else self.regular_tokens
        return {name: base + i for i, name in enumerate(self.specials)}


QWEN2 = Family(151643, QWEN_SPECIALS, QWEN_TEMPLATE, ("<|im_end|>", "<|endoftext|>"), None, "<|endoftext|>")
# Qwen3.5's 248,320-token vocabulary: the same specials in the same order from id 248,044 (its published
# config puts <|vision_start|> at 248,053, <|image_pad|> at 248,056 and <|video_pad|> at 248,057, as here)
QWEN35 = Family(248044, QWEN_SPECIALS, QWEN_TEMPLATE, ("<|im_end|>", "<|endoftext|>"), None, "<|endoftext|>")
LLAMA3 = Family(128000, LLAMA3_SPECIALS, LLAMA3_TEMPLATE, ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
                "<|begin_of_text|>", "<|finetune_right_pad_id|>")
# Gemma 3's 262,144-token vocabulary: <pad> 0, <eos> 1, <bos> 2, <start_of_turn> 105, <end_of_turn> 106
GEMMA3 = Family(262144 - len(GEMMA_SPECIALS), GEMMA_SPECIALS, GEMMA_TEMPLATE, ("<end_of_turn>", "<eos>"), "<bos>",
                "<pad>", specials_first=True)
HARMONY = Family(199998, HARMONY_SPECIALS, HARMONY_TEMPLATE, ("<|return|>", "<|endoftext|>", "<|call|>"),
                 "<|startoftext|>", "<|endoftext|>")

_QWEN_COMMON = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "rms_norm_eps": 1e-6,
                "rope_theta": 1000000.0, "max_position_embeddings": 32768, "hidden_act": "silu"}
_LLAMA_COMMON = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "rms_norm_eps": 1e-5,
                 "rope_theta": 500000.0, "max_position_embeddings": 131072, "hidden_act": "silu",
                 "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                  "original_max_position_embeddings": 8192, "rope_type": "llama3"}}

_QWEN3_COMMON = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "rms_norm_eps": 1e-6,
                 "rope_theta": 1000000.0, "max_position_embeddings": 40960, "hidden_act": "silu", "head_dim": 128,
                 "num_key_value_heads": 8, "vocab_size": 151936, "attention_bias": False}

_QWEN3_MOE_COMMON = {**_QWEN3_COMMON, "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
                     "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True}

def _qwen35(**text) -> dict:
    """Qwen3.5's published config: the wrapper, and its text tower with what every size shares."""
    return {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
            "tie_word_embeddings": text["tie_word_embeddings"], "text_config": {
                "model_type": "qwen3_5_text", "head_dim": 256, "rms_norm_eps": 1e-6, "vocab_size": 248320,
                "max_position_embeddings": 262144, "attn_output_gate": True, "full_attention_interval": 4,
                "linear_num_key_heads": 16, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                "linear_conv_kernel_dim": 4, "rope_parameters": {
                    "mrope_interleaved": True, "mrope_section": [11, 11, 10], "rope_type": "default",
                    "rope_theta": 10000000, "partial_rotary_factor": 0.25}, **text}}


# Shapes from the published config.json of each model.
ARCHITECTURES: dict[str, tuple[Family, dict]] = {
    "qwen2.5-0.5b": (QWEN2, {**_QWEN_COMMON, "hidden_size": 896, "num_hidden_layers": 24, "intermediate_size": 4864,
                             "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
                             "tie_word_embeddings": True}),
    "qwen2.5-1.5b": (QWEN2, {**_QWEN_COMMON, "hidden_size": 1536, "num_hidden_layers": 28, "intermediate_size": 8960,
                             "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936,
                             "tie_word_embeddings": True}),
    "qwen2.5-3b": (QWEN2, {**_QWEN_COMMON, "hidden_size": 2048, "num_hidden_layers": 36, "intermediate_size": 11008,
                           "num_attention_heads": 16, "num_key_value_heads": 2, "vocab_size": 151936,
                           "tie_word_embeddings": True}),
    "qwen2.5-7b": (QWEN2, {**_QWEN_COMMON, "hidden_size": 3584, "num_hidden_layers": 28, "intermediate_size": 18944,
                           "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
                           "tie_word_embeddings": False}),
    "qwen3-0.6b": (QWEN2, {**_QWEN3_COMMON, "hidden_size": 1024, "num_hidden_layers": 28, "intermediate_size": 3072,
                           "num_attention_heads": 16, "tie_word_embeddings": True}),
    "qwen3-4b": (QWEN2, {**_QWEN3_COMMON, "hidden_size": 2560, "num_hidden_layers": 36, "intermediate_size": 9728,
                         "num_attention_heads": 32, "tie_word_embeddings": True}),
    "qwen3-8b": (QWEN2, {**_QWEN3_COMMON, "hidden_size": 4096, "num_hidden_layers": 36, "intermediate_size": 12288,
                         "num_attention_heads": 32, "tie_word_embeddings": False}),
    "qwen3-14b": (QWEN2, {**_QWEN3_COMMON, "hidden_size": 5120, "num_hidden_layers": 40, "intermediate_size": 17408,
                          "num_attention_heads": 40, "tie_word_embeddings": False}),
    # mixture of experts: 128 experts of which 8 per token (3.3B active of 30.5B)
    "qwen3-30b-a3b": (QWEN2, {**_QWEN3_MOE_COMMON, "hidden_size": 2048, "num_hidden_layers": 48,
                              "intermediate_size": 6144, "moe_intermediate_size": 768, "num_attention_heads": 32,
                              "num_key_value_heads": 4, "num_experts": 128, "num_experts_per_tok": 8,
                              "tie_word_embeddings": False}),
    # hybrids in a multimodal wrapper: 3 Gated DeltaNet layers to each gated-attention layer (the text tower;
    # the vision encoder is not synthesised)
    "qwen3.5-0.8b": (QWEN35, _qwen35(hidden_size=1024, intermediate_size=3584, num_hidden_layers=24,
                                     num_attention_heads=8, num_key_value_heads=2, linear_num_value_heads=16,
                                     tie_word_embeddings=True)),
    "qwen3.5-9b": (QWEN35, _qwen35(hidden_size=4096, intermediate_size=12288, num_hidden_layers=32,
                                   num_attention_heads=16, num_key_value_heads=4, linear_num_value_heads=32,
                                   tie_word_embeddings=False)),
    # sliding window: 5 of every 6 layers attend over the last 512 (1b) or 1,024 (4b) tokens; the 4b is a
    # multimodal wrapper (its vision tower is not synthesised)
    "gemma-3-1b": (GEMMA3, {"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], "hidden_size": 1152,
                            "num_hidden_layers": 26, "intermediate_size": 6912, "num_attention_heads": 4,
                            "num_key_value_heads": 1, "head_dim": 256, "query_pre_attn_scalar": 256,
                            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
                            "sliding_window": 512, "sliding_window_pattern": 6, "max_position_embeddings": 32768,
                            "vocab_size": 262144, "hidden_activation": "gelu_pytorch_tanh",
                            "tie_word_embeddings": True}),
    "gemma-3-4b": (GEMMA3, {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
                            "vocab_size": 262208, "text_config": {
                                "model_type": "gemma3_text", "hidden_size": 2560, "num_hidden_layers": 34,
                                "intermediate_size": 10240, "num_attention_heads": 8, "num_key_value_heads": 4,
                                "head_dim": 256, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-6,
                                "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
                                "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024,
                                "sliding_window_pattern": 6, "max_position_embeddings": 131072,
                                "vocab_size": 262208, "tie_word_embeddings": True}}),
    # mixture of experts (32 experts, 4 per token: 3.6B active of 20.9B), sliding window of 128 in every
    # other layer, attention sinks
    "gpt-oss-20b": (HARMONY, {"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "hidden_size": 2880,
                              "num_hidden_layers": 24, "intermediate_size": 2880, "num_local_experts": 32,
                              "num_experts_per_tok": 4, "experts_per_token": 4, "num_attention_heads": 64,
                              "num_key_value_heads": 8, "head_dim": 64, "sliding_window": 128,
                              "layer_types": ["sliding_attention", "full_attention"] * 12, "rms_norm_eps": 1e-5,
                              "rope_theta": 150000, "rope_scaling": {
                                  "beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                                  "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
                              "max_position_embeddings": 131072, "swiglu_limit": 7.0, "attention_bias": True,
                              "vocab_size": 201088, "tie_word_embeddings": False}),
    "llama-3.2-1b": (LLAMA3, {**_LLAMA_COMMON, "hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 8192,
                              "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
                              "vocab_size": 128256, "tie_word_embeddings": True}),
    "llama-3.2-3b": (LLAMA3, {**_LLAMA_COMMON, "hidden_size": 3072, "num_hidden_layers": 28, "intermediate_size": 8192,
                              "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128,
                              "vocab_size": 128256, "tie_word_embeddings": True}),
}


def architecture(name: str) -> tuple[Family, dict]:
    key = name.lower()
    if key not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {name!r}; choose one of {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[key]


def _word_tokens(count: int) -> list[tuple[str, tuple[str, str] | None]]:
    """`count` regular tokens with their merges: byte symbols, then Ġ-prefixed words of 1-4 letters."""
    from .tiny import byte_symbols

    space = byte_symbols()[32]
    tokens: list[tuple[str, tuple[str, str] | None]] = [(s, None) for s in byte_symbols().values()]
    letters = string.ascii_lowercase
    for size in (1, 2, 3, 4):
        for word in product(letters, repeat=size):
            if len(tokens) >= count:
                return tokens
            text = "".join(word)
            left = space + text[:-1] if size > 1 else space
            tokens.append((space + text, (left, text[-1])))
    if len(tokens) < count:
        raise ValueError(f"cannot build {count} regular tokens from words of up to four letters")
    return tokens


def build_tokenizer(family: Family):
    """A byte-level BPE `PreTrainedTokenizerFast` with the family's vocabulary size and specials."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = _word_tokens(family.regular_tokens)
    first = len(family.specials) if family.specials_first else 0
    vocab = {token: first + index for index, (token, _) in enumerate(words)}
    if family.specials_first:  # in the model's vocabulary at their ids; added below as special (never split)
        vocab.update(family.special_ids())
    merges = [merge for _, merge in words if merge is not None]
    core = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in family.specials])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=family.bos, eos_token=family.eos[0], pad_token=family.pad,
        unk_token=None, clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = family.chat_template
    return tokenizer


def model_config(family: Family, shape: dict, arch: str) -> dict:
    tokenizer_size = family.regular_tokens + len(family.specials)
    specials = family.special_ids()
    eos = [specials[name] for name in family.eos]
    vocab_size = (shape.get("text_config") or shape)["vocab_size"]  # a multimodal wrapper nests it
    config = {**shape, "torch_dtype": "bfloat16",
              "eos_token_id": eos if len(eos) > 1 else eos[0],
              "bos_token_id": specials[family.bos] if family.bos else specials[family.eos[-1]],
              "quantization": {"group_size": GROUP_SIZE, "bits": BITS, "mode": "affine"},
              "artmlx_synthetic": {"architecture": arch, "weights": "random", "tokenizer_size": tokenizer_size}}
    config["quantization_config"] = dict(config["quantization"])
    if tokenizer_size > vocab_size:
        raise ValueError(f"{arch}: tokenizer of {tokenizer_size} tokens exceeds the vocabulary {vocab_size}")
    return config


def parameter_layout(config: dict) -> dict[str, tuple[tuple[int, ...], str]]:
    """Name -> (shape, dtype) of every parameter mlx-lm will load for `config` (lazy: nothing is computed)."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    q = config["quantization"]
    nn.quantize(model, group_size=q["group_size"], bits=q["bits"])
    # Gemma 3's class always makes a head and ties it only when the checkpoint has none (as published)
    text = config.get("text_config") or config
    tied = text.get("model_type") == "gemma3_text" and text.get("tie_word_embeddings", True)
    return {name: (tuple(value.shape), str(value.dtype).removeprefix("mlx.core."))
            for name, value in tree_flatten(model.parameters())
            if not (tied and name.startswith(("lm_head.", "language_model.lm_head.")))}


def random_tensors(layout: dict, seed: int = 0):
    """Yield (name, mx.array) for the layout: random 4-bit codes with affine scales, unit norms, zero biases."""
    import mlx.core as mx

    rng = np.random.default_rng(seed)
    codes_std = float(np.sqrt((2**BITS) ** 2 - 1) / np.sqrt(12))
    for name, (shape, dtype) in layout.items():
        stem, _, leaf = name.rpartition(".")
        if dtype == "uint32":  # packed 4-bit codes
            data = mx.array(rng.integers(0, 2**32, size=shape, dtype=np.uint32))
        elif leaf in ("scales", "biases") and f"{stem}.weight" in layout:
            fan_in = layout[f"{stem}.weight"][0][-1] * 32 // BITS
            std = 0.02 if "embed" in stem else fan_in ** -0.5
            scale = std / codes_std
            value = scale if leaf == "scales" else -scale * (2**BITS - 1) / 2
            data = mx.full(shape, value, dtype=mx.bfloat16)
        elif "norm" in stem or "norm" in leaf:
            data = mx.ones(shape, dtype=mx.bfloat16)
        elif leaf == "bias":
            data = mx.zeros(shape, dtype=mx.bfloat16)
        else:  # an unquantized matrix (rare: shapes not divisible by the group size)
            data = mx.array(rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(mx.bfloat16)
        yield name, data


def synthesize(arch: str, out: Path, seed: int = 0, shape_overrides: dict | None = None) -> Path:
    """Write the random-weight model folder for `arch` into `out` (replaced atomically if it exists).

    `shape_overrides` (tests) changes config fields, e.g. fewer layers with the real vocabulary.
    """
    import mlx.core as mx

    family, shape = architecture(arch)
    config = model_config(family, {**shape, **(shape_overrides or {})}, arch)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        shards, current, size = [], {}, 0
        for name, tensor in random_tensors(parameter_layout(config), seed):
            mx.eval(tensor)
            current[name] = tensor
            size += tensor.nbytes
            if size >= SHARD_BYTES:
                shards.append(current)
                current, size = {}, 0
        if current:
            shards.append(current)
        for index, shard in enumerate(shards):
            path = staging / f"model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
            mx.save_safetensors(str(path), shard, metadata={"format": "mlx"})
        shards.clear()
        (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        build_tokenizer(family).save_pretrained(str(staging))
        (staging / "README.md").write_text(
            f"# Synthetic {arch} (random weights)\n\nWritten by `artmlx model synth {arch}`: the architecture and "
            "vocabulary of the published model with random 4-bit weights, for speed and memory benchmarks only. "
            "It generates nonsense.\n")
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def is_synthetic(model_path: str | Path) -> bool:
    config = Path(model_path) / "config.json"
    return config.exists() and "artmlx_synthetic" in json.loads(config.read_text())
