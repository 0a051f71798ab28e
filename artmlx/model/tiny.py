"""The embedded tiny model: a real Qwen2-architecture model folder that needs no network.

`artmlx` must run anywhere, offline, so it ships a tiny pretrained base. The folder is an ordinary
Hugging Face / mlx-lm model directory (`config.json`, `model.safetensors`, tokenizer files with a
ChatML chat template) and is loaded with `mlx_lm.load` exactly like a hub model, so every code path
(4-bit QLoRA included) is the one a user hits with `mlx-community/Qwen2.5-0.5B-Instruct-4bit`.

The tokenizer is a byte-level BPE without merges, i.e. character level (printable ASCII, newline,
the role names and three ChatML special tokens, ~100 tokens), built with the `tokenizers` package in
the same byte-level form as Qwen's own tokenizer (recent `transformers` load any `qwen2` folder's
tokenizer through that pipeline). With so few tokens a random policy still emits a digit now and then. The weights come from `artmlx/model/pretrain_tiny.py` (supervised pretraining on
synthetic tic-tac-toe and arithmetic transcripts, then 4-bit quantization) and ship inside the
package as `tiny.safetensors`; the folder is written once into the cache directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

TINY_NAME = "tiny"
WEIGHTS_FILE = Path(__file__).with_name("tiny.safetensors")

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ROLE_TOKENS = ["system", "user", "assistant"]
# ChatML; with `tools`, Hermes-style tool calling as Qwen2.5's template writes it (a system block listing
# the tools, calls as <tool_call> JSON, results as <tool_response> user turns). Without tools the
# rendering is plain ChatML, unchanged. (Chat templates render with trim_blocks: a newline right after a
# block tag is dropped, hence {{ '\\n' }}.)
TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_FORMAT = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call>"
)
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    + TOOLS_PREAMBLE +
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}"
    + TOOLS_FORMAT +
    "<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if tools and loop.first and message['role'] == 'system' %}"
    "{% elif message['role'] == 'assistant' and message.tool_calls %}"
    "<|im_start|>assistant\n{% if message['content'] %}{{ message['content'] }}\n{% endif %}"
    "{% for tool_call in message.tool_calls %}"
    "{% if tool_call.function is defined %}{% set tool_call = tool_call.function %}{% endif %}"
    "{% if not loop.first %}{{ '\\n' }}{% endif %}"
    "<tool_call>\n{\"name\": \"{{ tool_call.name }}\", \"arguments\": {{ tool_call.arguments | tojson }}}\n</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% elif message['role'] == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ message['content'] }}\n</tool_response><|im_end|>\n"
    "{% else %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Architecture of the embedded base (Qwen2 family, mlx-lm's `qwen2` model type).
TINY_ARCH = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
QUANT_GROUP_SIZE = 32
QUANT_BITS = 4


def byte_symbols() -> dict[int, str]:
    """GPT-2's byte -> printable character map used by byte-level BPE vocabularies."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    symbols, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            symbols[byte] = chr(byte)
        else:
            symbols[byte] = chr(256 + extra)
            extra += 1
    return symbols


def vocabulary() -> list[str]:
    """Token strings in id order: specials, role names, then newline and printable ASCII as byte symbols."""
    symbols = byte_symbols()
    chars = [symbols[10]] + [symbols[c] for c in range(32, 127)]
    return SPECIAL_TOKENS + ROLE_TOKENS + chars


def model_config(quantized: bool = True) -> dict:
    """The `config.json` of the tiny model (4-bit quantized unless `quantized` is False)."""
    vocab = vocabulary()
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        **TINY_ARCH,
        "vocab_size": len(vocab),
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "bos_token_id": vocab.index("<|endoftext|>"),
        "eos_token_id": vocab.index("<|im_end|>"),
    }
    if quantized:
        config["quantization"] = {"group_size": QUANT_GROUP_SIZE, "bits": QUANT_BITS, "mode": "affine"}
        config["quantization_config"] = dict(config["quantization"])
    return config


def build_tokenizer():
    """A `PreTrainedTokenizerFast` over the character vocabulary with the ChatML template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = vocabulary()
    core = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(vocab)}, merges=[], unk_token=None))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    core.add_tokens([AddedToken(t, special=False, normalized=False) for t in ROLE_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def cache_root() -> Path:
    """Where artmlx keeps generated files: `$ARTMLX_CACHE`, else `$XDG_CACHE_HOME/artmlx`."""
    if env := os.environ.get("ARTMLX_CACHE"):
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "artmlx"


def _folder_digest() -> str:
    digest = hashlib.sha256(WEIGHTS_FILE.read_bytes())
    digest.update(json.dumps(model_config(), sort_keys=True).encode())
    digest.update("".join(vocabulary()).encode() + CHAT_TEMPLATE.encode())
    return digest.hexdigest()[:12]


def tiny_model_path() -> Path:
    """The embedded model's folder, written on first use (atomically, so racing processes agree)."""
    if not WEIGHTS_FILE.exists():
        raise FileNotFoundError(
            f"{WEIGHTS_FILE} is missing: reinstall artmlx or run `python -m artmlx.model.pretrain_tiny`."
        )
    folder = cache_root() / "models" / f"tiny-{_folder_digest()}"
    if (folder / "config.json").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tiny-", dir=folder.parent))
    try:
        write_model_folder(staging, WEIGHTS_FILE)
        os.replace(staging, folder)
    except OSError:
        if not (folder / "config.json").exists():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def write_model_folder(folder: Path, weights_file: Path, quantized: bool = True) -> None:
    """Write config, weights and tokenizer files so that `mlx_lm.load(folder)` works."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(weights_file, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(model_config(quantized), indent=2, sort_keys=True))
    build_tokenizer().save_pretrained(str(folder))


def resolve_model(name_or_path: str) -> str:
    """Map `tiny` to the embedded folder, a GGUF file or a packaged model's name (`model/packaged.py`) to
    its imported mlx-lm folder (made on first use); anything else (hub id, local folder) passes through."""
    if name_or_path == TINY_NAME:
        return str(tiny_model_path())
    from .gguf_import import gguf_source, import_gguf

    source = gguf_source(name_or_path)
    if source is None:
        return name_or_path
    return str(import_gguf(source, report=lambda line: print(f"[gguf] {line}", file=sys.stderr, flush=True)))
