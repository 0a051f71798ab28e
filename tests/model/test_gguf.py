"""GGUF import: exact block conversion, the architectures' round trip, the cache, and bad files refused by name."""

import json
import os

import mlx.core as mx
import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from artmlx.model import gguf_tensors  # noqa: E402
from artmlx.model.gguf_import import GgufFile, import_gguf  # noqa: E402
from tests.gguf_files import write_gguf  # noqa: E402
from tests.helpers import family_folder  # noqa: E402


@pytest.mark.parametrize("type_name", gguf_tensors.EXACT_TYPES)
def test_q4_0_q4_1_and_q8_0_become_mlx_weights_of_exactly_the_same_values(type_name):
    values = np.random.default_rng(0).normal(size=(48, 256)).astype(np.float32) * 0.05
    raw = gguf.quants.quantize(values, gguf.GGMLQuantizationType[type_name])
    converted = gguf_tensors.exact(type_name, raw, 48)
    mine = mx.dequantize(converted.weight, converted.scales.astype(mx.float32), converted.biases.astype(mx.float32),
                         group_size=32, bits=converted.bits)
    reference = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name])
    assert converted.how == "exact" and converted.group_size == 32
    assert np.array_equal(np.array(mine), reference)  # bit for bit, in float32


def test_other_types_are_requantized_to_4_bits_in_groups_of_64():
    values = np.random.default_rng(1).normal(size=(8, 256)).astype(np.float32)
    raw = gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q5_0)
    converted = gguf_tensors.convert_matrix("Q5_0", raw, (8, 256), gguf_tensors.Requantize())
    assert (converted.how, converted.bits, converted.group_size) == ("requantized", 4, 64)
    back = np.array(mx.dequantize(converted.weight, converted.scales.astype(mx.float32),
                                  converted.biases.astype(mx.float32), group_size=64, bits=4))
    reference = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q5_0)
    step = np.ptp(reference.reshape(8, 4, 64), axis=-1, keepdims=True) / 15  # one 4-bit step of each group
    assert (np.abs(back - reference).reshape(8, 4, 64) <= step * 1.01).all()


def test_a_row_no_group_size_divides_stays_floating_point():
    converted = gguf_tensors.requantized(np.ones((4, 48), np.float32), gguf_tensors.Requantize())
    assert not converted.quantized and converted.weight.shape == (4, 48)


def _logits(folder, tokens):
    import mlx_lm

    model, _ = mlx_lm.load(str(folder))
    model.set_dtype(mx.float32)  # both in float32: the comparison is of the weights, not of bfloat16 rounding
    return np.array(model(mx.array([tokens])).astype(mx.float32))[0]


CASES = {
    # architecture: (mlx-lm family of the original folder, its overrides)
    "llama": ("qwen3", {"model_type": "llama"}),
    "qwen2": ("qwen3", {"model_type": "qwen2"}),
    "qwen3": ("qwen3", {}),
    "gemma3": ("gemma3_text", {"num_hidden_layers": 6, "sliding_window_pattern": 6, "sliding_window": 4,
                               "rope_theta": 1e6}),
}


@pytest.mark.parametrize("arch", sorted(CASES))
def test_a_gguf_written_as_llama_cpp_does_imports_to_the_model_it_came_from(arch, tmp_path):
    """llama's permuted Q/K rows, Gemma's 1 + w norms, qwen2's biases: undone, so the imported folder computes
    what the original did (Q8_0 matrices: the difference is 8-bit rounding alone)."""
    family, overrides = CASES[arch]
    original = family_folder(tmp_path, family, "original", **overrides)
    tokens = [3, 17, 42, 9, 100, 5, 77, 8, 21, 64, 1, 2]
    want = _logits(original, tokens)
    # F32 matrices kept float (bits 0): the same weights, so the same logits up to float16 storage
    path = write_gguf(original, tmp_path / f"{arch}.gguf", arch, matrix_type="F32")
    folder = import_gguf(path, out=tmp_path / "float", how=gguf_tensors.Requantize(bits=0))
    got = _logits(folder, tokens)
    assert np.abs(got - want).max() < 2e-3 * np.abs(want).max()
    assert (got.argmax(-1) == want.argmax(-1)).all()
    # Q8_0 matrices: kept exactly as 8-bit MLX weights; the difference to the original is 8-bit rounding
    lines = []
    path = write_gguf(original, tmp_path / f"{arch}-q8.gguf", arch, matrix_type="Q8_0")
    folder = import_gguf(path, out=tmp_path / "q8", report=lines.append)
    assert np.abs(_logits(folder, tokens) - want).max() < 0.05 * np.abs(want).max()
    config = json.loads((folder / "config.json").read_text())
    assert config["quantization"] == {"group_size": 32, "bits": 8, "mode": "affine"}
    assert any("exact" in line for line in lines)


def test_the_tokenizer_and_chat_template_come_from_the_file(tmp_path):
    import mlx_lm

    original = family_folder(tmp_path, "qwen3", "original")
    folder = import_gguf(write_gguf(original, tmp_path / "q.gguf", "qwen3"), out=tmp_path / "imported")
    _, want = mlx_lm.load(str(original))
    _, got = mlx_lm.load(str(folder))
    messages = [{"role": "user", "content": "What is 12 + 7?"}, {"role": "assistant", "content": "19"}]
    assert got.apply_chat_template(messages, tokenize=False) == want.apply_chat_template(messages, tokenize=False)
    text = "<|im_start|>user\n12 + 7 = 19?<|im_end|>"
    assert got.encode(text, add_special_tokens=False) == want.encode(text, add_special_tokens=False)
    assert set(got.eos_token_ids) == set(want.eos_token_ids)


def test_the_import_is_cached_and_reused_until_the_file_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("ARTMLX_CACHE", str(tmp_path / "cache"))
    path = write_gguf(family_folder(tmp_path, "qwen3", "original"), tmp_path / "q.gguf", "qwen3")
    first = import_gguf(path)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert import_gguf(path) == first and (first / "model.safetensors").stat().st_mtime_ns == stamp
    os.utime(path, ns=(stamp + 10**9, stamp + 10**9))  # the file changed: a new folder
    assert import_gguf(path) != first
    assert (first / "config.json").exists() and oct(first.stat().st_mode)[-3:] == "755"


def test_model_names_ending_in_gguf_resolve_to_the_imported_folder(tmp_path, monkeypatch):
    from artmlx.model.tiny import resolve_model

    monkeypatch.setenv("ARTMLX_CACHE", str(tmp_path / "cache"))
    path = write_gguf(family_folder(tmp_path, "qwen3", "original"), tmp_path / "q.gguf", "qwen3")
    resolved = resolve_model(str(path))
    assert (tmp_path / "cache") in __import__("pathlib").Path(resolved).parents
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model(str(tmp_path / "missing.gguf"))


@pytest.mark.parametrize("damage, message", [
    ("not_gguf", "does not start with the bytes 'GGUF'"),
    ("truncated", "truncated or corrupt"),
    ("arch", "architecture 'mamba' is not supported"),
    ("pre", "tokenizer.ggml.pre = 'mystery' is not a text split"),
    ("tensor", "tensor 'blk.0.mystery.weight' has no place"),
    ("no_template", "has no chat template"),
])
def test_bad_files_are_refused_by_name_and_leave_nothing_behind(tmp_path, damage, message):
    original = family_folder(tmp_path, "qwen3", "original")
    path = tmp_path / "bad.gguf"
    if damage == "not_gguf":
        path.write_bytes(b"PK\x03\x04 a zip, not a model")
    elif damage == "truncated":
        whole = write_gguf(original, tmp_path / "whole.gguf", "qwen3").read_bytes()
        path.write_bytes(whole[: len(whole) // 2])
    elif damage == "arch":
        write_gguf(original, tmp_path / "q.gguf", "qwen3")
        _rewrite_arch(tmp_path / "q.gguf", path, "mamba")
    elif damage == "pre":
        write_gguf(original, path, "qwen3", pre="mystery")
    elif damage == "tensor":
        _with_extra_tensor(original, tmp_path, path)
    elif damage == "no_template":
        write_gguf(original, path, "qwen3", chat_template="")
        _rename_tokens(path)
    out = tmp_path / "out"
    with pytest.raises((ValueError, FileNotFoundError), match=message.replace("(", r"\(")):
        import_gguf(path, out=out)
    assert not out.exists() and not list(tmp_path.glob(".out-*"))


def _rewrite_arch(source, target, arch):
    target.write_bytes(source.read_bytes().replace(b"qwen3", arch.encode()))  # same length: offsets hold


def _with_extra_tensor(original, tmp_path, path):
    import gguf as gguf_package

    write_gguf(original, tmp_path / "q.gguf", "qwen3")
    reader = GgufFile(tmp_path / "q.gguf").reader
    writer = gguf_package.GGUFWriter(str(path), "qwen3")
    for field in reader.fields.values():
        if field.name.startswith(("GGUF.", "general.architecture")):
            continue
        value = field.contents()
        kind = field.types[0]
        if kind == gguf_package.GGUFValueType.ARRAY:
            writer.add_array(field.name, value)
        else:
            writer.add_key_value(field.name, value, kind)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=tensor.tensor_type)
    writer.add_tensor("blk.0.mystery.weight", np.zeros(64, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _rename_tokens(path):
    data = path.read_bytes()
    path.write_bytes(data.replace(b"<|im_start|>", b"<|im_begin|>"))
