import atexit
import os
import shutil
import tempfile

import pytest

# Every test run writes the embedded model into its own cache, never the user's, and removes it at the end.
if "ARTMLX_CACHE" not in os.environ:
    os.environ["ARTMLX_CACHE"] = _TEST_CACHE = tempfile.mkdtemp(prefix="artmlx-test-cache-")
    atexit.register(shutil.rmtree, _TEST_CACHE, ignore_errors=True)


@pytest.fixture(autouse=True)
def _stop_hub_threads():
    """A failed protocol test must not leave a hub thread holding a socket: zmq would hang at exit."""
    yield
    from tests.protocol.helpers import RUNNING

    for hub in list(RUNNING):
        hub.stop()


@pytest.fixture(scope="session")
def small_synth(tmp_path_factory):
    """Qwen2.5's real tokenizer and 151,936-token vocabulary over two small layers (random 4-bit weights)."""
    from artmlx.model.synth import synthesize

    return synthesize("qwen2.5-0.5b", tmp_path_factory.mktemp("synth") / "qwen-small", shape_overrides={
        "hidden_size": 128, "num_hidden_layers": 2, "intermediate_size": 256, "num_attention_heads": 4,
        "num_key_value_heads": 2})
