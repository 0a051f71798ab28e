"""Tiny random-weight 4-bit folders of each model family (mlx-lm's own classes), made once per test session."""

import pytest

from tests.helpers import family_folder


@pytest.fixture(scope="session")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    folders = {family: family_folder(root, family)
               for family in ("qwen3", "mistral3", "gemma3_text", "olmo3", "gpt_oss", "lfm2", "qwen3_5",
                              "qwen3_next", "mamba", "gemma4_text", "gemma3", "gemma4", "qwen3_moe")}
    # a vocabulary large enough that the tied head is one of the 4-bit layers that dequantize on the CPU
    folders["qwen3-wide"] = family_folder(root, "qwen3", "qwen3-wide", vocab_size=2048)
    # LFM2 as mlx-lm reads it: the feed-forward width as `block_ff_dim` only (the memory plan reads the modules)
    folders["lfm2-ff"] = family_folder(root, "lfm2", "lfm2-ff", intermediate_size=None)
    folders["qwen3-deep"] = family_folder(root, "qwen3", "qwen3-deep", num_hidden_layers=12)  # checkpointing pays
    return folders
