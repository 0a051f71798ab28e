"""ART's modules that import PyTorch only for their CUDA path, importable without it.

ART's `PipelineTrainer` checks `isinstance(backend, art.local.backend.LocalBackend)`, and that module
imports torch (for vLLM and Unsloth on NVIDIA GPUs) at its top. On a Mac without torch the check
would fail with ModuleNotFoundError before any training. When torch is not installed, this finder
answers `import art.local.backend` with a module whose `LocalBackend` cannot be constructed (it says
why and what to use instead): the check then passes for any other backend, as it does on NVIDIA.
With torch installed the real module is imported and nothing here takes part.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys

MODULE = "art.local.backend"


class LocalBackend:
    """ART's LocalBackend (vLLM + Unsloth on a CUDA GPU), which this Python cannot run: it has no torch."""

    def __init__(self, *args, **kwargs):
        raise ImportError("art.LocalBackend needs PyTorch and a CUDA GPU (pip install 'openpipe-art[backend]'); "
                          "on a Mac use `from artmlx.art import MLXBackend` instead")


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        LocalBackend.__module__ = MODULE
        module.LocalBackend = LocalBackend
        module.__doc__ = __doc__


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != MODULE or importlib.util.find_spec("torch") is not None:
            return None
        return importlib.machinery.ModuleSpec(name, _Loader())


def install() -> None:
    """Answer `import art.local.backend` without torch (idempotent)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
