"""`artmlx model ...`: model folders: the embedded one, packaged real models, GGUF imports, synthetic shapes."""

from __future__ import annotations

from pathlib import Path

import click


def _fail(error: Exception) -> None:
    raise click.ClickException(str(error))


@click.group(name="model")
def model_group() -> None:
    """Model folders: the embedded one, real models from GGUF files (packaged or your own), and random-weight
    benchmark models of real shapes."""


@model_group.command(name="import")
@click.argument("source")
@click.option("--out", type=click.Path(file_okay=False), help="Folder to write (default: the cache, where "
              "`--model FILE.gguf` finds it).")
@click.option("--bits", type=click.Choice(["0", "2", "3", "4", "5", "6", "8"]), default="4", show_default=True,
              help="Bits for matrices MLX cannot keep as they are (K-quants, Q5, IQ, F16/BF16/F32); 0 keeps them "
                   "floating point.")
@click.option("--group-size", type=click.Choice(["32", "64", "128"]), default="64", show_default=True,
              help="Group size of those requantized matrices.")
def model_import(source, out, bits, group_size):
    """Import a GGUF file (llama.cpp, Ollama, LM Studio; architectures llama, qwen2, qwen3, gemma3) or a packaged
    model's name as an mlx-lm model folder, and print the folder.

    Q4_0, Q4_1 and Q8_0 matrices are kept exactly (MLX's own affine format); other types are dequantized and
    quantized again (--bits, --group-size). The tokenizer and chat template come from the file. `--model SOURCE`
    does the same on first use in every command; the folder is an ordinary mlx-lm folder (mlx_lm.generate,
    mlx_lm.fuse and mlx_lm.server load it).
    """
    from .gguf_import import gguf_source, import_gguf
    from .gguf_tensors import Requantize

    try:
        path = gguf_source(source)
        if path is None:
            raise ValueError(f"{source!r} is neither a .gguf file nor a packaged model ({_packaged_names()})")
        folder = import_gguf(path, Path(out) if out else None, Requantize(int(bits), int(group_size)),
                             report=lambda line: click.echo(line, err=True))
    except (ValueError, FileNotFoundError) as error:
        _fail(error)
    click.echo(str(folder))


@model_group.command(name="list")
def model_list():
    """The real models that Python packages carry (nothing is downloaded from a hub)."""
    from importlib.util import find_spec

    from .packaged import PACKAGED

    for model in PACKAGED.values():
        installed = find_spec(model.package) is not None
        click.echo(f"{model.name:24} {'installed' if installed else 'not installed':14} {model.description}; "
                   f"{model.license}")
        if not installed:
            click.echo(f"{'':24} install: {model.install}")


@model_group.command(name="synth")
@click.argument("arch")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Folder to write (replaced if it exists).")
@click.option("--seed", type=int, default=0, show_default=True)
def model_synth(arch, out, seed):
    """Write a random-weight 4-bit mlx-lm model of a real architecture (qwen2.5-0.5b/1.5b/3b/7b,
    qwen3-0.6b/4b/8b/14b, qwen3-30b-a3b, qwen3.5-0.8b/9b, gemma-3-1b/4b, gpt-oss-20b, llama-3.2-1b/3b).

    For benchmarks only: the shapes, vocabulary, tokenizer and chat template are real, the weights random.
    """
    from .synth import synthesize

    try:
        folder = synthesize(arch, Path(out), seed)
    except ValueError as error:
        _fail(error)
    click.echo(f"wrote {folder} (random weights; `--model {folder}` benchmarks the {arch} shape)")


@model_group.command(name="path")
@click.argument("name", default="tiny")
def model_path_command(name):
    """Print the mlx-lm folder of `tiny` (the embedded model), a packaged model or a GGUF file, writing it on
    first use; any mlx-lm tool takes it as --model."""
    from .tiny import TINY_NAME, resolve_model

    try:
        folder = resolve_model(name)
    except (ValueError, FileNotFoundError) as error:
        _fail(error)
    if name != TINY_NAME and folder == name:
        _fail(ValueError(f"{name!r} is not tiny, a packaged model ({_packaged_names()}) or a .gguf file; a folder or "
                         "hub id is its own path"))
    click.echo(folder)


def _packaged_names() -> str:
    from .packaged import PACKAGED

    return ", ".join(PACKAGED)
