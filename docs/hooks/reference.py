"""mkdocs hook: the reference pages, generated from the code at every build (so they cannot go stale).

- `reference/cli.md`: every `artmlx` command and option, from the click command tree;
- `reference/config.md`: every config field with its type, default and docstring (`artmlx/config.py`);
- `reference/protocol.md`: every wire message and its fields' bounds (`artmlx/protocol/messages.py`).
"""

from __future__ import annotations

import dataclasses

from mkdocs.structure.files import File


def on_files(files, config):
    for name, text in (("reference/cli.md", cli_markdown()), ("reference/config.md", config_markdown()),
                       ("reference/protocol.md", protocol_markdown())):
        files.append(File.generated(config, name, content=text))
    return files


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def cli_markdown() -> str:
    import click

    from artmlx.cli import cli

    lines = ["# Command line", "", "Generated from the code (`artmlx --help` and each command's `--help` say the same).", ""]

    def walk(command, path):
        ctx = click.Context(command, info_name=path[-1])
        if path[1:]:
            lines.extend([f"## `{' '.join(path)}`", ""])
        lines.extend([(command.help or "").strip(), ""])
        params = [p for p in command.get_params(ctx) if p.name not in ("help", "version")]
        usage = " ".join(command.collect_usage_pieces(ctx))
        if path[1:]:
            lines.extend(["```", f"{' '.join(path)} {usage}".rstrip(), "```", ""])
        if params:
            lines.extend(["| option | meaning | default |", "|---|---|---|"])
            for param in params:
                if isinstance(param, click.Argument):
                    names = f"`{param.human_readable_name}`"
                else:
                    names = ", ".join(f"`{o}`" for o in param.opts + param.secondary_opts)
                default = param.default if not callable(param.default) else None
                unset = default is None or type(default).__name__ == "Sentinel" or default in ((), False, "")
                shown = "" if unset or isinstance(param, click.Argument) else f"`{default}`"
                help_text = getattr(param, "help", "") or ""
                lines.append(f"| {names} | {_cell(help_text)} | {_cell(shown)} |")
            lines.append("")
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None and not sub.hidden:
                    walk(sub, path + [name])

    walk(cli, ["artmlx"])
    return "\n".join(lines) + "\n"


def config_markdown() -> str:
    from artmlx.config import CHOICES, TrainConfig, field_docs

    docs = field_docs()
    lines = ["# Configuration fields", "",
             "Every field of a run's configuration: in a TOML file (`--config FILE`), a recipe (`--config NAME`), "
             "or `--set FIELD=VALUE` (TOML syntax) on `train`, `run`, `learner` and `actor`. Generated from "
             "`artmlx/config.py`; `artmlx config` prints the same.", "",
             "| field | default | meaning |", "|---|---|---|"]
    for field in dataclasses.fields(TrainConfig):
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        meaning = docs.get(field.name, "")
        if field.name in CHOICES:
            meaning += f" One of: {', '.join(f'`{c}`' for c in CHOICES[field.name])}."
        lines.append(f"| `{field.name}` | `{default!r}` | {_cell(meaning)} |")
    return "\n".join(lines) + "\n"


def protocol_markdown() -> str:
    import inspect

    from artmlx.protocol import messages

    lines = ["# Wire messages", "",
             "Every message the learner and its actors exchange (msgpack frames over ZeroMQ, CURVE-encrypted unless "
             "`--insecure`), and the bound each field is checked against on arrival. Generated from "
             "`artmlx/protocol/messages.py`; the [protocol page](../concepts/protocol.md) explains the exchange.", ""]
    for _, cls in inspect.getmembers(messages, inspect.isclass):
        if not (dataclasses.is_dataclass(cls) and hasattr(cls, "SCHEMA") and hasattr(cls, "TYPE")):
            continue
        lines.extend([f"## `{cls.TYPE}`: {cls.__name__}", "", (cls.__doc__ or "").strip().split("\n\n")[0], "",
                      "| field | checked as |", "|---|---|"])
        for name, spec in cls.SCHEMA.items():
            lines.append(f"| `{name}` | {_cell(_rule(spec))} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def _rule(spec) -> str:
    rule = spec[0]
    if rule == "str":
        return f"string, at most {spec[1]} characters"
    if rule == "int":
        return f"integer in [{spec[1]}, {spec[2]}]"
    if rule == "choice":
        return "one of " + ", ".join(f"`{c}`" for c in spec[1])
    if rule == "str_list":
        return f"list of strings, each at most {spec[1]} characters"
    if rule == "array":
        return f"{spec[2]}-d array of {', '.join(spec[1])}"
    if rule == "tensors":
        return "named arrays"
    return rule
