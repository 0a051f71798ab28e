"""GGUF files written the way llama.cpp's `convert_hf_to_gguf.py` writes them, from tiny mlx-lm folders.

The import is tested by the round trip: an mlx-lm model -> GGUF (llama's Q/K rows permuted for
interleaved rotary, Gemma's norms stored as 1 + w, llama.cpp's tensor and metadata names, the
tokenizer as `tokenizer.ggml.*` arrays) -> `import_gguf` -> an mlx-lm folder whose model must compute
what the original did. Written with the `gguf` package's own writer and quantizers.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np

GGUF_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
}
GEMMA3_NAMES = {**GGUF_NAMES, "pre_feedforward_layernorm": "ffn_norm", "post_attention_layernorm": "post_attention_norm",
                "post_feedforward_layernorm": "post_ffw_norm"}


def float_weights(folder: Path) -> tuple[dict[str, np.ndarray], dict]:
    """The folder's weights dequantized to float32, by mlx-lm name, and its config."""
    config = json.loads((folder / "config.json").read_text())
    raw = mx.load(str(folder / "model.safetensors"))
    quant = config.get("quantization", {})
    out = {}
    for name, value in raw.items():
        if name.endswith((".scales", ".biases")):
            continue
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and f"{module}.scales" in raw:
            value = mx.dequantize(value, raw[f"{module}.scales"].astype(mx.float32),
                                  raw[f"{module}.biases"].astype(mx.float32),
                                  group_size=quant["group_size"], bits=quant["bits"])  # in float32: no rounding
        out[name] = np.array(value.astype(mx.float32))
    return out, config


def llama_cpp_permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: Q/K rows for interleaved rotary."""
    return (weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def write_gguf(folder: Path, path: Path, arch: str, matrix_type: str = "Q8_0", chat_template: str | None = None,
               pre: str = "gpt-2", drop: tuple = (), extra_metadata: dict | None = None) -> Path:
    """The folder's model as a GGUF of architecture `arch` (llama, qwen2, qwen3, gemma3), its matrices in
    `matrix_type` (a GGML type name) and its vectors in F32."""
    import gguf
    from gguf import GGMLQuantizationType

    weights, config = float_weights(Path(folder))
    tokenizer = json.loads((Path(folder) / "tokenizer.json").read_text())
    names = GEMMA3_NAMES if arch == "gemma3" else GGUF_NAMES
    writer = gguf.GGUFWriter(str(path), arch)
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    put = {"block_count": config["num_hidden_layers"], "context_length": config["max_position_embeddings"],
           "embedding_length": config["hidden_size"], "feed_forward_length": config["intermediate_size"],
           "attention.head_count": heads, "attention.head_count_kv": kv_heads,
           "attention.key_length": config.get("head_dim", config["hidden_size"] // heads),
           "attention.value_length": config.get("head_dim", config["hidden_size"] // heads)}
    for key, value in put.items():
        writer.add_uint32(f"{arch}.{key}", int(value))
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", config["rms_norm_eps"])
    writer.add_float32(f"{arch}.rope.freq_base", config.get("rope_theta", 10000.0))
    if arch == "gemma3":
        writer.add_uint32("gemma3.attention.sliding_window", config["sliding_window"])
    for key, value in (extra_metadata or {}).items():
        (writer.add_string if isinstance(value, str) else writer.add_float32)(key, value)
    vocab = tokenizer["model"]["vocab"]
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    added = {t["id"]: t for t in tokenizer["added_tokens"]}
    for index, token in added.items():
        if index >= len(tokens):
            tokens += [""] * (index + 1 - len(tokens))
        tokens[index] = token["content"]
    types = [3 if i in added and added[i]["special"] else 4 if i in added else 1 for i in range(len(tokens))]
    padding = range(len(tokens), config["vocab_size"])  # convert_hf_to_gguf pads to the embedding's rows
    tokens, types = tokens + [f"[PAD{i}]" for i in padding], types + [5] * len(padding)
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_string("tokenizer.ggml.pre", pre)
    writer.add_array("tokenizer.ggml.tokens", tokens)
    writer.add_array("tokenizer.ggml.token_type", types)
    writer.add_array("tokenizer.ggml.merges", [" ".join(m) if isinstance(m, list) else m
                                               for m in tokenizer["model"].get("merges", [])])
    eos = config["eos_token_id"]
    writer.add_uint32("tokenizer.ggml.eos_token_id", eos[0] if isinstance(eos, list) else eos)
    template = chat_template if chat_template is not None else _folder_template(Path(folder))
    if template:
        writer.add_string("tokenizer.chat_template", template)
    for name, value in sorted(weights.items()):
        target = _gguf_name(name, names)
        if target is None or target in drop:
            continue
        if arch == "llama" and ".attn_q." in target:
            value = llama_cpp_permute(value, heads)
        elif arch == "llama" and ".attn_k." in target:
            value = llama_cpp_permute(value, kv_heads)
        if arch == "gemma3" and target.endswith("norm.weight"):
            value = value + 1.0
        if value.ndim == 2 and matrix_type != "F32":
            qtype = GGMLQuantizationType[matrix_type]
            writer.add_tensor(target, gguf.quants.quantize(value, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(target, value.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _gguf_name(name: str, names: dict) -> str | None:
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    if name == "lm_head.weight":
        return "output.weight"
    parts = name.split(".")
    if parts[:2] == ["model", "layers"]:
        module, kind = ".".join(parts[3:-1]), parts[-1]
        return f"blk.{parts[2]}.{names[module]}.{kind}" if module in names else None
    return None


def _folder_template(folder: Path) -> str:
    path = folder / "chat_template.jinja"
    if path.exists():
        return path.read_text()
    return json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template", "")
