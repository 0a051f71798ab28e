"""GGUF tensors as MLX weights: kept exactly where MLX has the format, requantized where it has not.

llama.cpp stores a quantized matrix as rows of blocks of 32 weights. Three block types are MLX's own
affine format (w = scale * q + bias, unsigned codes, one scale and bias per group of 32) in other
words, so they are rewritten into MLX's packing without changing a single value:

    Q4_0   {f16 d; 16 bytes of 4-bit q}            w = (q - 8) d    -> 4 bits, scale d, bias -8 d
    Q4_1   {f16 d; f16 m; 16 bytes of 4-bit q}     w = q d + m      -> 4 bits, scale d, bias m
    Q8_0   {f16 d; 32 signed bytes q}              w = q d          -> 8 bits, code q + 128, scale d, bias -128 d

(ggml puts weight j of a Q4 block in the low nibble of byte j and weight j + 16 in its high nibble;
MLX puts weight i of a group in bits 4 (i mod 8) of word i / 8.) Every other type (the K-quants,
Q5_0/Q5_1, the IQ types, F16, BF16, F32 matrices) is dequantized with the `gguf` package's NumPy
reference and quantized again with `mx.quantize` (4 bits, group size 64 unless told otherwise; 0 bits
keeps them as float16).
Vectors (norms, biases) stay floating point.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

EXACT_TYPES = ("Q4_0", "Q4_1", "Q8_0")
FLOAT_TYPES = ("F32", "F16", "BF16", "F64")
_MLX_FLOATS = {"F32": mx.float32, "F16": mx.float16, "BF16": mx.bfloat16, "F64": mx.float32}


@dataclass(frozen=True)
class Requantize:
    """How matrices that MLX cannot keep as they are get quantized again."""

    bits: int = 4  # 0: keep them floating point (float16)
    group_size: int = 64

    def __post_init__(self):
        if self.bits not in (0, 2, 3, 4, 5, 6, 8):
            raise ValueError(f"requantization bits must be 2, 3, 4, 5, 6 or 8 (0 keeps float16), got {self.bits}")
        if self.group_size not in (32, 64, 128):
            raise ValueError(f"requantization group size must be 32, 64 or 128, got {self.group_size}")


@dataclass
class Converted:
    """One weight in MLX form: `weight` (packed codes when quantized), and `scales`/`biases` with
    the `bits`/`group_size` they were made with; `how` says what happened to it."""

    weight: mx.array
    scales: mx.array | None = None
    biases: mx.array | None = None
    bits: int = 0
    group_size: int = 0
    how: str = "float"  # "exact", "requantized" or "float"

    @property
    def quantized(self) -> bool:
        return self.scales is not None


def _blocks(raw: np.ndarray, rows: int, block_bytes: int) -> np.ndarray:
    """The raw bytes of a tensor as (rows, blocks, block_bytes)."""
    return np.ascontiguousarray(raw).reshape(rows, -1, block_bytes)


def _half(blocks: np.ndarray, start: int) -> np.ndarray:
    return blocks[..., start : start + 2].copy().view(np.float16)[..., 0]


def _pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """(rows, n) codes in 0..15 -> (rows, n / 8) uint32, MLX's 4-bit packing."""
    pairs = codes.reshape(codes.shape[0], -1, 2).astype(np.uint8)
    packed_bytes = pairs[..., 0] | (pairs[..., 1] << 4)
    return np.ascontiguousarray(packed_bytes).view("<u4")


def _q4_codes(blocks: np.ndarray, start: int) -> np.ndarray:
    """ggml's 16 bytes of nibbles -> (rows, blocks, 32) codes in weight order."""
    qs = blocks[..., start : start + 16]
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def exact(type_name: str, raw: np.ndarray, rows: int) -> Converted:
    """Q4_0 / Q4_1 / Q8_0 blocks as MLX affine weights with the same values."""
    if type_name == "Q4_0":
        blocks = _blocks(raw, rows, 18)
        d = _half(blocks, 0)
        codes, scales, biases, bits = _q4_codes(blocks, 2), d, d * np.float16(-8), 4
    elif type_name == "Q4_1":
        blocks = _blocks(raw, rows, 20)
        codes, scales, biases, bits = _q4_codes(blocks, 4), _half(blocks, 0), _half(blocks, 2), 4
    elif type_name == "Q8_0":
        blocks = _blocks(raw, rows, 34)
        d = _half(blocks, 0)
        signed = blocks[..., 2:34].copy().view(np.int8)
        codes, scales, biases, bits = (signed.astype(np.int16) + 128).astype(np.uint8), d, d * np.float16(-128), 8
    else:
        raise ValueError(f"{type_name} has no exact MLX form (only {', '.join(EXACT_TYPES)})")
    codes = codes.reshape(rows, -1)
    packed = _pack_nibbles(codes) if bits == 4 else np.ascontiguousarray(codes).view("<u4")
    return Converted(mx.array(packed), mx.array(scales), mx.array(biases), bits, 32, "exact")


def dequantized(type_name: str, raw: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Any GGUF tensor as float32 of `shape` (NumPy, through the `gguf` package's reference)."""
    from gguf import GGMLQuantizationType, quants

    if type_name == "F32":
        return np.asarray(raw, dtype=np.float32).reshape(shape)
    if type_name in ("F16", "F64"):
        return np.asarray(raw).astype(np.float32).reshape(shape)
    try:
        qtype = GGMLQuantizationType[type_name]
        values = quants.dequantize(np.asarray(raw), qtype)
    except (KeyError, NotImplementedError, quants.QuantError) as error:
        raise ValueError(f"tensor type {type_name} cannot be read (the gguf package has no dequantizer for it: "
                         f"{error})") from error
    return np.asarray(values, dtype=np.float32).reshape(shape)


def requantized(values: np.ndarray, how: Requantize) -> Converted:
    """A float32 matrix quantized by MLX (group size halved, down to 32, where a row does not divide)."""
    if not how.bits:
        return Converted(mx.array(values.astype(np.float16)))
    group = how.group_size
    while values.shape[-1] % group and group > 32:
        group //= 2
    if values.shape[-1] % group:
        return Converted(mx.array(values.astype(np.float16)))  # a row that no group size divides stays float
    weight, scales, biases = mx.quantize(mx.array(values), group_size=group, bits=how.bits)
    return Converted(weight, scales.astype(mx.float16), biases.astype(mx.float16), how.bits, group, "requantized")


def permute_rows(converted: Converted, order: np.ndarray) -> Converted:
    """The same weight with its output rows reordered (exact for packed codes: groups run along a row)."""
    index = mx.array(order)

    def pick(array):
        return None if array is None else array[index]

    return Converted(pick(converted.weight), pick(converted.scales), pick(converted.biases), converted.bits,
                     converted.group_size, converted.how)


def convert_matrix(type_name: str, raw: np.ndarray, shape: tuple[int, ...], how: Requantize) -> Converted:
    """A 2-D weight (rows = output features) in the MLX form that keeps the most of it."""
    if type_name in EXACT_TYPES:
        return exact(type_name, raw, shape[0])
    if not how.bits and type_name in _MLX_FLOATS:  # kept floating point, in the file's own precision
        return Converted(mx.array(dequantized(type_name, raw, shape)).astype(_MLX_FLOATS[type_name]))
    return requantized(dequantized(type_name, raw, shape), how)


def convert_vector(type_name: str, raw: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A norm weight or bias as float32."""
    return dequantized(type_name, raw, shape)
