"""LoRA's product for a decode step on MLX's CUDA backend: one kernel instead of five operations.

Measured on the H200 (MLX 0.32.4, `dev/probes/op_host_cost.py`): a small-batch decode step is bound
by the host's cost of launching operations, not by the device, and mlx-lm's `LoRALinear` costs ~70 us
of host time per call: the 4-bit product (~8 us), two cuBLAS products for the rank-r factors (~23 us
each), a scale, a cast and an add. The 0.5B shape has 168 of them, so one decoded row took 20 ms per
token with LoRA and 4-6 ms without it.

`FusedLoRALinear` keeps the 4-bit product and computes `y + scale * (x A) B` for up to `FUSED_ROWS`
rows in one kernel (`lora_product`): one block per row and output tile computes the row's rank-r
projection `x A` in float32 (a block reduction over the input features), then its tile of `(x A) B`,
added to `y` in float32 and rounded once. mlx-lm rounds the LoRA term to the compute dtype before
the add, so the two differ by bfloat16 rounding, the noise the sampler's logprobs already carry on a GPU.
The layer's sizes are read at run time, so a process compiles one kernel per rank and dtype: MLX compiles
custom kernels with NVRTC in every process (it keeps no PTX of them on disk), and one kernel per layer shape
had cost each process ~12-13 s on the H200 at the 0.5B shape (five shapes).

The kernel has no gradient. It runs only while the engine builds a forward (`inference()`, entered by
`RaggedCache.forward`); the learner's products, and every call outside that context, are mlx-lm's.
`ARTMLX_FUSED_LORA=0` turns it off and `ARTMLX_FUSED_LORA_ROWS=N` moves its row limit (A/B switches for benchmarks).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading

import mlx.core as mx
from mlx_lm.tuner.lora import LoRALinear

# above this a decode step's launches are amortised and cuBLAS's products are faster (ARTMLX_FUSED_LORA_ROWS: A/B)
FUSED_ROWS = int(os.environ.get("ARTMLX_FUSED_LORA_ROWS", "32"))
THREADS = 256
MAX_RANK = 64

_local = threading.local()
_scales: dict[float, mx.array] = {}

_SOURCE = """
    constexpr int THREADS = 256;
    constexpr int WARPS = THREADS / 32;
    __shared__ float partial[RANK][WARPS];
    __shared__ float z[RANK];
    const int K = x_shape[1];  // read at run time: one compiled kernel serves every layer shape
    const int N = y_shape[1];
    const int row = blockIdx.y;
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;

    float acc[RANK];
    #pragma unroll
    for (int j = 0; j < RANK; ++j) acc[j] = 0.0f;
    const TX* xr = x + (size_t)row * K;
    for (int k = tid; k < K; k += THREADS) {
        const float xv = static_cast<float>(xr[k]);
        const TA* ar = a + (size_t)k * RANK;
        #pragma unroll
        for (int j = 0; j < RANK; ++j) acc[j] += xv * static_cast<float>(ar[j]);
    }
    #pragma unroll
    for (int j = 0; j < RANK; ++j) {
        float v = acc[j];
        for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffff, v, offset);
        if (lane == 0) partial[j][warp] = v;
    }
    __syncthreads();
    if (tid < RANK) {
        float s = 0.0f;
        for (int w = 0; w < WARPS; ++w) s += partial[tid][w];
        z[tid] = s * scale[0];
    }
    __syncthreads();

    const int n = blockIdx.x * THREADS + tid;
    if (n < N) {
        float s = static_cast<float>(y[(size_t)row * N + n]);
        #pragma unroll
        for (int j = 0; j < RANK; ++j) s += z[j] * static_cast<float>(b[(size_t)j * N + n]);
        out[(size_t)row * N + n] = static_cast<TX>(s);
    }
"""


_kernel = None


def _get_kernel():
    global _kernel
    if _kernel is None:
        _kernel = mx.fast.cuda_kernel(name="artmlx_lora_decode", input_names=["x", "y", "a", "b", "scale"],
                                      output_names=["out"], source=_SOURCE)
    return _kernel


def available() -> bool:
    """Whether this process can use the kernel: MLX's CUDA backend is the default device."""
    return (os.environ.get("ARTMLX_FUSED_LORA", "1") != "0" and mx.default_device() == mx.gpu
            and hasattr(mx, "cuda") and mx.cuda.is_available())


@functools.cache
def _usable() -> bool:
    """`available()`, asked once per process (a decode step asks for every adapted layer)."""
    return available()


def _scale_array(scale: float) -> mx.array:
    if scale not in _scales:
        _scales[scale] = mx.array([scale], dtype=mx.float32)
    return _scales[scale]


def lora_product(x: mx.array, y: mx.array, a: mx.array, b: mx.array, scale: float) -> mx.array:
    """`y + scale * (x @ a) @ b` in one CUDA kernel; x (..., K), y (..., N), a (K, r), b (r, N)."""
    K, N, rank = x.shape[-1], y.shape[-1], a.shape[-1]
    rows = x.size // K
    out = _get_kernel()(
        inputs=[x.reshape(rows, K), y.reshape(rows, N), a, b, _scale_array(scale)],
        template=[("TX", x.dtype), ("TA", a.dtype), ("RANK", rank)],
        grid=(-(-N // THREADS) * THREADS, rows, 1), threadgroup=(THREADS, 1, 1),
        output_shapes=[(rows, N)], output_dtypes=[x.dtype])[0]
    return out.reshape(y.shape)


@contextlib.contextmanager
def inference():
    """While inside, `FusedLoRALinear` layers built on this thread may use the kernel (no gradient is taken)."""
    previous = getattr(_local, "on", False)
    _local.on = True
    try:
        yield
    finally:
        _local.on = previous


class FusedLoRALinear(LoRALinear):
    """mlx-lm's `LoRALinear` (same parameters, same adapter files) whose decode-time product is one kernel."""

    # Set per instance by `lora_groups.LoRAGroup`. Declared here so that an ungrouped layer's lookup is a class
    # attribute: a missing one goes through `nn.Module.__getattr__` and an AttributeError (~4 us, on every
    # adapted layer of every decode step).
    lora_group = None
    lora_group_index = -1

    def __call__(self, x: mx.array) -> mx.array:
        if getattr(_local, "on", False) and not self.training:
            group = self.lora_group  # siblings of one input in one product (lora_groups.py)
            out = group.output(self, x) if group is not None else None
            if out is not None:
                return out
            if x.size // x.shape[-1] <= FUSED_ROWS and self.lora_a.shape[-1] <= MAX_RANK:
                y = self.linear(x)
                if y.dtype == x.dtype and _usable():
                    return lora_product(x, y, self.lora_a, self.lora_b, self.scale)
                return y + (self.scale * ((x @ self.lora_a) @ self.lora_b)).astype(x.dtype)
        return super().__call__(x)


def use_fused_lora(model) -> int:
    """Give every plain `LoRALinear` of `model` the fused decode product (no copy); returns how many."""
    changed = 0
    for _, module in model.named_modules():
        if type(module) is LoRALinear:
            module.__class__ = FusedLoRALinear
            changed += 1
    return changed
