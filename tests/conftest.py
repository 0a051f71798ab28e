import os
import tempfile

import pytest

# Every test run writes the embedded model into its own cache, never the user's.
os.environ.setdefault("ARTMLX_CACHE", tempfile.mkdtemp(prefix="artmlx-test-cache-"))


@pytest.fixture(autouse=True)
def _stop_hub_threads():
    """A failed protocol test must not leave a hub thread holding a socket: zmq would hang at exit."""
    yield
    from tests.protocol.helpers import RUNNING

    for hub in list(RUNNING):
        hub.stop()
