"""Memory budgets: how much a process may use, and how many rows and tokens fit in it.

Every process (learner, actor, `artmlx train`) has one budget in bytes for the model, the KV cache
and the activations. By default it is `DEFAULT_FRACTION` of the device's memory (unified memory on a
Mac, the GPU's memory on NVIDIA, physical RAM on a CPU), divided by the number of processes that
share the device (`artmlx run` tells each process its share). `apply_limits` hands the budget to MLX
(`mx.set_memory_limit`) and caps MLX's buffer cache, so freed buffers go back instead of piling up
(an uncapped cache held 122 GB of an H200 for a 0.5B model).

Sizing rules (all in `MemoryPlan`):
- KV cache: a row costs `kv_bytes_per_token * slots_per_row`, where a token costs
  layers x 2 (keys, values) x KV heads x head dim x activation bytes, and a row's slots are its
  longest transcript (`max_episode_tokens` + one reply) plus room for padding, plus its decode
  workspace: sampling holds about ten float32 copies of the row's distribution over the vocabulary
  (logits, tempered logits, exponentials, logprobs, uniform and Gumbel noise; 6 MB a row for Qwen;
  measured at its peak on the CPU: 12 bytes an entry with Gumbel-max, 16 with its inverse-CDF draw).
  Rows that fit are `KV_SHARE` of what the weights leave. Sliding-window layers hold at most their
  window plus `WINDOW_SLACK` slots (the ragged cache drops older ones, `engine/cache.py`); recurrent
  layers hold a state per row instead; Gemma 4's KV-shared layers hold nothing.
- Rows per batch are the fewer of what fits and `DEVICE_ROWS` for the backend (beyond it decode
  throughput no longer grows: on the H200, 0.5B shape, 2,011 / 4,977 / 5,937 tok/s at 64 / 256 / 512
  rows; on a 2-core CPU, tic-tac-toe with the tiny model, 5.5 / 7.8 / 7.5 / 7.9 groups/s at 16 / 32 / 64 /
  128 rows, and `artmlx run` took 4.3 s per update with 32-row batches against 6.2 s with 64). An actor
  generates `rows // G` groups per batch, at most its share of an update (`artmlx run`'s windows follow it).
- Prefill chunks: as many tokens per forward as `WORKSPACE_SHARE` of the free memory holds at
  `prefill_bytes_per_token`: every layer's activations, since a forward's buffers are released only
  as the device finishes with them (measured on the H200: 0.8 MB per token for Qwen2.5-0.5B in
  bfloat16, all 24 layers' worth; 0.55 MB on the CPU in float32, where work runs op by op).
- Learner micro-batches: as many padded tokens as `TRAIN_SHARE` of the free memory holds at
  `train_bytes_per_token`: every layer's saved activations and attention probabilities for the
  backward pass. The vocabulary projection runs a chunk of `head_chunk_rows` policy tokens at a time
  (`learner/head.py`) and takes `HEAD_BYTES_PER_CHUNK_ENTRY` per chunk entry whatever the batch
  (1.5 GB for Qwen's vocabulary) and `HEAD_CHUNKED_BYTES_PER_VOCAB` per policy token and entry
  (measured on the CPU, V = 151,936, `benchmarks/head_memory.py`: peak 1.16 / 1.37 GB at 1,024 /
  2,048 policy tokens against 1.74 / 3.48 GB unchunked). Model families whose head is not split off
  (`model/parts.py`) make logits everywhere and pay `HEAD_BYTES_PER_VOCAB` bytes per vocabulary entry
  for the share of tokens the policy sampled (the float32 logits, their exponentials and gradient:
  2.4 MB a token for Qwen).
  No KV cache is alive during a training step, so on the GPU the step may use most of the budget:
  measured on the H200 (0.5B shape, bfloat16, MLX's own attention), peak 11.8 / 34.9 GB at 2,048 /
  8,192-token micro-batches of 512-token sequences and 11.1 / 35.6 GB at 1,024 tokens: 3.8-4.0 MB a
  token, against 4.0 / 5.3 MB from this rule with `TRAIN_SCORES["gpu"]`. (With the CPU's constants
  the rule said 5.4 / 8.1 MB and a 32 GB budget gave micro-batches of one sequence.) The dense
  copies of 4-bit layers that dequantize per product (`model/backend.py`) all stay alive until the
  backward pass has used them: 1 GB for the 0.5B shape, 15 GB for 7B, taken off the budget first.
- Gated DeltaNet layers (Qwen3.5, Qwen3-Next) add, per token, a share of their float32 delta-rule state:
  `DELTA_TRAIN_STATES` in training, `DELTA_PREFILL_STATES` in a prefill (`model/recurrence.py`; measured on
  the CPU for one layer of the 0.8B shape, 512-1,024 steps: 0.26-0.31 of its 1 MiB state a token in training
  through the closed form, 0.31-0.36 through the chunked steps (per-key gates), 0.08-0.15 in a forward at
  512-1,024 steps (about one 64-step chunk's states per row and layer whatever the length); mlx-lm's
  own loop held 4.1 and 1.0, and the plan that left them out gave the 0.8B shape 26,440-token micro-batches
  that ran out of an H200's memory).
Whatever the budget, a micro-batch's policy tokens x vocabulary (unsplit families) stays below `MAX_ARRAY_ELEMENTS`:
on the H200, MLX 0.32.4 gave wrong values (off by up to 22.6 in the logits) for a prefill that made
one 128 x 301 x 151,936 array (5.9e9 elements, past 2^31), so no array we make may reach that size.
The per-token constants were measured with MLX's peak-memory counter (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ..model.backend import dense_weight_count
from ..model.families import text_args, text_model, window_layers
from ..model.parts import SPLIT_MODEL_TYPES

DEFAULT_FRACTION = 0.75
KV_SHARE = 0.6
WORKSPACE_SHARE = 0.3
DEVICE_ROWS = {"cpu": 32, "gpu": 256}
# Bytes per token per layer, as multiples of (hidden, intermediate) x activation bytes, plus attention
# scores and probabilities in float32 per head per key. Fitted to MLX's peak-memory counter (module docstring).
PREFILL_DENSE = {"gpu": (4, 3), "cpu": (2, 1)}
TRAIN_HIDDEN, TRAIN_MLP = 16, 6
TRAIN_SCORES = {"gpu": 1, "cpu": 3}
TRAIN_SHARE = {"gpu": 0.6, "cpu": WORKSPACE_SHARE}
DELTA_TRAIN_STATES, DELTA_PREFILL_STATES = 0.6, 0.1
DECODE_BYTES_PER_VOCAB = 40
HEAD_BYTES_PER_VOCAB = 16
MAX_ARRAY_ELEMENTS = (1 << 31) - 1
HEAD_CHUNK_ENTRIES = 1 << 25  # logits per chunk of the learner's head (learner/head.py): 220 rows of Qwen's vocabulary
HEAD_CHUNK_MAX_ROWS = 4096
HEAD_BYTES_PER_CHUNK_ENTRY = 48  # its peak per entry, forward and backward (measured 40 on the CPU), rounded up
HEAD_CHUNKED_BYTES_PER_VOCAB = 2  # and what still grows with the policy tokens (measured 1.4 per token and entry)
GB = 1 << 30


def head_chunk_rows(vocab: int) -> int:
    """Rows per chunk of the learner's vocabulary projection (`learner/head.chunked_logprobs`)."""
    return max(1, min(HEAD_CHUNK_MAX_ROWS, HEAD_CHUNK_ENTRIES // max(vocab, 1)))



def device_kind() -> str:
    return "cpu" if mx.default_device() == mx.cpu else "gpu"


def device_memory() -> int:
    """Bytes of memory the current device can use: GPU / unified memory, or physical RAM on the CPU."""
    info = mx.device_info() if hasattr(mx, "device_info") else {}
    if device_kind() == "gpu":
        for key in ("max_recommended_working_set_size", "memory_size", "total_memory"):
            if info.get(key):
                return int(info[key])
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_budget(sharing: int = 1) -> int:
    """This process's share of the device when `sharing` processes use it."""
    return int(device_memory() * DEFAULT_FRACTION / max(1, sharing))


def resolve_budget(budget_gb: float = 0.0) -> int:
    """Bytes from a GB setting; 0 means the default, `ARTMLX_MEMORY_SHARING` processes sharing the device."""
    if budget_gb > 0:
        return int(budget_gb * GB)
    return default_budget(int(os.environ.get("ARTMLX_MEMORY_SHARING", "1") or 1))


def apply_limits(budget: int) -> None:
    """MLX keeps to the budget and returns freed buffers beyond a quarter of it."""
    mx.set_memory_limit(budget)
    mx.set_cache_limit(budget // 4)


WINDOW_SLACK = 3 * 256  # slots a window layer may hold past its window: two cache blocks before a trim, one chunk


def window_layout(text: dict) -> tuple[int, int]:
    """(sliding-window layers that keep a cache, their widest window) from a language model's config:
    `layer_types` (OLMo 3, GPT-OSS, Gemma 4) or `sliding_window_pattern` (Gemma 3/4: every pattern-th
    layer is global). A config that names neither is counted as all global (the larger estimate)."""
    window = text.get("sliding_window") or 0
    cached = text["num_hidden_layers"] - (text.get("num_kv_shared_layers") or 0)
    if not window:
        return 0, 0
    if text.get("layer_types"):
        return sum(kind == "sliding_attention" for kind in text["layer_types"][:cached]), window
    pattern = text.get("sliding_window_pattern")
    if pattern:
        return sum((i + 1) % pattern != 0 for i in range(cached)), window
    return 0, 0


def global_attention(text: dict) -> tuple[int, int]:
    """(KV heads, head size) of the full-attention layers where they differ from the sliding ones, else
    (0, 0): Gemma 4's global layers use `global_head_dim` and, when keys are their values
    (`attention_k_eq_v`), `num_global_key_value_heads` (mlx-lm's `gemma4_text.Attention`)."""
    if not str(text.get("model_type", "")).startswith("gemma4") or not text.get("global_head_dim"):
        return 0, 0
    heads = (text.get("num_global_key_value_heads") if text.get("attention_k_eq_v") else None)
    return heads or text.get("num_key_value_heads") or text["num_attention_heads"], text["global_head_dim"]


def delta_layers(text: dict) -> int:
    """Gated DeltaNet layers (every layer but each `full_attention_interval`-th; 0: the model has none)."""
    if "linear_num_value_heads" not in text:
        return 0
    interval = text.get("full_attention_interval") or 4
    return sum(1 for i in range(text["num_hidden_layers"]) if (i + 1) % interval != 0)


def delta_state_bytes(text: dict) -> int:
    """The float32 delta-rule states of all Gated DeltaNet layers, one row (0: the model has none)."""
    count = delta_layers(text)
    if not count:
        return 0
    return count * text["linear_num_value_heads"] * text["linear_value_head_dim"] * text["linear_key_head_dim"] * 4


def recurrent_layout(text: dict, activation_bytes: int) -> tuple[int, int]:
    """(recurrent layers, bytes of their state per row) from a language model's config. Gated DeltaNet
    (Qwen3.5, Qwen3-Next) keeps a float32 delta-rule state of value heads x value dim x key dim and a
    convolution window; LFM2's short convolutions keep a window of hidden-size features."""
    layers = text["num_hidden_layers"]
    if "linear_num_value_heads" in text:
        count = delta_layers(text)
        hv, dv = text["linear_num_value_heads"], text["linear_value_head_dim"]
        hk, dk = text["linear_num_key_heads"], text["linear_key_head_dim"]
        window = ((text.get("linear_conv_kernel_dim") or 4) - 1) * (2 * hk * dk + hv * dv) * activation_bytes
        return count, delta_state_bytes(text) + count * window
    if text.get("model_type") == "lfm2":
        attention = text.get("full_attn_idxs") or [i for i, kind in enumerate(text.get("layer_types") or [])
                                                   if kind == "full_attention"]
        count = layers - len(attention)
        return count, count * ((text.get("conv_L_cache") or 3) - 1) * text["hidden_size"] * activation_bytes
    return 0, 0


REQUIRED_DIMS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")
_FEED_FORWARD = ("mlp", "feed_forward", "ffn")


def loaded_dims(model: nn.Module) -> dict:
    """The dimensions a loaded model's modules show, under their config names: layers (`model.layers`),
    vocabulary and hidden size (the largest embedding), the feed-forward width (the widest output of a
    feed-forward projection). Config keys differ by family (LFM2 names its width `block_ff_dim` and may adjust
    it), so the memory plan reads what was built and keeps config keys for what modules do not show."""
    lm = text_model(model)
    dims: dict = {}
    layers = getattr(lm, "layers", None)
    if isinstance(layers, (list, tuple)) and layers:
        dims["num_hidden_layers"] = len(layers)
    widest = 0
    for path, module in lm.named_modules():
        if isinstance(module, (nn.Embedding, nn.QuantizedEmbedding)) and "per_layer" not in path:
            rows = module.weight.shape[0]
            if rows > dims.get("vocab_size", 0):
                columns = module.weight.shape[1] * (32 // module.bits if isinstance(module, nn.QuantizedEmbedding)
                                                    else 1)
                dims.update(vocab_size=rows, hidden_size=columns)
        weight = getattr(module, "weight", None)
        if (isinstance(weight, mx.array) and weight.ndim >= 2 and not isinstance(module, nn.Embedding)
                and any(part in _FEED_FORWARD for part in path.split("."))):
            widest = max(widest, weight.shape[-2])  # (out, in), or (experts, out, in)
    if widest > dims.get("hidden_size", 0):  # a gate/up projection widens; only down projections seen: unknown
        dims["intermediate_size"] = widest
    return dims


def feed_forward_width(tensors: dict[str, tuple]) -> int:
    """`loaded_dims`' feed-forward width from a folder's tensor names and shapes (`name -> (dtype, shape)`):
    the widest output of a language model's feed-forward weight (0: none found)."""
    names = [n for n in tensors if n.endswith(".weight")]
    if any(n.startswith("language_model.") for n in names):  # a multimodal checkpoint: its language model only
        names = [n for n in names if n.startswith("language_model.")]
    return max((tensors[n][1][-2] for n in names if len(tensors[n][1]) >= 2
                and any(part in _FEED_FORWARD for part in n.split("."))), default=0)


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    activation_bytes: int
    weight_bytes: int
    dense_copy_bytes: int = 0  # dense copies of the 4-bit layers that dequantize per product (model/backend.py)
    recurrent_layers: int = 0  # layers that keep a state per row instead of keys and values
    state_bytes_per_row: int = 0  # those layers' states, one row
    delta_state_bytes: int = 0  # of which Gated DeltaNet's delta-rule states (their recurrence's activations scale with it)
    kv_shared_layers: int = 0  # layers that attend over an earlier layer's keys and values (Gemma 4): no cache
    window_layers: int = 0  # sliding-window layers with a cache: they hold at most `window + WINDOW_SLACK` slots
    window: int = 0
    global_kv_heads: int = 0  # Gemma 4's full-attention layers: their own KV heads and head size (0: the same)
    global_head_dim: int = 0
    chunked_head: bool = False  # the learner projects onto the vocabulary a chunk of rows at a time (split models)

    @classmethod
    def of(cls, model: nn.Module) -> "ModelShape":
        args = text_args(model)  # a multimodal checkpoint's language model
        floats = [v for _, v in tree_flatten(model.parameters()) if mx.issubdtype(v.dtype, mx.floating)]
        # The compute dtype is that of the base's largest float tensor (LoRA's float32 adapters are small).
        activation_bytes = max(floats, key=lambda v: v.size).dtype.size if floats else 4
        windows = window_layers(model)  # the loaded model's own sliding-window layers
        text = {"model_type": getattr(args, "model_type", ""), **vars(args), **loaded_dims(model)}
        return cls.from_config(text, activation_bytes,
                               weight_bytes=sum(v.nbytes for _, v in tree_flatten(model.parameters())),
                               dense_copy_bytes=sum(dense_weight_count(m) * activation_bytes
                                                    for _, m in model.named_modules() if getattr(m, "dequant_rows", 0)),
                               windows=(len(windows), max(windows.values(), default=0)))

    @classmethod
    def from_config(cls, text: dict, activation_bytes: int, weight_bytes: int, dense_copy_bytes: int,
                    windows: tuple[int, int] | None = None) -> "ModelShape":
        """The shape from a language model's config (a loaded model's arguments, or a folder's config.json:
        `estimate.shape_from_tensors`), its compute width and its bytes; `windows` (window layers, widest
        window) where the loaded model says, else read from the config (`window_layout`)."""
        missing = [key for key in REQUIRED_DIMS if not text.get(key)]
        if missing:
            raise ValueError(f"cannot size the {text.get('model_type') or '?'} model for the memory plan: its config "
                             f"gives no {', '.join(missing)} and its modules do not show it")
        heads = text["num_attention_heads"]
        recurrent, state_bytes = recurrent_layout(text, activation_bytes)
        window_count, window = windows if windows is not None else window_layout(text)
        global_kv_heads, global_head_dim = global_attention(text)
        return cls(chunked_head=text.get("model_type") in SPLIT_MODEL_TYPES, recurrent_layers=recurrent,
                   state_bytes_per_row=state_bytes, delta_state_bytes=delta_state_bytes(text), window_layers=window_count, window=window,
                   global_kv_heads=global_kv_heads, global_head_dim=global_head_dim,
                   kv_shared_layers=text.get("num_kv_shared_layers") or 0, layers=text["num_hidden_layers"],
                   hidden=text["hidden_size"], intermediate=text.get("intermediate_size") or 4 * text["hidden_size"],
                   heads=heads, kv_heads=text.get("num_key_value_heads") or heads,
                   head_dim=text.get("head_dim") or text["hidden_size"] // heads, vocab=text["vocab_size"],
                   activation_bytes=activation_bytes, weight_bytes=weight_bytes, dense_copy_bytes=dense_copy_bytes)

    @property
    def kv_bytes_per_token(self) -> int:
        """Keys and values of one token in every layer that caches them (window layers included)."""
        global_layers = self.layers - self.recurrent_layers - self.kv_shared_layers - self.window_layers
        global_width = (self.global_kv_heads or self.kv_heads) * (self.global_head_dim or self.head_dim)
        width = self.window_layers * self.kv_heads * self.head_dim + global_layers * global_width
        return 2 * width * self.activation_bytes

    def kv_bytes_per_row(self, slots: int) -> int:
        """A row's KV cache at `slots` slots: window layers stop growing past their window and slack."""
        per_layer_slot = 2 * self.kv_heads * self.head_dim * self.activation_bytes
        bounded = self.window_layers * per_layer_slot * max(slots - self.window - WINDOW_SLACK, 0)
        return self.kv_bytes_per_token * slots - bounded

    @property
    def head_workspace_bytes(self) -> int:
        """The learner's vocabulary projection when it runs in chunks: one chunk's logits and gradient."""
        if not self.chunked_head:
            return 0
        return HEAD_BYTES_PER_CHUNK_ENTRY * self.vocab * head_chunk_rows(self.vocab)

    def prefill_bytes_per_token(self, context: int, device: str = "gpu") -> int:
        hidden, mlp = PREFILL_DENSE[device]
        dense = self.layers * (hidden * self.hidden + mlp * self.intermediate) * self.activation_bytes
        return int(dense + 8 * self.heads * context + DELTA_PREFILL_STATES * self.delta_state_bytes)

    def train_bytes_per_token(self, length: int, policy_fraction: float = 1.0, device: str = "gpu",
                              checkpointed: bool = False) -> int:
        dense = (TRAIN_HIDDEN * self.hidden + TRAIN_MLP * self.intermediate) * self.activation_bytes
        per_vocab = HEAD_CHUNKED_BYTES_PER_VOCAB if self.chunked_head else HEAD_BYTES_PER_VOCAB
        head = policy_fraction * per_vocab * self.vocab
        layer = dense + TRAIN_SCORES[device] * 4 * self.heads * length
        delta = DELTA_TRAIN_STATES * self.delta_state_bytes
        if checkpointed:  # every layer's input and K/V kept, one layer's inside alive at a time (twice: forward, backward)
            kept = (self.hidden + 2 * self.kv_heads * self.head_dim) * self.activation_bytes
            one_delta_layer = delta / max(self.recurrent_layers, 1)
            return int(self.layers * kept + 2 * (layer + one_delta_layer) + head)
        return int(self.layers * layer + delta + head)


@dataclass(frozen=True)
class MemoryPlan:
    """Sizes derived from one process's budget and the model's shape."""

    budget: int
    shape: ModelShape
    device: str = "gpu"

    @property
    def free(self) -> int:
        return max(self.budget - self.shape.weight_bytes, 0)

    def rows_per_batch(self, slots_per_row: int) -> int:
        """Rows whose KV cache (and decode logits) fit, capped by what the device can use."""
        per_row = (self.shape.kv_bytes_per_row(slots_per_row) + self.shape.state_bytes_per_row
                   + DECODE_BYTES_PER_VOCAB * self.shape.vocab)
        fit = int(self.free * KV_SHARE // max(per_row, 1))
        return max(1, min(fit, DEVICE_ROWS[self.device]))

    def agent_sizes(self, slots_per_row: int, wanted: int) -> tuple[int, int]:
        """(concurrent requests, prefix-cache bytes) for an agent server: each request's KV, decode logits and a
        finished turn of the same size kept for its next turn, inside the KV share (at most `wanted` requests)."""
        kept = self.shape.kv_bytes_per_row(slots_per_row) + self.shape.state_bytes_per_row
        per_row = 2 * kept + DECODE_BYTES_PER_VOCAB * self.shape.vocab  # its running row, and its kept turn
        rows = max(1, min(wanted, int(self.free * KV_SHARE // max(per_row, 1))))
        return rows, rows * kept

    def prefill_tokens(self, context: int) -> int:
        """Tokens one prefill forward may hold."""
        return max(16, int(self.free * WORKSPACE_SHARE // self.shape.prefill_bytes_per_token(context, self.device)))

    def needs_checkpointing(self, length: int, policy_fraction: float = 1.0) -> bool:
        """Whether one sequence of `length` tokens would not fit the training workspace unless checkpointed."""
        return self._train_fits(length, policy_fraction, False) < length

    def _train_fits(self, length: int, policy_fraction: float, checkpointed: bool) -> int:
        per_token = self.shape.train_bytes_per_token(length, policy_fraction, self.device, checkpointed)
        return int(self._train_workspace() // per_token)

    def _train_workspace(self) -> float:
        # A training step keeps every dequantized weight for its backward pass (the product's gradient needs it).
        workspace = max(self.free - self.shape.dense_copy_bytes, 0) * TRAIN_SHARE[self.device]
        return max(workspace - self.shape.head_workspace_bytes, 0)

    def train_tokens(self, length: int, policy_fraction: float = 1.0, checkpointed: bool = False) -> int:
        """Padded tokens one learner micro-batch may hold at sequences of `length` (never less than one)."""
        fits = self._train_fits(length, policy_fraction, checkpointed)
        if self.shape.chunked_head:  # no array of policy tokens x vocabulary is ever made
            return max(length, fits)
        addressable = int(0.9 * MAX_ARRAY_ELEMENTS / self.shape.vocab / max(policy_fraction, 1e-3))
        return max(length, min(fits, addressable))

    def describe(self, slots_per_row: int) -> dict:
        return {"budget_gb": round(self.budget / GB, 2), "weights_gb": round(self.shape.weight_bytes / GB, 3),
                "kv_mb_per_row": round(self.shape.kv_bytes_per_row(slots_per_row) / 2**20, 1),
                "rows_per_batch": self.rows_per_batch(slots_per_row), "device": self.device}


def plan_for(model: nn.Module, budget: int) -> MemoryPlan:
    return MemoryPlan(budget, ModelShape.of(model), device_kind())


def slots_for(max_episode_tokens: int, max_reply_tokens: int) -> int:
    """KV slots a row may need: its longest transcript, one more reply, and padding between turns."""
    return int(math.ceil((max_episode_tokens + max_reply_tokens) * 1.25))
