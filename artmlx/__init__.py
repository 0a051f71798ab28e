"""artmlx: reinforcement learning (GRPO) for LLM agents on Apple's MLX."""

import os as _os

# transformers warns at import that PyTorch is absent; artmlx needs only its tokenizers.
_os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

__version__ = "0.1.0"
