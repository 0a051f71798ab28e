"""ART on MLX: `MLXBackend` (OpenPipe ART's Backend protocol) and token-exact trajectory conversion.

Needs the optional extra `artmlx[art]` (the real `openpipe-art` package) only for `MLXBackend.train`'s
return type and for ART's own classes in user code; `rollout/choices.py` works on any object of ART's shape.
"""

from . import compat
from .backend import MLXBackend
from ..hints import set_directive_hint
from ..rollout.choices import TrajectoryRefused, trajectory_episode

compat.install()  # ART's PipelineTrainer imports art.local.backend, which needs torch only on NVIDIA

__all__ = ["MLXBackend", "TrajectoryRefused", "set_directive_hint", "trajectory_episode"]
