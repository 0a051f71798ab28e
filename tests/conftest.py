import os
import tempfile

# Every test run writes the embedded model into its own cache, never the user's.
os.environ.setdefault("ARTMLX_CACHE", tempfile.mkdtemp(prefix="artmlx-test-cache-"))
