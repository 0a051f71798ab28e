"""Per-backend adjustments to a loaded model, made once at load by actors and learner alike.

- CUDA: plain `nn.RoPE` layers become `PortableRoPE` (rope.py says why).
- CPU: MLX 0.32's CPU kernels for bfloat16 and for 4-bit products are slow. Measured on a 2-core
  x86-64 (one 896 x 4864 projection): a bfloat16 4-bit product runs at 0.2 GFLOP/s, float32 at
  1.4-1.7 GFLOP/s whatever the batch, while dequantizing the weights and multiplying in float32
  with BLAS reaches 14 GFLOP/s at 64 rows (28 GFLOP/s for an already dense matrix). So on the CPU:
  1. floating parameters are cast to float32 (a bfloat16 model runs ~10x faster; scales and biases
     of 4-bit layers double in size, the 4-bit codes stay);
  2. 4-bit linear layers and tied heads with at least `DEQUANT_MIN_WEIGHTS` weights dequantize per
     call and use a dense product when the call has `dequant_rows()` rows or more (batched decode,
     prefill, training); below that (single-sequence decode) the 4-bit kernel is faster. The base
     stays 4-bit in memory: the float copy lives only for the one product.
  Small layers (the embedded tiny model's) keep MLX's kernels, so its results do not change.
  3. A small base is dequantized once, at load, instead (`dense_base_limit()`: when the dense float32
     copy of its large 4-bit layers is at most 2 GiB; `ARTMLX_DENSE_BASE_GB=N` sets the limit, 0 turns it
     off). The per-call dequantize costs ~7 ns a weight, whatever the rows: for SmolLM2-135M (4-bit,
     OpenBLAS) a decode step took 538 / 633 / 816 ms at 16 / 64 / 128 rows dequantizing per call and
     117 / 224 / 373 ms over dense weights held once (540 MB); a single row 76 ms.
- CUDA (H200, MLX 0.32.4, bfloat16, one 1536 x 8960 projection): the 4-bit kernel takes 0.13 ms
  from 8 to 256 rows, 0.35 / 0.96 / 3.4 ms at 1,024 / 4,096 / 16,384 rows; dequantizing and
  multiplying dense takes 0.11 / 0.15 / 0.38 / 0.85 ms at 32 / 1,024 / 4,096 / 16,384 rows (at 8
  rows, 0.16 ms: slower). On the GPU alone dense would win from 32 rows, but a decode step is bound by
  the host's cost of launching kernels, not by the device: the dense path's two launches (a dequantize
  and a cuBLAS product, ~23 us of host time against ~8 us for the 4-bit kernel) made a 32-row decode
  step of the 0.5B shape take 41.5 ms against 26.8 ms with the 4-bit kernel (host waiting for the device:
  under 2 % of the step). So CUDA dequantizes from 512 rows: prefill chunks and training, never decode.
  Apple silicon keeps MLX's Metal kernels (no measurement says otherwise).
  `ARTMLX_DEQUANT_ROWS=N` sets the row threshold on any backend (0 turns the dequantizing path off).
- CUDA, processes that train (the learner, `artmlx train`): MLX's cuDNN attention is switched off
  (`MLX_CUDA_USE_CUDNN_SDPA=0`, unless the user set it), so attention runs as MLX's own matmul and
  softmax kernels. With cuDNN, MLX 0.32.4 on the H200 ended a 0.5B `artmlx train` update with a NaN
  gradient norm and, on the same update's micro-batches, with "an illegal memory access"; without it
  the same update trains with finite gradients. It is also faster for our step (prefix rows and array
  masks; every new micro-batch shape builds a cuDNN plan): 31,154 against 20,337 trained tokens/s
  compiled, 4,096-token micro-batches of the 0.5B shape. Environment actors keep cuDNN: their prefill is
  forward-only and 33 % faster with it (9,401 against 7,074 generated tokens/s, 256 rows).
- CUDA, the serving scheduler (`artmlx serve`, agent actors, MLXBackend): switched off too. Its prefill
  shapes change with every admission (rows joining, prompts of any length, prefix-cache hits), and
  cuDNN builds a plan for every new shape: 32 agents x 4 turns over a 1,000-word system prompt (0.5B
  shape, H200) spent 49 of 58 s admitting with cuDNN and 3.7 s without; 171 against 667 tok/s.
"""

from __future__ import annotations

import os

import mlx.core as mx
import mlx.nn as nn

from .rope import portable_rope_wanted, use_portable_rope

DEQUANT_MIN_WEIGHTS = 1 << 16
CPU_DEQUANT_ROWS = 8
CUDA_DEQUANT_ROWS = 512


def on_cpu() -> bool:
    return mx.default_device() == mx.cpu


def on_cuda() -> bool:
    return not on_cpu() and hasattr(mx, "cuda") and mx.cuda.is_available()


def dequant_rows() -> int:
    """Rows from which a 4-bit product dequantizes first; 0 = never."""
    forced = os.environ.get("ARTMLX_DEQUANT_ROWS")
    if forced is not None:
        return max(0, int(forced))
    return CPU_DEQUANT_ROWS if on_cpu() else CUDA_DEQUANT_ROWS if on_cuda() else 0


def _rows(x: mx.array) -> int:
    return x.size // x.shape[-1] if x.ndim else 1


def _dense_product(module, x: mx.array) -> mx.array | None:
    """x @ W.T with W dequantized for this one product, or None when x has too few rows for that to pay."""
    if not module.dequant_rows or _rows(x) < module.dequant_rows:
        return None
    weight = mx.dequantize(module["weight"], module["scales"], module.get("biases"), group_size=module.group_size,
                           bits=module.bits, mode=module.mode)
    return x @ weight.astype(x.dtype).T


class DequantizingLinear(nn.QuantizedLinear):
    """`QuantizedLinear` that multiplies dense (dequantized) weights for batched inputs."""

    def __call__(self, x: mx.array) -> mx.array:
        y = _dense_product(self, x)
        if y is None:
            return super().__call__(x)
        return y + self["bias"] if "bias" in self else y


class DequantizingEmbedding(nn.QuantizedEmbedding):
    """`QuantizedEmbedding` whose tied-head product (`as_linear`) does the same."""

    def as_linear(self, x: mx.array) -> mx.array:
        y = _dense_product(self, x)
        return super().as_linear(x) if y is None else y


def dense_weight_count(module) -> int:
    """Weights of a 4-bit layer once dequantized (its packed codes hold 32 // bits each)."""
    return module["weight"].shape[0] * module["weight"].shape[1] * 32 // module.bits


DENSE_BASE_MAX_BYTES = 2 << 30


def dense_base_limit() -> int:
    """Bytes of dense float32 copies under which a base's large 4-bit layers are dequantized at load (CPU)."""
    forced = os.environ.get("ARTMLX_DENSE_BASE_GB")
    if forced is not None:
        return max(0, int(float(forced) * 2**30))
    return DENSE_BASE_MAX_BYTES if on_cpu() else 0


def _large_quantized(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(path, module) for path, module in model.named_modules()
            if type(module) in (nn.QuantizedLinear, nn.QuantizedEmbedding)
            and dense_weight_count(module) >= DEQUANT_MIN_WEIGHTS]


def _dense_twin(module: nn.Module, dtype: mx.Dtype) -> nn.Module:
    weight = mx.dequantize(module["weight"], module["scales"], module.get("biases"), group_size=module.group_size,
                           bits=module.bits, mode=module.mode).astype(dtype)
    if isinstance(module, nn.QuantizedEmbedding):
        twin = nn.Embedding(*weight.shape)
    else:
        twin = nn.Linear(weight.shape[1], weight.shape[0], bias="bias" in module)
        if "bias" in module:
            twin.bias = module["bias"]
    twin.weight = weight
    return twin


def use_dense_layers(model: nn.Module, limit_bytes: int, dtype: mx.Dtype = mx.float32) -> int:
    """Replace every large 4-bit layer by a dense one of the same values, if their dense copies together
    fit `limit_bytes`; returns how many were replaced (0 when they do not fit)."""
    large = _large_quantized(model)
    if not large or sum(dense_weight_count(m) for _, m in large) * dtype.size > limit_bytes:
        return 0
    from mlx.utils import tree_unflatten

    model.update_modules(tree_unflatten([(path, _dense_twin(module, dtype)) for path, module in large]))
    mx.eval(model.parameters())
    return len(large)


def use_dequantizing_layers(model: nn.Module, rows: int) -> int:
    """Give every large 4-bit layer the dequantizing product; returns how many were changed."""
    changed = 0
    for _, module in model.named_modules():
        for cls, new in ((nn.QuantizedLinear, DequantizingLinear), (nn.QuantizedEmbedding, DequantizingEmbedding)):
            if type(module) is cls and dense_weight_count(module) >= DEQUANT_MIN_WEIGHTS:
                module.__class__ = new  # same parameters, another product; no copy of the weights
                module.dequant_rows = rows
                changed += 1
    return changed


def prefer_mlx_attention() -> None:
    """Call before a training or serving process's first attention: MLX's own attention kernels on CUDA
    (see above)."""
    os.environ.setdefault("MLX_CUDA_USE_CUDNN_SDPA", "0")


def adapt_to_backend(model: nn.Module) -> dict:
    """Apply the adjustments for the current default device; returns what was done."""
    done = {"portable_rope": 0, "float32": False, "dense_layers": 0, "dequantizing_layers": 0}
    if portable_rope_wanted():
        done["portable_rope"] = use_portable_rope(model)
    if on_cpu():
        model.set_dtype(mx.float32)
        done["float32"] = True
        done["dense_layers"] = use_dense_layers(model, dense_base_limit())
    rows = dequant_rows()
    if rows and not done["dense_layers"]:
        done["dequantizing_layers"] = use_dequantizing_layers(model, rows)
    return done
