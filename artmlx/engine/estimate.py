"""A memory estimate before loading: the plan a run would get, from a model folder's files alone.

`artmlx train --dry-run` answers "will this model train here, and with what batches?" without
reading a weight: the shape comes from `config.json` (a multimodal checkpoint's `text_config`), the
weight bytes from the safetensors headers (tensor dtypes and shapes; the vision tower's tensors,
which mlx-lm does not load, left out), and the sizes from the same `MemoryPlan` rules a run uses.
The estimate's `ModelShape` equals what `ModelShape.of` reads from the loaded base (tested), so the
rows, prefill chunks and micro-batches it reports are the run's, less the LoRA adapters (a few MB).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from ..model.backend import DENSE_BASE_MAX_BYTES, DEQUANT_MIN_WEIGHTS, dense_base_limit, dequant_rows
from .memory import GB, MemoryPlan, ModelShape, device_kind, feed_forward_width, slots_for

SKIPPED_TOWERS = ("vision_tower", "vision_model", "multi_modal_projector", "audio_tower", "embed_vision",
                  "embed_audio", "visual.")
"""Tensor-name parts of the towers mlx-lm's text models do not load."""
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "U32": 4, "I16": 2, "U16": 2,
               "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
FLOATS = {"F64", "F32", "F16", "BF16"}


def model_folder(name: str) -> Path:
    """A local folder for `name`: `tiny`, a path, or a Hugging Face id already in the local cache."""
    from ..model.tiny import resolve_model

    path = Path(resolve_model(name))
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True, allow_patterns=["*.json", "*.safetensors"]))
    except Exception as error:  # noqa: BLE001 - any failure means: not on this machine
        raise FileNotFoundError(f"{name} is neither a folder nor a model in the local Hugging Face cache "
                                f"({type(error).__name__}); the estimate reads its config.json and safetensors "
                                "headers, so download it first (or pass its folder)") from None


def tensor_headers(folder: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Name -> (dtype, shape) of every tensor in the folder's safetensors files (headers only)."""
    tensors = {}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} has no .safetensors files")
    for path in files:
        with open(path, "rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(size))
        for name, entry in header.items():
            if name != "__metadata__":
                tensors[name] = (entry["dtype"], tuple(entry["shape"]))
    return {name: t for name, t in tensors.items() if not any(part in name for part in SKIPPED_TOWERS)}


def shape_from_folder(folder: Path, device: str | None = None) -> ModelShape:
    """The `ModelShape` the loaded base would have on `device` (default: this machine's)."""
    return shape_from_tensors(json.loads((folder / "config.json").read_text()), tensor_headers(folder), device)


def shape_from_tensors(config: dict, tensors: dict[str, tuple[str, tuple[int, ...]]],
                       device: str | None = None) -> ModelShape:
    """The same from a config and its tensors' (safetensors dtype, shape), e.g. `synth.parameter_layout`'s."""
    device = device or device_kind()
    text = dict(config.get("text_config") or config)
    width = feed_forward_width(tensors)
    if width > (text.get("hidden_size") or 0):  # what the loaded modules will show (memory.loaded_dims)
        text["intermediate_size"] = width
    floats = [(dtype, _count(shape)) for dtype, shape in tensors.values() if dtype in FLOATS]
    largest = max(floats, key=lambda f: f[1])[0] if floats else "F32"
    on_cpu = device == "cpu"
    activation_bytes = 4 if on_cpu else DTYPE_BYTES[largest]  # the CPU computes in float32 (model/backend.py)
    weight_bytes = sum(_count(shape) * (4 if on_cpu and dtype in FLOATS else DTYPE_BYTES[dtype])
                       for dtype, shape in tensors.values())
    quantization = config.get("quantization") or text.get("quantization") or {}
    dense = packed = 0
    for name, (dtype, shape) in tensors.items():
        stem = name.removesuffix(".weight")
        # 2-D only: experts' 3-D matrices (SwitchLinear) keep their 4-bit kernel (backend.use_dequantizing_layers)
        if name.endswith(".weight") and dtype == "U32" and len(shape) == 2 and f"{stem}.scales" in tensors:
            bits = (quantization.get(stem) or {}).get("bits", quantization.get("bits", 4))  # per-layer, or the model's
            count = shape[0] * shape[1] * 32 // bits
            if count >= DEQUANT_MIN_WEIGHTS:
                dense += count * activation_bytes
                packed += sum(_count(tensors[key][1]) * (4 if on_cpu or tensors[key][0] == "U32" else
                                                         DTYPE_BYTES[tensors[key][0]])
                              for key in (name, f"{stem}.scales", f"{stem}.biases") if key in tensors)
    if on_cpu and dense and dense <= _dense_base_limit(device):  # dequantized once at load (backend.use_dense_layers)
        return ModelShape.from_config(text, activation_bytes, weight_bytes - packed + dense, 0)
    return ModelShape.from_config(text, activation_bytes, weight_bytes, dense if _dequantizes(device) else 0)


def estimate(model: str, budget: int, max_episode_tokens: int, max_reply_tokens: int, group_size: int,
             device: str | None = None, grad_checkpoint: str = "auto", agent_server: bool = False) -> dict:
    """What a run of `model` in `budget` bytes would get, and whether one episode can train at all;
    `agent_server`: `train --rollout`'s in-process server holds a second copy of the base."""
    folder = model_folder(model)
    check_family(folder)
    return {"model": str(folder), **plan_facts(shape_from_folder(folder, device), budget, max_episode_tokens,
                                               max_reply_tokens, group_size, device, grad_checkpoint, agent_server)}


def plan_facts(shape: ModelShape, budget: int, max_episode_tokens: int, max_reply_tokens: int, group_size: int,
               device: str | None = None, grad_checkpoint: str = "auto", agent_server: bool = False) -> dict:
    """The plan's sizes; the learner's with and without per-layer checkpointing (`grad_checkpoint` as the
    config's: "auto" checkpoints when a plain episode would not fit)."""
    plan = MemoryPlan(budget, shape, device or device_kind())
    slots = slots_for(max_episode_tokens, max_reply_tokens)
    length = max_episode_tokens
    rows = plan.rows_per_batch(slots)
    facts = {"device": plan.device, "budget_gb": round(budget / GB, 2),
             "weights_gb": round(shape.weight_bytes / GB, 3),
             "dense_copies_gb": round(shape.dense_copy_bytes / GB, 3),
             "kv_mb_per_row": round(shape.kv_bytes_per_row(slots) / 2**20, 1),
             "rows_per_batch": rows, "groups_per_batch": max(rows // group_size, 0),
             "prefill_tokens_per_forward": plan.prefill_tokens(slots)}
    server_bytes = shape.weight_bytes if agent_server else 0
    if agent_server:
        facts["agent_server_weights_gb"] = facts["weights_gb"]
    for checkpointed, suffix in ((False, ""), (True, "_checkpointed")):
        per_token = shape.train_bytes_per_token(length, device=plan.device, checkpointed=checkpointed)
        needed = (shape.weight_bytes + server_bytes + shape.dense_copy_bytes + shape.head_workspace_bytes
                  + per_token * length)
        tokens = plan.train_tokens(length, checkpointed=checkpointed)
        facts.update({f"train_mb_per_token{suffix}": round(per_token / 2**20, 2),
                      f"train_tokens_per_micro_batch{suffix}": tokens,
                      f"episodes_per_micro_batch{suffix}": tokens // length,
                      f"needed_gb_for_one_episode{suffix}": round(needed / GB, 2),
                      f"fits{suffix or '_plain'}": needed <= budget})
    checkpoints = {"on": True, "off": False}.get(grad_checkpoint, not facts["fits_plain"])
    facts["grad_checkpoint"] = checkpoints  # what the learner will do
    facts["fits"] = facts["fits_checkpointed"] if checkpoints else facts["fits_plain"]
    return facts


def _count(shape) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _dense_base_limit(device: str) -> int:
    """The dense-base limit on `device`: this machine's rule for its own, the CPU's default for another."""
    return dense_base_limit() if device == device_kind() else DENSE_BASE_MAX_BYTES


def _dequantizes(device: str) -> bool:
    """Whether large 4-bit layers keep a dense copy per product on `device` (model/backend.py): this
    machine's rule for its own device; for another, the CPU's (a GPU is taken to be a Mac's)."""
    if device == device_kind():
        return dequant_rows() > 0
    return device == "cpu"


def check_family(folder: Path) -> None:
    """Refuse a family the engine cannot run, from its config alone: mlx-lm's model class is built lazily
    (no weight is read or allocated) to ask which caches its layers make."""
    from mlx_lm.utils import _get_classes

    from ..model.families import check_supported

    config = json.loads((folder / "config.json").read_text())
    model_class, args_class = _get_classes(config)
    check_supported(model_class(args_class.from_dict(config)), str(folder))


def estimate_for(config) -> dict:
    """`estimate` for a run's TrainConfig, in its memory budget."""
    from .memory import resolve_budget

    return estimate(config.model, resolve_budget(config.memory_budget_gb), config.max_episode_tokens,
                    config.max_reply_tokens, config.group_size, grad_checkpoint=config.grad_checkpoint,
                    agent_server=bool(config.rollout))


def estimate_lines(facts: dict, config) -> list[str]:
    """What `artmlx train --dry-run` prints above the facts' JSON."""
    length = config.max_episode_tokens
    lines = [f"model {facts['model']} on {facts['device']}, budget {facts['budget_gb']} GB "
             "(memory_budget_gb, or the device's default share)",
             f"  weights {facts['weights_gb']} GB, dense copies of 4-bit layers while training "
             f"{facts['dense_copies_gb']} GB",
             f"  rollouts: {facts['kv_mb_per_row']} MB of KV cache per row at max_episode_tokens={length}; "
             f"{facts['rows_per_batch']} rows per batch ({facts['groups_per_batch']} groups of {config.group_size}); "
             f"prefill {facts['prefill_tokens_per_forward']} tokens per forward"]
    if "agent_server_weights_gb" in facts:
        lines.append(f"  agents play on an in-process server of the policy: a second copy of the base, "
                     f"{facts['agent_server_weights_gb']} GB, counted below")
    for suffix, name in (("", "plain"), ("_checkpointed", "with per-layer gradient checkpointing")):
        lines.append(f"  learner, {name}: {facts['train_mb_per_token' + suffix]} MB per token; one {length}-token "
                     f"episode needs {facts['needed_gb_for_one_episode' + suffix]} GB with the weights; "
                     f"micro-batches of {facts['train_tokens_per_micro_batch' + suffix]} tokens "
                     f"({facts['episodes_per_micro_batch' + suffix]} episodes)")
    chosen = "checkpointed" if facts["grad_checkpoint"] else "plain"
    lines.append(f"  grad_checkpoint={config.grad_checkpoint}: the learner runs {chosen}; "
                 f"{'fits' if facts['fits'] else 'does NOT fit'}")
    return lines
