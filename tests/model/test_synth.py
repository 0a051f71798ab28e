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
               "qwen3.5-0.8b": 800, "qwen3.5-9b": 9000,  # model cards: 0.8B, 9B, vision encoders included
               "gemma-3-1b": 1000, "gemma-3-4b": 4300,  # model cards (4b: vision encoder included)
               "gpt-oss-20b": 20900}  # model card: 20.9B
TOLERANCE = {"qwen3.5-0.8b": 0.1, "qwen3.5-9b": 0.1, "gemma-3-4b": 0.12}  # the text towers alone (not synthesised)


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


SMALL = {"hidden_size": 128, "num_hidden_layers": 2, "intermediate_size": 256, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 32}
GEMMA_WINDOW = {"sliding_window": 8, "sliding_window_pattern": 2, "query_pre_attn_scalar": 32}  # mlx-lm needs a
# global layer among the first `sliding_window_pattern`


@pytest.mark.parametrize("arch, overrides, vocab, eos, turn_open, turn_close", [
    # Gemma 3: specials first (<bos> 2, <start_of_turn> 105, <end_of_turn> 106), the 4b a multimodal wrapper
    ("gemma-3-1b", {**SMALL, **GEMMA_WINDOW}, 262144, {106, 1}, 105, 106),
    ("gemma-3-4b", {"text_config": {"model_type": "gemma3_text", **SMALL, **GEMMA_WINDOW, "vocab_size": 262208,
                                    "tie_word_embeddings": True}}, 262208, {106, 1}, 105, 106),
    # GPT-OSS: harmony's <|start|> 200006, <|end|> 200007, <|return|> 200002; experts and sinks
    ("gpt-oss-20b", {**SMALL, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 8,
                     "layer_types": ["sliding_attention", "full_attention"]}, 201088, {200002, 199999, 200012},
     200006, 200007),
])
def test_family_tokenizers_keep_their_real_ids_and_roll_out(tmp_path, arch, overrides, vocab, eos, turn_open,
                                                            turn_close):
    """Each family's synthetic folder at its real vocabulary: mlx-lm loads it, the chat template's markers
    are the published ids, a second turn continues the first token by token, and the engine's samples are
    the learner's recompute."""
    import mlx_lm

    from artmlx.envs.synthetic import Synthetic
    from artmlx.model.families import vocab_size
    from artmlx.model.policy import LoraSpec, load_policy
    from artmlx.rollout.episodes import EpisodeRollouts, SamplingParams
    from tests.helpers import learner_logprobs

    folder = synthesize(arch, tmp_path / arch, shape_overrides=overrides)
    base, tokenizer = mlx_lm.load(str(folder))
    assert vocab_size(base) == vocab and set(tokenizer.eos_token_ids) == eos
    chat = ChatFormat(tokenizer)
    words = tokenizer.encode(" abc def", add_special_tokens=False)
    assert len(words) == 2
    prompt = chat.prompt_ids([{"role": "system", "content": " be brief"}, {"role": "user", "content": " abc def"}])
    assert prompt.count(turn_open) >= 2 and turn_close in prompt and any(
        prompt[i:i + 2] == words for i in range(len(prompt)))
    reply = tokenizer.encode(" xyz", add_special_tokens=False) + [tokenizer.eos_token_id]  # <end_of_turn>, <|return|>
    follow = chat.continuation_ids([{"role": "user", "content": " ghi"}], reply[-1])
    whole = chat.prompt_ids([{"role": "system", "content": " be brief"}, {"role": "user", "content": " abc def"},
                             {"role": "assistant", "content": " xyz"}, {"role": "user", "content": " ghi"}])
    if arch.startswith("gemma"):  # <end_of_turn> closes the reply: the transcript is the template's own
        assert prompt + reply + follow == whole
    else:  # harmony renders a past reply as ...<|end|>, the model stops on <|return|>: the same but that token
        assert (prompt + reply + follow)[:len(prompt) + 1] == whole[:len(prompt) + 1]
    model, tokenizer, _ = load_policy(str(folder), LoraSpec(rank=4, scale=20.0))
    rollouts = EpisodeRollouts(model, tokenizer, lambda: Synthetic(prompt_tokens=8, turns=2, user_tokens=4),
                               SamplingParams(temperature=1.0, max_reply_tokens=6))
    groups = rollouts.play([1], 2, mx.random.key(0))
    recomputed, behaviour = learner_logprobs(model, groups, 1.0)
    assert len(recomputed) >= 12 and np.abs(recomputed - behaviour).max() < 1e-3


def test_cli_refuses_an_unknown_architecture(tmp_path):
    result = subprocess.run([sys.executable, "-m", "artmlx", "model", "synth", "gpt-5", "--out", str(tmp_path / "x")],
                            capture_output=True, text=True)
    assert result.returncode != 0 and "unknown architecture 'gpt-5'" in result.stderr
    assert "qwen2.5-0.5b" in result.stderr
