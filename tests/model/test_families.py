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

from artmlx.config import load_config
from artmlx.engine.memory import ModelShape
from artmlx.envs import make_env
from artmlx.learner.trainer import GRPOTrainer
from artmlx.model.families import text_model
from artmlx.model.policy import LoraSpec, load_policy
from artmlx.netutil import free_port
from artmlx.rollout.episodes import EpisodeRollouts, SamplingParams
from artmlx.serve import run_server
from artmlx.serve.model_server import ModelServer, ServeConfig
from tests.helpers import family_folder, learner_logprobs


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    folders = {family: family_folder(root, family) for family in ("qwen3", "mistral3", "gemma3_text")}
    # a vocabulary large enough that the tied head is one of the 4-bit layers that dequantize on the CPU
    folders["qwen3-wide"] = family_folder(root, "qwen3", "qwen3-wide", vocab_size=2048)
    return folders


@pytest.mark.parametrize("family", ["qwen3", "mistral3"])
def test_family_rolls_out_recomputes_and_trains(folders, family):
    """A flat config and a multimodal wrapper (`text_config`): the engine and the learner run the text
    tower, the sampler's logprobs are the learner's recompute, and a GRPO step moves the adapters."""
    model, tokenizer, count = load_policy(str(folders[family]), LoraSpec(rank=4, scale=20.0))
    assert count > 0
    shape = ModelShape.of(model)
    assert (shape.layers, shape.hidden, shape.vocab) == (2, 64, 128)
    if family == "mistral3":
        assert text_model(model) is model.language_model
    rollouts = EpisodeRollouts(model, tokenizer, lambda: make_env("tictactoe"), SamplingParams(temperature=1.0))
    groups = rollouts.play([1, 2], 4, mx.random.key(0))
    recomputed, behaviour = learner_logprobs(model, groups, 1.0)
    assert len(recomputed) > 10
    assert np.abs(recomputed - behaviour).max() < 1e-3
    for group in groups:  # a random model's games all score alike: give the step advantages to follow
        for index, episode in enumerate(group.episodes):
            episode.reward = float(index % 2)
    before = {k: np.array(v) for k, v in tree_flatten(model.trainable_parameters())}
    GRPOTrainer(model, load_config(None, {"temperature": 1.0})).train_step(groups)
    after = dict(tree_flatten(model.trainable_parameters()))
    assert any(not np.array_equal(before[k], np.array(after[k])) for k in before)


def test_nested_config_model_serves_a_chat(folders):
    """`artmlx serve` on Ministral 3's wrapper: a chat request through the real openai client."""
    server = ModelServer(ServeConfig(model=str(folders["mistral3"]), max_tokens=8))
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


def test_sliding_window_family_is_refused_at_load_in_every_command(folders):
    """Gemma 3's sliding-window layers: refused when loaded, naming them, by the library, the server
    and the command line (before, `artmlx serve` started and answered every request with a 500)."""
    folder = str(folders["gemma3_text"])
    with pytest.raises(ValueError, match=r"sliding-window attention \(RotatingKVCache: layers 0\)"):
        load_policy(folder, LoraSpec(rank=4))
    with pytest.raises(ValueError, match="sliding-window"):
        ModelServer(ServeConfig(model=folder))
    for command in (["serve", "--model", folder, "--port", str(free_port())],
                    ["train", "--model", folder, "--steps", "1"]):
        done = subprocess.run([sys.executable, "-m", "artmlx", *command], capture_output=True, text=True, timeout=120)
        assert done.returncode != 0
        assert "RotatingKVCache" in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("family", ["qwen3", "mistral3", "qwen3-wide"])
def test_estimate_before_loading_is_the_loaded_models_shape(folders, family):
    """`train --dry-run` reads config.json and the safetensors headers only; the shape it plans with is
    the one `ModelShape.of` reads from the loaded base (weights, dtype, dense copies included)."""
    from artmlx.engine.estimate import shape_from_folder
    from artmlx.model.policy import load_base

    model, _ = load_base(str(folders[family]))
    assert shape_from_folder(folders[family]) == ModelShape.of(model)
    if family == "qwen3-wide":
        assert ModelShape.of(model).dense_copy_bytes > 0


def test_dry_run_says_whether_an_episode_fits_and_refuses_unsupported_families(folders):
    def dry_run(*args):
        return subprocess.run([sys.executable, "-m", "artmlx", "train", "--dry-run", *args], capture_output=True,
                              text=True, timeout=120)

    roomy = dry_run("--model", str(folders["mistral3"]), "--set", "memory_budget_gb=2")
    assert roomy.returncode == 0, roomy.stderr
    facts = json.loads(roomy.stdout.strip().splitlines()[-1])
    assert facts["fits"] and facts["rows_per_batch"] >= 1 and facts["episodes_per_micro_batch"] >= 1
    tight = dry_run("--model", str(folders["mistral3"]), "--set", "memory_budget_gb=0.001",
                    "--set", "max_episode_tokens=4096")
    assert tight.returncode == 1 and "does NOT fit" in tight.stdout
    refused = dry_run("--model", str(folders["gemma3_text"]))
    assert refused.returncode != 0 and "RotatingKVCache" in refused.stderr and "Traceback" not in refused.stderr
