"""Encoding messages as ZeroMQ multipart frames, and strict decoding of untrusted ones.

Frame 0 is a msgpack envelope `{"type", "version", "id", "body"}`. Each array in the body is a
reference `{"nd": i, "dtype": name, "shape": [...]}` to frame i (1-based) holding its raw bytes, so
large buffers are never copied into the packed body and decode zero-copy with `np.frombuffer`.
bfloat16 travels as its raw 2-byte words and comes back through `to_mlx`.

Decoding trusts nothing: the header size, every msgpack container and string are bounded
(`Limits`), map keys must be strings, the type and version must be known, every field must match
the message's schema (types, ranges, string lengths, dtype allowlist, dimensions, exact byte
length, finite floats), every frame must be referenced exactly once, and message-level checks
(e.g. token/mask/logprob lengths agree) must pass. Anything else raises `ProtocolError`. No pickle.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, fields
from typing import Any

import msgpack
import numpy as np

from .errors import ProtocolError, VersionMismatch
from .messages import MESSAGE_TYPES, PROTOCOL_VERSION

WIRE_DTYPES = {"bool": np.bool_, "uint8": np.uint8, "uint16": np.uint16, "int32": np.int32, "int64": np.int64,
               "float16": np.float16, "float32": np.float32, "bfloat16": np.uint16}
FLOAT_DTYPES = ("float16", "float32")


@dataclass(frozen=True)
class Limits:
    max_header_bytes: int = 1 << 20
    max_frames: int = 1024
    max_string: int = 1 << 16
    max_container: int = 1 << 16
    max_elements: int = 1 << 26
    max_dict_depth: int = 4


DEFAULT_LIMITS = Limits()


def _array_ref(value, frames: list) -> dict:
    dtype = _dtype_name(value)
    if dtype == "bfloat16":
        import mlx.core as mx

        value = value.view(mx.uint16)
    data = np.ascontiguousarray(np.asarray(value))
    frames.append(memoryview(data.reshape(-1).view(np.uint8)))
    return {"nd": len(frames), "dtype": dtype, "shape": list(data.shape)}


def _dtype_name(value) -> str:
    name = str(value.dtype).removeprefix("mlx.core.").removesuffix("_")
    if name not in WIRE_DTYPES:
        raise ProtocolError(f"dtype {name} cannot travel; use one of {sorted(WIRE_DTYPES)}")
    return name


def _is_array(value) -> bool:
    return isinstance(value, np.ndarray) or type(value).__module__.startswith("mlx")


def encode(message) -> list:
    """Message -> list of frames (bytes-like) for `socket.send_multipart`."""
    frames: list = []
    body: dict[str, Any] = {}
    for spec in fields(message):
        value = getattr(message, spec.name)
        if _is_array(value):
            value = _array_ref(value, frames)
        elif isinstance(value, dict) and message.SCHEMA.get(spec.name, ("",))[0] == "tensors":
            value = {name: _array_ref(array, frames) for name, array in value.items()}
        body[spec.name] = value
    envelope = {"type": message.TYPE, "version": PROTOCOL_VERSION, "id": uuid.uuid4().hex, "body": body}
    return [msgpack.packb(envelope, use_bin_type=True), *frames]


def decode(frames: list, limits: Limits = DEFAULT_LIMITS):
    """Frames -> message, or ProtocolError saying what is wrong."""
    if not frames:
        raise ProtocolError("empty message")
    if len(frames) > limits.max_frames:
        raise ProtocolError(f"{len(frames)} frames, more than {limits.max_frames}")
    head = bytes(frames[0])
    if len(head) > limits.max_header_bytes:
        raise ProtocolError(f"header of {len(head)} bytes, more than {limits.max_header_bytes}")
    try:
        envelope = msgpack.unpackb(
            head, raw=False, strict_map_key=True, use_list=True,
            max_str_len=limits.max_string, max_bin_len=limits.max_string,
            max_array_len=limits.max_container, max_map_len=limits.max_container, max_ext_len=0,
        )
    except Exception as error:  # msgpack raises many types for garbage
        raise ProtocolError(f"header is not valid msgpack: {type(error).__name__}: {error}") from None
    if not isinstance(envelope, dict) or set(envelope) != {"type", "version", "id", "body"}:
        raise ProtocolError("header must be a map with exactly type, version, id and body")
    version, kind, body = envelope["version"], envelope["type"], envelope["body"]
    if not isinstance(version, int) or isinstance(version, bool):
        raise ProtocolError("version must be an integer")
    if version != PROTOCOL_VERSION:
        raise VersionMismatch(f"protocol version {version}, this side speaks {PROTOCOL_VERSION}")
    if kind not in MESSAGE_TYPES:
        raise ProtocolError(f"unknown message type {str(kind)[:40]!r}")
    if not isinstance(envelope["id"], str) or len(envelope["id"]) > 64:
        raise ProtocolError("id must be a string of at most 64 characters")
    cls = MESSAGE_TYPES[kind]
    if not isinstance(body, dict):
        raise ProtocolError(f"{kind}: body must be a map")
    if set(body) != set(cls.SCHEMA):
        missing, extra = sorted(set(cls.SCHEMA) - set(body)), sorted(set(body) - set(cls.SCHEMA))
        raise ProtocolError(f"{kind}: body fields wrong (missing {missing}, unexpected {extra[:5]})")
    used: set[int] = set()
    values = {name: _check_field(kind, name, spec, body[name], frames, used, limits)
              for name, spec in cls.SCHEMA.items()}
    if len(used) != len(frames) - 1:
        raise ProtocolError(f"{kind}: {len(frames) - 1 - len(used)} frames not referenced by any field")
    message = cls(**values)
    if hasattr(message, "check"):
        try:
            message.check()
        except ValueError as error:
            raise ProtocolError(f"{kind}: {error}") from None
    return message


def _check_field(kind, name, spec, value, frames, used, limits):
    where = f"{kind}.{name}"
    rule = spec[0]
    if rule == "str":
        if not isinstance(value, str) or len(value) > spec[1]:
            raise ProtocolError(f"{where} must be a string of at most {spec[1]} characters")
        return value
    if rule == "int":
        if not isinstance(value, int) or isinstance(value, bool) or not spec[1] <= value <= spec[2]:
            raise ProtocolError(f"{where} must be an integer in [{spec[1]}, {spec[2]}]")
        return value
    if rule == "choice":
        if value not in spec[1]:
            raise ProtocolError(f"{where} must be one of {spec[1]}")
        return value
    if rule == "str_list":
        if not isinstance(value, list) or not all(isinstance(v, str) and len(v) <= spec[1] for v in value):
            raise ProtocolError(f"{where} must be a list of strings of at most {spec[1]} characters")
        return value
    if rule == "dict":
        _check_plain(where, value, limits.max_dict_depth)
        return value
    if rule == "array":
        return _resolve_array(where, value, frames, used, limits, spec[1], spec[2])
    if rule == "tensors":
        if not isinstance(value, dict):
            raise ProtocolError(f"{where} must map names to arrays")
        return {k: _resolve_array(f"{where}[{k[:40]}]", v, frames, used, limits, None, None) for k, v in value.items()}
    raise AssertionError(f"unknown schema rule {rule}")


def _check_plain(where, value, depth):
    """JSON-like data only: str keys, finite numbers, bounded nesting."""
    if depth < 0:
        raise ProtocolError(f"{where} nests too deeply")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ProtocolError(f"{where} has a non-string key")
            _check_plain(f"{where}.{key[:40]}", item, depth - 1)
    elif isinstance(value, list):
        for item in value:
            _check_plain(where, item, depth - 1)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ProtocolError(f"{where} holds a non-finite number")
    elif not (value is None or isinstance(value, (str, int, bool))):
        raise ProtocolError(f"{where} holds a {type(value).__name__}, which is not allowed")


def _resolve_array(where, ref, frames, used, limits, dtypes, ndim):
    if not isinstance(ref, dict) or set(ref) != {"nd", "dtype", "shape"}:
        raise ProtocolError(f"{where} must be an array reference {{nd, dtype, shape}}")
    index, dtype, shape = ref["nd"], ref["dtype"], ref["shape"]
    if not isinstance(index, int) or isinstance(index, bool) or not 1 <= index < len(frames) or index in used:
        raise ProtocolError(f"{where} refers to a missing or already used frame")
    if dtype not in WIRE_DTYPES or (dtypes is not None and dtype not in dtypes):
        raise ProtocolError(f"{where} has dtype {str(dtype)[:20]!r}; allowed: {list(dtypes or WIRE_DTYPES)}")
    if (not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
            or (ndim is not None and len(shape) != ndim) or len(shape) > 8):
        raise ProtocolError(f"{where} has an invalid shape")
    count = math.prod(shape)
    if count > limits.max_elements:
        raise ProtocolError(f"{where} has {count} elements, more than {limits.max_elements}")
    frame = frames[index]
    buffer = frame.buffer if hasattr(frame, "buffer") else frame
    np_dtype = np.dtype(WIRE_DTYPES[dtype])
    size = memoryview(buffer).nbytes
    if size != count * np_dtype.itemsize:
        raise ProtocolError(f"{where}: frame holds {size} bytes, shape needs {count * np_dtype.itemsize}")
    used.add(index)
    array = np.frombuffer(buffer, dtype=np_dtype).reshape(shape)
    if dtype == "bool" and count and np.frombuffer(buffer, dtype=np.uint8).max() > 1:
        raise ProtocolError(f"{where}: booleans must be 0 or 1")
    if dtype in FLOAT_DTYPES and not np.isfinite(array).all():
        raise ProtocolError(f"{where} holds non-finite values")
    if dtype == "bfloat16":
        exponent = (array >> 7) & 0xFF
        if (exponent == 0xFF).any():
            raise ProtocolError(f"{where} holds non-finite values")
        return _BFloat16(array)
    return array


class _BFloat16(np.ndarray):
    """A uint16 view that remembers it holds bfloat16 words (see `to_mlx`)."""

    def __new__(cls, words: np.ndarray):
        return words.view(cls)


def to_mlx(array):
    """Decoded wire array -> MLX array (bfloat16 restored)."""
    import mlx.core as mx

    if isinstance(array, _BFloat16):
        return mx.array(np.asarray(array).view(np.uint16)).view(mx.bfloat16)
    return mx.array(array)
