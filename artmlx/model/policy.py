"""The policy: a frozen (usually 4-bit) base model from mlx-lm with LoRA adapters on top.

Adapters are saved in mlx-lm's own format (`adapters.safetensors` + `adapter_config.json`), so
`mlx_lm.generate --model BASE --adapter-path DIR` and `mlx_lm.fuse` take them unchanged.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from . import lora_groups, lora_kernel, recurrence
from .backend import adapt_to_backend
from .families import check_supported
from .tiny import resolve_model

ADAPTER_WEIGHTS = "adapters.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


@dataclass(frozen=True)
class LoraSpec:
    """What `linear_to_lora_layers` needs; built from the run config."""

    rank: int = 16
    scale: float = 20.0
    dropout: float = 0.0
    num_layers: int = -1
    keys: tuple[str, ...] | None = None
    dora: bool = False

    @classmethod
    def from_config(cls, config) -> "LoraSpec":
        """The spec of a run configuration (`TrainConfig`)."""
        return cls(rank=config.lora_rank, scale=config.lora_scale, dropout=config.lora_dropout,
                   num_layers=config.lora_layers, keys=tuple(config.lora_keys) or None, dora=config.dora)

    def mlx_lm_parameters(self) -> dict:
        params = {"rank": self.rank, "scale": self.scale, "dropout": self.dropout}
        if self.keys:
            params["keys"] = list(self.keys)
        return params

    def layers_for(self, model: nn.Module) -> int:
        total = len(model.layers)
        if self.num_layers > total:
            raise ValueError(f"lora_layers={self.num_layers} but the model has only {total} layers")
        return total if self.num_layers < 0 else self.num_layers


def load_base(model_name: str):
    """Load model and tokenizer with mlx-lm (`tiny`, a hub id or a local path), base frozen."""
    import mlx_lm

    model, tokenizer = mlx_lm.load(resolve_model(model_name))
    check_supported(model, model_name)  # at load, in every command: before any work is done with it
    adapt_to_backend(model)
    recurrence.install(model)  # Gated DeltaNet layers: memory that does not grow with a state per token
    model.freeze()
    return model, tokenizer


def attach_lora(model: nn.Module, spec: LoraSpec) -> int:
    """Wrap the chosen linear layers with LoRA; returns the trainable parameter count."""
    from mlx_lm.tuner.utils import linear_to_lora_layers

    model.freeze()
    parameters = spec.mlx_lm_parameters()
    if spec.keys:
        parameters["keys"] = expand_lora_keys(model, spec.keys)
    linear_to_lora_layers(model, spec.layers_for(model), parameters, use_dora=spec.dora)
    if lora_kernel.available():
        lora_kernel.use_fused_lora(model)
        if lora_groups.enabled():
            lora_groups.group_siblings(model)
    count = sum(v.size for _, v in tree_flatten(model.trainable_parameters()))
    if count == 0:
        raise ValueError(f"lora_keys={spec.keys} matched no layer of the model; no parameter is trainable")
    model.eval()  # the new LoRA modules too: sampling never applies LoRA dropout (the trainer turns it on)
    return count


def expand_lora_keys(model: nn.Module, keys) -> list[str]:
    """mlx-lm's keys are module paths inside a layer ("self_attn.q_proj"); a key without a dot is a
    module name as PEFT's target_modules give it ("q_proj") and stands for every path ending in it."""
    paths = [path for path, _ in model.layers[-1].named_modules() if path]
    out = []
    for key in keys:
        out += [key] if "." in key else [path for path in paths if path.split(".")[-1] == key]
    return sorted(set(out))


def load_policy(model_name: str, spec: LoraSpec):
    """Base + fresh LoRA adapters. Returns (model, tokenizer, trainable parameter count)."""
    model, tokenizer = load_base(model_name)
    return model, tokenizer, attach_lora(model, spec)


def adapter_weights(model: nn.Module, dtype: mx.Dtype | None = None) -> dict[str, mx.array]:
    """The trainable (adapter) tensors by name, cast to `dtype` if given (e.g. to broadcast them smaller)."""
    weights = dict(tree_flatten(model.trainable_parameters()))
    return weights if dtype is None else {name: value.astype(dtype) for name, value in weights.items()}


def base_adapter_weights(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Adapter tensors under which a LoRA model computes exactly its base: every `lora_b` zero
    (y = Wx + s·(xA)B). DoRA rescales by a learned magnitude, so it has no such tensors."""
    if any(name.endswith(".m") for name in weights):
        raise ValueError("a DoRA model cannot serve its base through zero adapters")
    return {name: mx.zeros_like(v) if name.endswith("lora_b") else v for name, v in weights.items()}


def conform_adapter_weights(current: dict[str, mx.array], weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """`weights` checked against `current` (a model's adapter tensors): the same names and shapes exactly,
    values cast to the model's dtypes (a bfloat16 broadcast becomes float32 again)."""
    if set(weights) != set(current):
        missing, extra = sorted(set(current) - set(weights)), sorted(set(weights) - set(current))
        raise ValueError(f"adapter names differ from the model's: missing {missing[:3]}, unexpected {extra[:3]}")
    for name, value in weights.items():
        if value.shape != current[name].shape:
            raise ValueError(f"adapter {name}: shape {value.shape} != model's {current[name].shape}")
    return {name: value.astype(current[name].dtype) for name, value in weights.items()}


def set_adapter_weights(model: nn.Module, weights: dict[str, mx.array]) -> None:
    """Replace the adapter tensors in place (no reload); names and shapes must match exactly."""
    model.load_weights(list(conform_adapter_weights(adapter_weights(model), weights).items()), strict=False)


def save_adapters(model: nn.Module, folder: Path, spec: LoraSpec, base_model: str) -> None:
    """Write mlx-lm-format adapters into `folder` (files replaced atomically)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "fine_tune_type": "dora" if spec.dora else "lora",
        "num_layers": spec.layers_for(model),
        "lora_parameters": spec.mlx_lm_parameters(),
        "model": resolve_model(base_model),
    }
    tmp_weights = folder / f".{ADAPTER_WEIGHTS}.tmp.safetensors"
    mx.save_safetensors(str(tmp_weights), adapter_weights(model), metadata={"format": "mlx"})
    os.replace(tmp_weights, folder / ADAPTER_WEIGHTS)
    tmp_config = folder / f".{ADAPTER_CONFIG}.tmp"
    tmp_config.write_text(json.dumps(config, indent=2, sort_keys=True))
    os.replace(tmp_config, folder / ADAPTER_CONFIG)


def read_adapter_config(folder: Path) -> dict:
    path = Path(folder) / ADAPTER_CONFIG
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {folder} an adapter folder written by artmlx or mlx-lm?")
    return json.loads(path.read_text())


def spec_from_adapter_config(config: dict) -> LoraSpec:
    params = config["lora_parameters"]
    return LoraSpec(
        rank=params["rank"],
        scale=params["scale"],
        dropout=params.get("dropout", 0.0),
        num_layers=config["num_layers"],
        keys=tuple(params["keys"]) if params.get("keys") else None,
        dora=config.get("fine_tune_type") == "dora",
    )


def load_policy_with_adapters(folder: Path, model_name: str | None = None):
    """Base + saved adapters. The base defaults to the one recorded in `adapter_config.json`."""
    config = read_adapter_config(folder)
    model_name = model_name or config.get("model")
    if not model_name:
        raise ValueError(f"{folder}/{ADAPTER_CONFIG} names no base model; pass --model")
    spec = spec_from_adapter_config(config)
    model, tokenizer, _ = load_policy(model_name, spec)
    set_adapter_weights(model, dict(mx.load(str(Path(folder) / ADAPTER_WEIGHTS))))
    return model, tokenizer


@contextlib.contextmanager
def lora_disabled(model: nn.Module):
    """Run the frozen base alone (LoRA scale 0), e.g. for KL to the base without a second copy."""
    saved = []
    for _, module in model.named_modules():
        if hasattr(module, "lora_a") and hasattr(module, "scale"):
            saved.append((module, module.scale))
            module.scale = 0.0
    try:
        yield model
    finally:
        for module, scale in saved:
            module.scale = scale


def local_model_folder(model_name: str) -> Path | None:
    """Where the model is on this machine: `tiny`, a folder, or a hub id already in the local cache
    (HF_HOME); None when it is not here (nothing is downloaded)."""
    path = Path(resolve_model(model_name))
    if path.exists():
        return path
    from mlx_lm.utils import hf_repo_to_path

    try:
        return Path(hf_repo_to_path(model_name))
    except Exception:  # the hub library's many "not in the cache" and "not a repo id" errors alike
        return None


def fingerprint(model_name: str, spec: LoraSpec) -> str:
    """A short hash of the base model (its config and the names and sizes of its weight files) and the
    LoRA layout: what actor and learner must share. A model not found here hashes by its name."""
    path = local_model_folder(model_name)
    base, weights = model_name, []
    if path is not None and (path / "config.json").exists():
        base = (path / "config.json").read_text()
        weights = sorted((file.name, file.stat().st_size) for file in path.glob("*.safetensors"))
    payload = json.dumps({"base": base, "weights": weights, "lora": spec.__dict__}, sort_keys=True, default=list)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _module_arrays(value) -> list[mx.array]:
    """Every array a module tree holds, its private ones too (mlx-lm keeps RoPE frequencies as `_freqs`)."""
    if isinstance(value, mx.array):
        return [value]
    if isinstance(value, (nn.Module, dict)):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [array for item in value for array in _module_arrays(item)]
    return []


def evaluate_all(model: nn.Module) -> None:
    """Evaluate every array of `model`, on this thread's stream: a tree that another thread will use (with
    its own stream, `share_base`) must hold nothing lazy, which only the thread that made it can evaluate."""
    mx.eval(_module_arrays(model))


def share_base(model: nn.Module) -> nn.Module:
    """A second module tree over the same arrays: the base's weights are held once, and the new tree's adapter
    tensors can be replaced (`set_adapter_weights`) without touching `model`'s, whose optimizer replaces its own.

    An update (the optimizer's, `load_weights`) rebinds a module's entry to a new array rather than writing
    into the old one, so two trees that share arrays never see each other's updates (nothing here writes into
    an array in place). Each module is copied shallowly, its children recursively, and its sets (`freeze`'s
    `_no_grad`) are its own."""

    def clone(value):
        if isinstance(value, nn.Module):
            twin = copy.copy(value)  # a dict subclass: its entries and attributes, shallowly
            for name, attribute in vars(value).items():
                if isinstance(attribute, set):
                    object.__setattr__(twin, name, set(attribute))
            for key, child in value.items():
                dict.__setitem__(twin, key, clone(child))
            return twin
        if isinstance(value, list):
            return [clone(item) for item in value]
        if isinstance(value, tuple):
            return tuple(clone(item) for item in value)
        if isinstance(value, dict):
            return {key: clone(item) for key, item in value.items()}
        return value

    return clone(model)
