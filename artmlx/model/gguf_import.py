"""GGUF files (llama.cpp, Ollama, LM Studio) as ordinary mlx-lm model folders.

`import_gguf(path)` writes, once per file, a folder that `mlx_lm.load` and every mlx-lm tool take:
`config.json` for mlx-lm's model class of the architecture, `model.safetensors` with the weights
under mlx-lm's names (Q4_0/Q4_1/Q8_0 matrices exactly as in the file, others quantized again:
`gguf_tensors.py`), and a Hugging Face tokenizer with the file's chat template
(`gguf_tokenizer.py`). The folder lives in the cache (`$ARTMLX_CACHE/models/gguf/`), keyed by the
file's path, size and modification time, and is reused; `--model FILE.gguf` anywhere resolves to it.

What the conversion undoes, architecture by architecture (llama.cpp's `convert_hf_to_gguf.py` did
the opposite):
- llama: Q and K rows were permuted for llama.cpp's interleaved rotary embedding; they are permuted
  back (exact on packed codes: a row's groups stay together), so mlx-lm's default rotary applies.
  Llama 3.1+ rotary scaling is stored as a `rope_freqs` tensor: it is matched against Llama 3's rule.
- gemma3: norm weights were stored as 1 + w (Gemma's RMSNorm multiplies by 1 + w); 1 is subtracted.
  The layer pattern (5 sliding-window layers to 1 global), the local rotary base (10,000) and the
  query scale (head_dim, except the 27B) are llama.cpp's constants for the architecture.
- qwen2, qwen3: stored as Hugging Face has them.
Anything else, an architecture or a tensor, is refused by name.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np

from . import gguf_tensors
from .gguf_archs import ARCHITECTURES, ArchSpec, chat_template_for
from .gguf_tokenizer import GgufVocabulary, build_tokenizer, end_of_turn_ids

IMPORT_VERSION = 2  # bump when the folder written for the same file would change
GGUF_MAGIC = b"GGUF"


class GgufFile:
    """A GGUF file opened for reading (memory-mapped): its metadata and tensors, validated."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        if not self.path.is_file():
            raise FileNotFoundError(f"GGUF file {self.path} does not exist")
        with open(self.path, "rb") as handle:
            if handle.read(4) != GGUF_MAGIC:
                raise ValueError(f"{self.path} is not a GGUF file (it does not start with the bytes 'GGUF')")
        from gguf import GGUFReader

        try:
            self.reader = GGUFReader(str(self.path))
        except Exception as error:  # the reader's struct, index and value errors alike
            raise ValueError(f"{self.path} is not a readable GGUF file (truncated or corrupt: "
                             f"{type(error).__name__}: {error})") from error
        self.tensors = {tensor.name: tensor for tensor in self.reader.tensors}

    def get(self, key: str, default=None):
        field = self.reader.fields.get(key)
        if field is None:
            return default
        value = field.contents()
        return value.decode() if isinstance(value, bytes) else value

    def require(self, key: str):
        value = self.get(key)
        if value is None:
            raise ValueError(f"{self.path.name} has no metadata key {key!r}")
        return value

    @property
    def architecture(self) -> str:
        return str(self.require("general.architecture"))

    def vocabulary(self) -> GgufVocabulary:
        get = self.get
        return GgufVocabulary(
            model=str(self.require("tokenizer.ggml.model")), pre=str(get("tokenizer.ggml.pre", "default")),
            tokens=list(self.require("tokenizer.ggml.tokens")),
            token_types=[int(t) for t in get("tokenizer.ggml.token_type", [])],
            merges=list(get("tokenizer.ggml.merges", [])), scores=[float(s) for s in get("tokenizer.ggml.scores", [])],
            bos_id=get("tokenizer.ggml.bos_token_id"), eos_id=get("tokenizer.ggml.eos_token_id"),
            eot_id=get("tokenizer.ggml.eot_token_id"), unk_id=get("tokenizer.ggml.unknown_token_id"),
            pad_id=get("tokenizer.ggml.padding_token_id"), add_bos=bool(get("tokenizer.ggml.add_bos_token", False)),
            add_space_prefix=bool(get("tokenizer.ggml.add_space_prefix", False)), architecture=self.architecture)

    def raw(self, name: str) -> tuple[str, np.ndarray, tuple[int, ...]]:
        """A tensor's type name, raw data and shape in row-major order (rows = output features)."""
        tensor = self.tensors[name]
        shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
        return tensor.tensor_type.name, tensor.data, shape


def gguf_source(name: str) -> Path | None:
    """The GGUF file `name` stands for: a packaged model's name or a path ending in .gguf; else None."""
    from .packaged import PACKAGED, packaged_gguf

    if name in PACKAGED:
        return packaged_gguf(name)
    return Path(name).expanduser() if name.lower().endswith(".gguf") else None


def folder_for(path: Path, how: gguf_tensors.Requantize) -> Path:
    """The cache folder of a file's import: one per (file, size, modification time, settings)."""
    from .tiny import cache_root

    stat = path.stat()
    key = json.dumps([str(path.resolve()), stat.st_size, stat.st_mtime_ns, how.bits, how.group_size, IMPORT_VERSION])
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in path.stem)[:60]
    return cache_root() / "models" / "gguf" / f"{stem}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def import_gguf(path: str | Path, out: Path | None = None, how: gguf_tensors.Requantize | None = None,
                report=None) -> Path:
    """The mlx-lm folder of a GGUF file: made on first use (in the cache unless `out`), reused after.
    `report(line)` hears what was done (each kind of tensor, requantization, the chat template)."""
    how = how or gguf_tensors.Requantize()
    source = Path(path).expanduser()
    gguf = GgufFile(source)  # validates before anything is written
    folder = Path(out) if out else folder_for(source, how)
    if (folder / "config.json").exists() and not out:
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _lock(folder):
        if (folder / "config.json").exists() and not out:
            return folder  # another process made it while this one waited
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
        try:
            write_folder(gguf, staging, how, report or (lambda line: None))
            staging.chmod(0o755)  # mkdtemp made it private; the folder is an ordinary model folder
            if folder.exists():
                shutil.rmtree(folder)
            os.replace(staging, folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return folder


@contextlib.contextmanager
def _lock(folder: Path):
    with open(folder.parent / f".{folder.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def write_folder(gguf: GgufFile, folder: Path, how: gguf_tensors.Requantize, report) -> None:
    arch = gguf.architecture
    spec = ARCHITECTURES.get(arch)
    if spec is None:
        raise ValueError(f"{gguf.path.name}: architecture {arch!r} is not supported (supported: "
                         f"{', '.join(sorted(ARCHITECTURES))})")
    vocab = gguf.vocabulary()
    config = spec.config(gguf)
    weights, counts, quantization = convert_weights(gguf, spec, config, how)
    template, template_source = chat_template_for(gguf, spec)
    tokenizer = build_tokenizer(vocab, template)
    rows = gguf.raw("token_embd.weight")[2][0] if "token_embd.weight" in gguf.tensors else len(vocab.tokens)
    if len(vocab.tokens) > rows:
        raise ValueError(f"{gguf.path.name}: {len(vocab.tokens):,} tokens but an embedding of {rows:,} rows")
    config.update(vocab_size=rows, bos_token_id=vocab.bos_id,
                  eos_token_id=end_of_turn_ids(vocab, template), torch_dtype="float16")
    if quantization:
        config["quantization"] = config["quantization_config"] = quantization
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    tokenizer.save_pretrained(str(folder))
    (folder / "artmlx_gguf.json").write_text(json.dumps(
        {"source": str(gguf.path.resolve()), "architecture": arch, "tensors": counts,
         "requantized_to": {"bits": how.bits, "group_size": how.group_size} if counts.get("requantized") else None,
         "chat_template": template_source, "import_version": IMPORT_VERSION}, indent=2))
    report(f"{gguf.path.name}: {arch} ({config['num_hidden_layers']} layers, hidden {config['hidden_size']}, "
           f"{len(vocab.tokens):,}-token {vocab.model} vocabulary)")
    report("tensors: " + ", ".join(f"{n} {kind}" for kind, n in counts.items())
           + (f" (requantized to MLX {how.bits}-bit, group size {how.group_size})" if counts.get("requantized") else ""))
    report(f"chat template: {template_source}; end of turn: "
           + ", ".join(repr(vocab.tokens[i]) for i in config["eos_token_id"]))


def convert_weights(gguf: GgufFile, spec: ArchSpec, config: dict, how: gguf_tensors.Requantize):
    """mlx-lm's weights of the file, how many tensors went which way, and the quantization config."""
    weights: dict[str, mx.array] = {}
    counts = {"exact": 0, "requantized": 0, "float": 0}
    layers: dict[str, tuple[int, int]] = {}
    for name in gguf.tensors:
        if name in spec.consumed:
            continue
        target = spec.target_name(name)
        if target is None:
            raise ValueError(f"{gguf.path.name}: tensor {name!r} has no place in mlx-lm's {config['model_type']} "
                             "model (not supported)")
        type_name, raw, shape = gguf.raw(name)
        if len(shape) == 2:
            converted = gguf_tensors.convert_matrix(type_name, raw, shape, how)
            if spec.row_order is not None:
                order = spec.row_order(target, config, shape[0])
                if order is not None:
                    converted = gguf_tensors.permute_rows(converted, order)
            module = target.removesuffix(".weight")
            weights[target] = converted.weight
            if converted.quantized:
                weights[f"{module}.scales"], weights[f"{module}.biases"] = converted.scales, converted.biases
                layers[module] = (converted.bits, converted.group_size)
        elif len(shape) == 1:
            values = gguf_tensors.convert_vector(type_name, raw, shape)
            if spec.row_order is not None and (order := spec.row_order(target, config, shape[0])) is not None:
                values = values[order]
            # float16 beside 4-bit weights (their scales are float16 too); the file's precision when kept float
            kept = np.float32 if not how.bits and type_name in ("F32", "F64") else np.float16
            weights[target] = mx.array(spec.vector_fix(target, values).astype(kept))
            converted = gguf_tensors.Converted(weights[target])
        else:
            raise ValueError(f"{gguf.path.name}: tensor {name!r} has {len(shape)} dimensions (not supported)")
        counts[converted.how] += 1
    return weights, {k: v for k, v in counts.items() if v}, _quantization_config(layers)


def _quantization_config(layers: dict[str, tuple[int, int]]) -> dict:
    """mlx-lm's `quantization`: the most common (bits, group size), and every other layer by path."""
    if not layers:
        return {}
    values = list(layers.values())
    bits, group = max(set(values), key=values.count)
    config = {"group_size": group, "bits": bits, "mode": "affine"}
    for module, (b, g) in sorted(layers.items()):
        if (b, g) != (bits, group):
            config[module] = {"group_size": g, "bits": b}
    return config
