"""Random-weight benchmark models: real shapes, real vocabularies, loadable by mlx-lm."""

import json
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest

from artmlx.chat import ChatFormat
from artmlx.model.synth import ARCHITECTURES, architecture, model_config, parameter_layout, synthesize

# Published parameter counts (embeddings included, tied heads counted once), in millions.
PUBLISHED_M = {"qwen2.5-0.5b": 494, "qwen2.5-1.5b": 1544, "qwen2.5-3b": 3086, "qwen2.5-7b": 7616,
               "qwen3-0.6b": 600, "qwen3-4b": 4000, "qwen3-8b": 8200, "qwen3-14b": 14800,  # model cards: 0.6B .. 14.8B
               "llama-3.2-1b": 1236, "llama-3.2-3b": 3213,
               "qwen3-30b-a3b": 30500,  # model card: 30.5B
               "qwen3.5-0.8b": 800}  # model card: 0.8B, vision encoder included (not synthesised)
TOLERANCE = {"qwen3.5-0.8b": 0.1}  # the text tower alone


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_layouts_have_the_published_parameter_counts(arch):
    family, shape = architecture(arch)
    layout = parameter_layout(model_config(family, shape, arch))
    params = 0
    for name, (dims, dtype) in layout.items():
        if dtype == "uint32":
            params += int(np.prod(dims)) * 8  # eight 4-bit codes per word (experts: one matrix per expert)
        elif not name.endswith((".scales", ".biases")):
            params += int(np.prod(dims))
    assert abs(params / 1e6 - PUBLISHED_M[arch]) / PUBLISHED_M[arch] < TOLERANCE.get(arch, 0.01)


def test_synthetic_model_loads_with_mlx_lm_and_samples_near_uniformly(small_synth):
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(small_synth))
    assert model.args.vocab_size == 151936 and len(tokenizer._tokenizer) == 151665
    assert set(tokenizer.eos_token_ids) == {151645, 151643}
    config = json.loads((small_synth / "config.json").read_text())
    assert config["quantization"] == {"group_size": 64, "bits": 4, "mode": "affine"}
    assert config["artmlx_synthetic"]["weights"] == "random"
    chat = ChatFormat(tokenizer)
    prompt = chat.prompt_ids([{"role": "user", "content": " abc def ghi"}])
    words = tokenizer.encode(" abc def ghi", add_special_tokens=False)
    assert len(words) == 3  # a space and a three-letter word: one token each
    assert any(prompt[i : i + 3] == words for i in range(len(prompt)))
    logits = model(mx.array([prompt])).astype(mx.float32)[0, -1]
    probabilities = mx.softmax(logits)
    assert mx.isfinite(logits).all() and probabilities.max().item() < 1e-3  # no token dominates: replies run long
    assert tokenizer.decode([151644]) == "<|im_start|>"


def test_llama_family_tokenizer_and_template(tmp_path):
    folder = synthesize("llama-3.2-1b", tmp_path / "llama", shape_overrides={
        "hidden_size": 128, "num_hidden_layers": 1, "intermediate_size": 256, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32})
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(folder))
    assert model.args.vocab_size == 128256
    assert set(tokenizer.eos_token_ids) == {128001, 128008, 128009}
    chat = ChatFormat(tokenizer)
    prompt = chat.prompt_ids([{"role": "user", "content": " hi"}])
    header_end = tokenizer.encode("<|end_header_id|>\n\n", add_special_tokens=False)
    assert prompt[0] == 128000 and header_end[0] == 128007 and prompt[-len(header_end):] == header_end
    # The environment's answer after a reply ends with <|eot_id|> continues the same transcript.
    continuation = chat.continuation_ids([{"role": "user", "content": " yes"}], 128009)
    assert tokenizer.decode(continuation).startswith("<|start_header_id|>user")


def test_cli_refuses_an_unknown_architecture(tmp_path):
    result = subprocess.run([sys.executable, "-m", "artmlx", "model", "synth", "gpt-5", "--out", str(tmp_path / "x")],
                            capture_output=True, text=True)
    assert result.returncode != 0 and "unknown architecture 'gpt-5'" in result.stderr
    assert "qwen2.5-0.5b" in result.stderr
