"""Round trips for every message type, and strict rejection of malformed ones."""

import math

import mlx.core as mx
import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from artmlx.protocol.codec import decode, encode, to_mlx
from artmlx.protocol.errors import ProtocolError, VersionMismatch
from artmlx.protocol.messages import (MESSAGE_TYPES, PROTOCOL_VERSION, Ack, AdapterUpdate, Heartbeat, Hello, Refuse,
                                      Shutdown, TrajectoryGroup, Welcome)
from tests.protocol.helpers import make_group

names = st.text(max_size=40)
small_ints = st.integers(min_value=0, max_value=2**40)
scalars = st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False, allow_infinity=False) | names
nested = st.lists(scalars, max_size=4) | st.dictionaries(names, scalars, max_size=4)
plain = scalars | nested | st.dictionaries(names, nested, max_size=3)  # within the decoder's depth limit


@st.composite
def groups(draw):
    lengths = draw(st.lists(st.integers(2, 12), min_size=1, max_size=6))
    n = sum(lengths)
    mask = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), bool)
    logprobs = np.where(mask, -np.array(draw(st.lists(st.floats(0, 20), min_size=n, max_size=n))), 0).astype(np.float32)
    g = len(lengths)
    floats = st.lists(st.floats(-10, 10, width=32), min_size=g, max_size=g)
    return TrajectoryGroup(
        group_id=draw(st.text(max_size=64)), actor=draw(names), env=draw(names), fingerprint=draw(st.text(max_size=64)),
        seed=draw(small_ints), policy_version=draw(small_ints),
        tokens=np.array(draw(st.lists(st.integers(0, 2**31 - 1), min_size=n, max_size=n)), np.int32),
        policy_mask=mask, logprobs=logprobs, lengths=np.array(lengths, np.int32),
        rewards=np.array(draw(floats), np.float32), scores=np.array(draw(floats), np.float32),
        turns=np.array(draw(st.lists(st.integers(0, 50), min_size=g, max_size=g)), np.int32),
        truncated=np.array(draw(st.lists(st.booleans(), min_size=g, max_size=g)), bool),
        outcomes=draw(st.lists(st.text(max_size=32), min_size=g, max_size=g)),
    )


def same(a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b)) and np.asarray(a).dtype == np.asarray(b).dtype
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


@settings(max_examples=60, deadline=None)
@given(st.one_of(
    st.builds(Hello, names, names, st.text(max_size=32), st.integers(0, 2**16), st.text(max_size=64)),
    st.builds(Welcome, st.text(max_size=64), st.dictionaries(names, plain, max_size=6), st.text(max_size=64),
              small_ints, st.integers(1, 2**16), st.integers(0, 2**30)),
    st.builds(Refuse, st.text(max_size=200)),
    st.builds(Ack, st.text(max_size=64), st.sampled_from(["trained", "stale", "duplicate", "rejected"]),
              st.text(max_size=100)),
    st.builds(Heartbeat, names, st.text(max_size=64), small_ints, st.dictionaries(names, plain, max_size=5)),
    st.builds(Shutdown, st.text(max_size=100)),
    groups(),
))
def test_round_trip(message):
    decoded = decode(encode(message))
    assert type(decoded) is type(message)
    for name in message.SCHEMA:
        assert same(getattr(decoded, name), getattr(message, name)), name


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16, mx.int32, mx.uint8, mx.bool_])
def test_adapter_tensors_round_trip_every_dtype(dtype):
    values = mx.random.normal((3, 5)) * 4
    array = values > 0 if dtype == mx.bool_ else values.astype(dtype)
    decoded = decode(encode(AdapterUpdate(7, {"layer.lora_a": array, "empty": mx.zeros((0, 4), dtype)})))
    back = to_mlx(decoded.tensors["layer.lora_a"])
    assert back.dtype == array.dtype and back.shape == array.shape
    assert mx.array_equal(back, array).item()
    assert to_mlx(decoded.tensors["empty"]).shape == (0, 4)


def test_arrays_decode_zero_copy():
    import zmq

    frames = [zmq.Frame(bytes(f)) for f in encode(make_group())]
    group = decode(frames)
    assert not group.tokens.flags.owndata  # a view on the received frame, not a copy


def tamper(message, edit):
    frames = encode(message)
    envelope = msgpack.unpackb(frames[0], raw=False)
    edit(envelope, frames)
    return [msgpack.packb(envelope, use_bin_type=True), *frames[1:]]


def set_body(field, value):
    def edit(envelope, frames):
        envelope["body"][field] = value
    return edit


@pytest.mark.parametrize("edit, match", [
    (lambda e, f: e.update(version=99), "protocol version 99"),
    (lambda e, f: e.update(type="launch_missiles"), "unknown message type"),
    (lambda e, f: e["body"].pop("seed"), "missing"),
    (lambda e, f: e["body"].update(extra=1), "unexpected"),
    (set_body("seed", -1), "seed"),
    (set_body("seed", "one"), "seed"),
    (set_body("group_id", "x" * 65), "group_id"),
    (set_body("outcomes", [1, 2]), "outcomes"),
    (lambda e, f: e["body"]["tokens"].update(dtype="float64"), "dtype"),
    (lambda e, f: e["body"]["tokens"].update(shape=[999]), "bytes"),
    (lambda e, f: e["body"]["tokens"].update(shape=[3, 4]), "shape"),
    (lambda e, f: e["body"]["tokens"].update(nd=99), "frame"),
    (lambda e, f: e["body"]["logprobs"].update(nd=e["body"]["tokens"]["nd"]), "frame"),
])
def test_malformed_groups_are_rejected_with_a_reason(edit, match):
    frames = tamper(make_group(), edit)
    error = VersionMismatch if "version" in match else ProtocolError
    with pytest.raises(error, match=match):
        decode(frames)


def test_inconsistent_and_non_finite_arrays_are_rejected():
    group = make_group()
    group.logprobs = group.logprobs.copy()
    group.logprobs[-1] = math.nan
    with pytest.raises(ProtocolError, match="non-finite"):
        decode(encode(group))
    group = make_group()
    group.lengths = np.array([5, 5], np.int32)
    with pytest.raises(ProtocolError, match="sum to the token count"):
        decode(encode(group))
    group = make_group()
    group.policy_mask = group.policy_mask[:-1]
    with pytest.raises(ProtocolError, match="one length"):
        decode(encode(group))
    group = make_group()
    group.logprobs = np.full(len(group.tokens), -1.0, np.float32)
    with pytest.raises(ProtocolError, match="did not sample"):
        decode(encode(group))


def test_garbage_and_hostile_headers_are_rejected():
    for frames in ([b""], [b"\xc1"], [b"\x93\x01\x02"], [msgpack.packb({1: 2})], [msgpack.packb("x" * 100)],
                   [msgpack.packb({"type": "hello", "version": PROTOCOL_VERSION, "id": "i",
                                   "body": {b"actor": 1}})], []):
        with pytest.raises(ProtocolError):
            decode(frames)
    huge = msgpack.packb({"type": "refuse", "version": PROTOCOL_VERSION, "id": "i", "body": {"reason": "x" * 70000}})
    with pytest.raises(ProtocolError):
        decode([huge])
    heartbeat = msgpack.packb({"type": "heartbeat", "version": PROTOCOL_VERSION, "id": "i",
                               "body": {"sender": "a", "session": "", "policy_version": 0, "stats": {"x": [[[[[[1]]]]]]}}})
    with pytest.raises(ProtocolError, match="nests"):
        decode([heartbeat])


def test_every_type_is_registered():
    assert set(MESSAGE_TYPES) == {"hello", "welcome", "refuse", "group", "held", "ack", "adapter", "heartbeat",
                                  "shutdown", "status", "status_reply"}
