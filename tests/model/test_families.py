"""Model families as users download them: tiny random-weight 4-bit folders of mlx-lm's own classes."""

import json
import subprocess
import sys
import threading

import mlx.core as mx
import numpy as np
import openai
import pytest
from mlx.utils import tree_flatten

from artmlx.engine.memory import ModelShape
from artmlx.envs import make_env
from artmlx.learner.settings import trainer_settings
from artmlx.learner.trainer import GRPOTrainer
from artmlx.model.families import text_model
from artmlx.model.policy import LoraSpec, load_policy
from artmlx.netutil import free_port
from artmlx.rollout.episodes import EpisodeRollouts, SamplingParams
from artmlx.serve import run_server
from artmlx.serve.model_server import ModelServer, ServeConfig
from tests.helpers import learner_logprobs, per_call_dequantizing


@pytest.mark.parametrize("family", ["qwen3", "mistral3", "gemma3_text", "olmo3", "gpt_oss", "qwen3_5", "qwen3_next",
                                    "lfm2", "lfm2-ff", "gemma4_text", "gemma3", "gemma4", "qwen3_moe"])
def test_family_rolls_out_recomputes_and_trains(folders, family):
    """A flat config, a multimodal wrapper (`text_config`), sliding-window layers (Gemma 3, OLMo 3,
    GPT-OSS with its attention sinks and 4-bit experts; window 8: every episode is longer), hybrids with
    recurrent layers (Qwen3.5 nested, Qwen3-Next with experts: Gated DeltaNet; LFM2: short convolutions):
    the sampler's logprobs are the learner's recompute (the prefix pass ends in a state), and a GRPO
    step moves the adapters."""
    model, tokenizer, count = load_policy(str(folders[family]), LoraSpec(rank=4, scale=20.0))
    assert count > 0
    shape = ModelShape.of(model)
    assert (shape.layers, shape.hidden, shape.vocab) == (4 if family.startswith("gemma4") else 2, 64, 128)
    if family in ("mistral3", "qwen3_5"):
        assert text_model(model) is model.language_model
    rollouts = EpisodeRollouts(model, tokenizer, lambda: make_env("tictactoe"), SamplingParams(temperature=1.0))
    groups = rollouts.play([1, 2], 4, mx.random.key(0))
    assert min(len(e.tokens) for g in groups for e in g.episodes) > 8  # past Gemma's window
    recomputed, behaviour = learner_logprobs(model, groups, 1.0)
    assert len(recomputed) > 10
    assert np.abs(recomputed - behaviour).max() < 1e-3
    for group in groups:  # a random model's games all score alike: give the step advantages to follow
        for index, episode in enumerate(group.episodes):
            episode.reward = float(index % 2)
    before = {k: np.array(v) for k, v in tree_flatten(model.trainable_parameters())}
    GRPOTrainer(model, trainer_settings({"temperature": 1.0})).train_step(groups)
    after = dict(tree_flatten(model.trainable_parameters()))
    changed = {k for k in before if not np.array_equal(before[k], np.array(after[k]))}
    assert changed
    experts = [path for path, m in model.named_modules() if type(m).__name__ == "LoRASwitchLinear"]
    if family in ("gpt_oss", "qwen3_next", "qwen3_moe"):  # 4-bit experts carry mlx-lm's LoRA too, and the step trains it
        assert experts and any(k.startswith(path + ".") for k in changed for path in experts)


@pytest.mark.parametrize("family", ["mistral3", "qwen3_5", "gemma3", "gemma4"])
def test_nested_config_model_serves_a_chat(folders, family):
    """`artmlx serve` on Ministral 3's and Qwen3.5's wrappers: a chat request through the real openai client."""
    server = ModelServer(ServeConfig(model=str(folders[family]), max_tokens=8))
    port, ready = free_port(), threading.Event()
    http = run_server(server, "127.0.0.1", port, "", ready=ready)
    try:
        assert ready.wait(60)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-")
        reply = client.chat.completions.create(model=server.name, messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=8)
        assert reply.usage.completion_tokens >= 1 and reply.choices[0].finish_reason in ("stop", "length")
        with pytest.raises(openai.BadRequestError, match="image"):
            client.chat.completions.create(model=server.name, max_tokens=4, messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}])
    finally:
        http.should_exit = True
        http.thread.join(10)
        server.close()


@pytest.mark.parametrize("family", ["gemma3_text", "olmo3", "gpt_oss", "qwen3_5", "qwen3_next", "lfm2", "gemma4_text"])
def test_ragged_chunks_equal_each_row_alone(folders, family):
    """Rows of different lengths fed in two ragged chunks through the engine's cache (holes between
    them) get mlx-lm's own full-sequence logits at every new position: window masks included, and
    recurrent states (and convolution windows) that padded positions leave unchanged."""
    from artmlx.engine.generate import Engine

    model, _, _ = load_policy(str(folders[family]), LoraSpec(rank=4))
    rng = np.random.default_rng(0)
    first = [rng.integers(3, 100, n).tolist() for n in (11, 4, 7)]
    later = [rng.integers(3, 100, n).tolist() for n in (6, 13, 2)]
    engine = Engine(model)
    cache = engine.new_cache(3)
    engine.prefill(cache, first)
    width = max(map(len, later))
    padded = np.array([c + [0] * (width - len(c)) for c in later], np.int32)
    out = cache.forward(lambda x, c: model(x, cache=c), mx.array(padded), np.array([len(c) for c in later]))
    for row in range(3):
        expected = model(mx.array([first[row] + later[row]]))[0, -len(later[row]):]
        np.testing.assert_allclose(np.array(out[row, : len(later[row])]), np.array(expected), atol=2e-4, rtol=1e-4)
    alone = model(mx.array([later[1]]))[0]  # the history matters: without it the logits are others
    assert float(mx.abs(out[1, : len(later[1])] - alone).max()) > 1e-2


def test_unsupported_recurrent_family_is_refused_at_load_in_every_command(folders):
    """Mamba's layers ignore padding masks (a padded position would change a row's state): refused when
    loaded, naming them, by the library, the server and the command line."""
    folder = str(folders["mamba"])
    with pytest.raises(ValueError, match=r"recurrent state .* \(ArraysCache: layers 0-1\)"):
        load_policy(folder, LoraSpec(rank=4))
    with pytest.raises(ValueError, match="recurrent"):
        ModelServer(ServeConfig(model=folder))
    for command in (["serve", "--model", folder, "--port", str(free_port())],
                    ["train", "--model", folder, "--steps", "1"]):
        done = subprocess.run([sys.executable, "-m", "artmlx", *command], capture_output=True, text=True, timeout=120)
        assert done.returncode != 0
        assert "ArraysCache" in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("family", ["qwen3", "mistral3", "qwen3-wide", "qwen3_5", "qwen3_next", "lfm2", "lfm2-ff",
                                    "gemma4_text",
                                    "gemma3_text", "olmo3", "gpt_oss", "gemma3", "gemma4"])
def test_estimate_before_loading_is_the_loaded_models_shape(folders, family):
    """`train --dry-run` reads config.json and the safetensors headers only; the shape it plans with is
    the one `ModelShape.of` reads from the loaded base (weights, dtype, dense copies included), and its
    KV bytes per token and state bytes per row are what the engine's cache holds after a prefill."""
    from artmlx.engine.cache import LayerKV, LayerState
    from artmlx.engine.estimate import shape_from_folder
    from artmlx.engine.generate import Engine
    from artmlx.model.policy import load_base

    model, _ = load_base(str(folders[family]))
    shape = ModelShape.of(model)
    assert shape_from_folder(folders[family]) == shape
    engine = Engine(model)
    cache = engine.new_cache(1)
    engine.prefill(cache, [[5, 6, 7, 8, 9]])
    kv = [layer for layer in cache.layers if isinstance(layer, LayerKV)]
    assert sum(layer.nbytes // layer.keys.shape[2] for layer in kv) == shape.kv_bytes_per_token
    states = [layer for layer in cache.layers if isinstance(layer, LayerState)]
    assert sum(layer.nbytes for layer in states) == shape.state_bytes_per_row
    if family == "qwen3-wide":  # a dense base on the CPU (dequantized once at load), else copies per product
        assert shape.dense_copy_bytes == 0 or mx.default_device() != mx.cpu
        with per_call_dequantizing():
            per_call = ModelShape.of(load_base(str(folders[family]))[0])
            assert per_call.dense_copy_bytes > 0 and shape_from_folder(folders[family]) == per_call
    if family.startswith("gemma4"):  # its last 2 of 4 layers reuse earlier layers' keys and values; its one
        assert shape.kv_shared_layers == 2  # global layer has heads twice as wide (global_head_dim 32)
        assert shape.kv_bytes_per_token == 2 * 2 * (16 + 32) * shape.activation_bytes
    if family in ("gemma3_text", "olmo3", "gpt_oss", "gemma4_text", "gemma3", "gemma4"):
        assert (shape.window_layers, shape.window) == (1, 8)  # one window layer: its KV stops growing
        assert shape.kv_bytes_per_row(500) == shape.kv_bytes_per_token * 500  # within window + slack (776)
        window_slot = 2 * 2 * 16 * shape.activation_bytes
        assert shape.kv_bytes_per_row(100_000) == shape.kv_bytes_per_token * 100_000 - window_slot * (100_000 - 776)
    if family in ("qwen3_5", "qwen3_next", "lfm2"):  # layer 0 keeps a state, layer 1 keys and values
        assert shape.recurrent_layers == 1 and shape.kv_bytes_per_token == 2 * 2 * 16 * shape.activation_bytes
        assert shape.state_bytes_per_row > 0


def test_dry_run_says_whether_an_episode_fits_and_refuses_unsupported_families(folders):
    def dry_run(*args):
        return subprocess.run([sys.executable, "-m", "artmlx", "train", "--dry-run", *args], capture_output=True,
                              text=True, timeout=120)

    roomy = dry_run("--model", str(folders["mistral3"]), "--set", "memory_budget_gb=2")
    assert roomy.returncode == 0, roomy.stderr
    facts = json.loads(roomy.stdout.strip().splitlines()[-1])
    assert facts["fits"] and facts["rows_per_batch"] >= 1 and facts["episodes_per_micro_batch"] >= 1
    # `--rollout`: the in-process server of the policy holds a second copy of the base, counted in what one needs
    agents = dry_run("--model", str(folders["mistral3"]), "--set", "memory_budget_gb=2",
                     "--rollout", "examples/tictactoe_rollout.py:rollout")
    with_server = json.loads(agents.stdout.strip().splitlines()[-1])
    assert agents.returncode == 0 and "second copy of the base" in agents.stdout
    assert with_server["agent_server_weights_gb"] == facts["weights_gb"]  # (a tiny folder: both round to 0.0)
    assert with_server["needed_gb_for_one_episode"] == round(facts["needed_gb_for_one_episode"] + facts["weights_gb"], 2)
    tight = dry_run("--model", str(folders["mistral3"]), "--set", "memory_budget_gb=0.001",
                    "--set", "max_episode_tokens=4096")
    assert tight.returncode == 1 and "does NOT fit" in tight.stdout
    # a budget between one checkpointed episode and one plain one: "auto" checkpoints and fits, "off" does not
    deep = dry_run("--model", str(folders["qwen3-deep"]), "--set", "max_episode_tokens=4096")
    facts = json.loads(deep.stdout.strip().splitlines()[-1])
    between = (facts["needed_gb_for_one_episode_checkpointed"] + facts["needed_gb_for_one_episode"]) / 2
    assert facts["needed_gb_for_one_episode_checkpointed"] < facts["needed_gb_for_one_episode"]
    args = ["--model", str(folders["qwen3-deep"]), "--set", f"memory_budget_gb={between}", "--set",
            "max_episode_tokens=4096"]
    auto = dry_run(*args)
    assert auto.returncode == 0 and json.loads(auto.stdout.strip().splitlines()[-1])["grad_checkpoint"]
    assert dry_run(*args, "--set", "grad_checkpoint='off'").returncode == 1
    refused = dry_run("--model", str(folders["mamba"]))
    assert refused.returncode != 0 and "ArraysCache" in refused.stderr and "Traceback" not in refused.stderr


@pytest.mark.parametrize("decode_chunk", [1, 8])
@pytest.mark.parametrize("family", ["gemma3_text", "qwen3_5", "lfm2", "gemma4_text"])
def test_rows_join_leave_compact_and_hit_the_prefix_cache(folders, family, decode_chunk):
    """Continuous batching on Gemma 3 (window 8) and the recurrent hybrids: requests joining midway, a
    long prompt's holes compacted, a follow-up turn starting from the prefix cache (for a recurrent model,
    from the state after the whole earlier sequence); each greedy sequence is the one it gets alone from
    mlx-lm's forward, in single decode steps and in chunks of 8 (rows fed past their end inside a chunk)."""
    from artmlx.engine.generate import Engine
    from artmlx.engine.scheduler import Request, Scheduler
    from tests.engine.test_scheduler import assert_greedy_and_exact, run

    model, _, _ = load_policy(str(folders[family]), LoraSpec(rank=4))
    rng = np.random.default_rng(1)
    prompt = lambda n: rng.integers(3, 100, n).tolist()  # noqa: E731
    scheduler = Scheduler(Engine(model), max_rows=4, prefix_cache_bytes=1 << 24, decode_chunk=decode_chunk)
    arrivals = {0: [Request(prompt(5), 14, 0.0), Request(prompt(12), 4, 0.0)],
                3: [Request(prompt(90), 3, 0.0), Request(prompt(2), 20, 0.0)], 6: [Request(prompt(9), 9, 0.0)]}
    run(scheduler, arrivals)
    first = [r for rs in arrivals.values() for r in rs]
    follow = Request(first[0].prompt + first[0].tokens + prompt(6), 10, 0.0)
    run(scheduler, {0: [follow]})
    assert scheduler.counts["compactions"] >= 1 and scheduler.prefix.stats["prefix_hits"] >= 1
    # by default a recurrent model steps singly (its rows' states cannot be cut back to an end inside a chunk)
    assert Scheduler(Engine(model)).decode_chunk == (1 if family in ("qwen3_5", "lfm2") else 8)
    for request in first + [follow]:
        assert request.finish_reason == "length"
        assert_greedy_and_exact(model, request)


@pytest.mark.parametrize("family", ["mistral3", "gemma3_text", "gpt_oss", "qwen3_5", "gemma4_text"])
def test_checkpointed_update_equals_the_plain_one_in_each_family(folders, family):
    """Per-layer checkpointing through each family's own layer signature (Ministral 3 passes an attention
    scale, Gemma 3 and GPT-OSS window masks): the adapters after one update match the plain update's."""
    after = {}
    for setting in ("off", "on"):
        mx.random.seed(5)
        model, tokenizer, _ = load_policy(str(folders[family]), LoraSpec(rank=4, scale=20.0))
        groups = EpisodeRollouts(model, tokenizer, lambda: make_env("tictactoe"),
                                 SamplingParams(temperature=1.0)).play([7, 8], 4, mx.random.key(3))
        for group in groups:
            for index, episode in enumerate(group.episodes):
                episode.reward = float(index % 2)
        metrics = GRPOTrainer(model, trainer_settings({"temperature": 1.0, "grad_checkpoint": setting})
                              ).train_step(groups)
        assert metrics["grad_checkpointed"] == (setting == "on")
        after[setting] = {k: np.array(v) for k, v in tree_flatten(model.trainable_parameters())}
    for name in after["off"]:
        np.testing.assert_allclose(after["on"][name], after["off"][name], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("family", ["qwen3_5", "lfm2"])
def test_recurrent_prefix_state_gives_the_full_forwards_logprobs_and_gradients(folders, family):
    """The learner's shared-prompt forward on a hybrid: prefix rows of different lengths end in states
    that their episode rows continue from; logprobs and adapter gradients equal each episode run alone."""
    import mlx.nn as nn

    from tests.learner.test_forward import _full_forward, _learner_forward, weighted_losses

    model, tokenizer, _ = load_policy(str(folders[family]), LoraSpec(rank=4, scale=20.0))
    from mlx.utils import tree_unflatten

    from artmlx.learner.batching import common_prefix

    mx.random.seed(4)  # nonzero B: the adapters take part in the forward
    model.update(tree_unflatten([(name, mx.random.normal(value.shape) * 0.05 if name.endswith("lora_b") else value)
                                 for name, value in tree_flatten(model.trainable_parameters())]))
    groups = EpisodeRollouts(model, tokenizer, lambda: make_env("tictactoe"),
                             SamplingParams(temperature=1.0)).play([3, 4], 3, mx.random.key(2))
    episodes = [e for g in groups for e in g.episodes]
    episodes[5].tokens[4] = (episodes[5].tokens[4] + 1) % 90 + 6  # the second group shares only 4 tokens
    members = [[0, 1, 2], [3, 4, 5]]
    assert common_prefix(episodes[3:]) == 4 < common_prefix(episodes[:3])  # prefix rows of different lengths
    expected = _full_forward(model, episodes)
    for e, g in zip(expected, _learner_forward(model, episodes, members)):
        np.testing.assert_allclose(g, np.array(e), atol=1e-5, rtol=1e-5)

    trainer = GRPOTrainer(model, trainer_settings({"temperature": 1.0}))
    batches = trainer.microbatches(episodes, np.zeros(len(episodes), np.float32), members)
    weights = [mx.array(np.random.default_rng(i).standard_normal(len(e)).astype(np.float32))
               for i, e in enumerate(expected)]
    learner_loss, full_loss = weighted_losses(trainer, batches, episodes, weights)

    model.train(True)  # as the trainer's step: mlx-lm's recurrent layers take their differentiable ops
    learner_grads = dict(tree_flatten(nn.value_and_grad(model, learner_loss)(model)[1]))
    full_grads = dict(tree_flatten(nn.value_and_grad(model, full_loss)(model)[1]))
    model.eval()
    assert learner_grads.keys() == full_grads.keys() and learner_grads
    assert any(float(mx.abs(g).max()) > 0 for g in full_grads.values())
    for name in full_grads:
        np.testing.assert_allclose(np.array(learner_grads[name]), np.array(full_grads[name]), atol=2e-4, rtol=1e-3)


def test_estimate_counts_dense_copies_of_two_dimensional_layers_only():
    """Experts' 3-D 4-bit matrices keep MLX's kernel on every backend (only QuantizedLinear and tied heads
    dequantize), so the estimate gives them no dense copy however large (Qwen3-30B-A3B's shape)."""
    from artmlx.engine.estimate import shape_from_tensors
    from artmlx.model.synth import architecture, model_config, parameter_layout

    family, shape = architecture("qwen3-30b-a3b")
    config = model_config(family, shape, "qwen3-30b-a3b")
    layout = parameter_layout(config)
    dtypes = {"uint32": "U32", "bfloat16": "BF16", "float32": "F32", "float16": "F16"}
    tensors = {name: (dtypes[dtype], dims) for name, (dims, dtype) in layout.items()}
    estimated = shape_from_tensors(config, tensors, device="cpu")
    two_d = sum(d[0] * d[1] * 8 * 4 for t, d in tensors.values()
                if t == "U32" and len(d) == 2 and d[0] * d[1] * 8 >= (1 << 16))
    assert estimated.dense_copy_bytes == two_d and two_d < 30e9 * 4 * 0.2  # attention and head, not experts


def test_memory_plan_reads_widths_from_the_modules_and_names_what_it_cannot_size(folders):
    """LFM2 names its feed-forward width `block_ff_dim`; Gemma 4's double-wide layers are wider than
    `intermediate_size`: the plan uses the widest feed-forward projection the loaded model has. A config
    without a dimension the modules do not show either is refused with the field named."""
    from artmlx.engine.memory import loaded_dims
    from artmlx.model.policy import load_base

    lfm2 = load_base(str(folders["lfm2-ff"]))[0]
    assert loaded_dims(lfm2)["intermediate_size"] == 128
    assert ModelShape.of(lfm2).prefill_bytes_per_token(64, "cpu") > 0  # it crashed on the missing width
    assert ModelShape.of(load_base(str(folders["gemma4_text"]))[0]).intermediate == 256  # use_double_wide_mlp
    text = {"model_type": "custom", "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 128}
    with pytest.raises(ValueError, match="custom.*num_hidden_layers"):
        ModelShape.from_config(text, 4, 0, 0)
