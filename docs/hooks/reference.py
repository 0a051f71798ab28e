"""mkdocs hook: the reference pages, generated from the code at every build (so they cannot go stale).

- `reference/cli.md`: every `artmlx` command and option, from the click command tree;
- `reference/config.md`: every config field with its type, default and docstring (`artmlx/config.py`);
- `reference/protocol.md`: every wire message and its fields' bounds (`artmlx/protocol/messages.py`);
- `reference/serve.md`: the request fields `artmlx serve` takes on each route, and those it refuses by name
  (`artmlx/serve/params.py`).
"""

from __future__ import annotations

import dataclasses

from mkdocs.structure.files import File


def on_files(files, config):
    for name, text in (("reference/cli.md", cli_markdown()), ("reference/config.md", config_markdown()),
                       ("reference/protocol.md", protocol_markdown()), ("reference/serve.md", serve_markdown())):
        files.append(File.generated(config, name, content=text))
    return files


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def cli_markdown() -> str:
    import inspect

    import click

    from artmlx.cli import cli
    from artmlx.cli_help import SECTIONS

    lines = ["# Command line", "",
             "Every `artmlx` command and option, in the sections `artmlx --help` lists them in. Generated from the "
             "code (each command's `--help` says the same; `-h` works too).", ""]

    def walk(command, path, level):
        ctx = click.Context(command, info_name=path[-1])
        help_text = "\n".join(line for line in inspect.cleandoc(command.help or "").splitlines() if line != "\b")
        lines.extend([f"{'#' * level} `{' '.join(path)}`", "", help_text, ""])
        params = [p for p in command.get_params(ctx) if "--help" not in p.opts and p.name != "version"]
        usage = " ".join(command.collect_usage_pieces(ctx))
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
                    walk(sub, path + [name], min(level + 1, 4))

    ctx = click.Context(cli, info_name="artmlx")
    visible = [name for name in cli.list_commands(ctx) if not cli.get_command(ctx, name).hidden]
    placed = [name for _, rows in SECTIONS for name, _ in rows]
    sections = [(title, [name for name, _ in rows if name in visible]) for title, rows in SECTIONS]
    sections.append(("Other", [name for name in visible if name not in placed]))
    lines.extend(["| section | commands |", "|---|---|"])
    for title, names in sections:
        if names:
            links = ", ".join(f"[`{n}`](#artmlx-{n})" for n in names)
            lines.append(f"| {title} | {links} |")
    lines.append("")
    for title, names in sections:
        if names:
            lines.extend([f"## {title}", ""])
            for name in names:
                walk(cli.get_command(ctx, name), ["artmlx", name], 3)
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


def serve_markdown() -> str:
    import json

    from artmlx.serve import params

    accepted = params.CHAT_FIELDS | params.COMPLETION_FIELDS
    if set(params.FIELD_NOTES) != accepted:  # a field added to a route without its note fails the build
        raise ValueError(f"artmlx/serve/params.py: FIELD_NOTES and the routes' fields differ: "
                         f"{sorted(set(params.FIELD_NOTES) ^ accepted)}")
    lines = ["# Serve API", "",
             "The request fields of the OpenAI-compatible routes `artmlx serve` implements, and those it refuses by "
             "name. Generated from the tables the server checks requests against (`artmlx/serve/params.py`); "
             "[Serving](../guides/serving.md) explains the server and what its responses carry.", "",
             "| route | takes |", "|---|---|",
             "| `GET /v1/models` | nothing: lists the names it answers to, `NAME` and `NAME@STEP` for each adapter "
             "version still served |",
             "| `POST /v1/chat/completions` | the fields whose routes say *chat*, streamed (`stream: true`) or not |",
             "| `POST /v1/completions` | the fields whose routes say *completions*, streamed or not |", "",
             "## Accepted fields", "",
             "A field set to `null` counts as absent. A value outside its range is a 400 whose `param` names the "
             "field. *Trainable* says whether a choice sampled with the field can be trained on: the learner "
             "recomputes logprobs under the temperature alone, so a choice whose distribution `top_p`, "
             "`logit_bias` or a penalty changed is marked `sampling_modified` and `MLXBackend` refuses it.", "",
             "| field | routes | default and range | what artmlx serve does | trainable |",
             "|---|---|---|---|---|"]
    for name, (what, trainable) in params.FIELD_NOTES.items():
        routes = ", ".join(route for route, fields in (("chat", params.CHAT_FIELDS),
                                                      ("completions", params.COMPLETION_FIELDS)) if name in fields)
        bounds = ""
        if name in params.BOUNDS:
            default, low, high = params.BOUNDS[name]
            bounds = f"{default} ({low} to {high})" + (", completions" if name == "logprobs" else "")
        lines.append(f"| `{name}` | {routes} | {_cell(bounds)} | {_cell(what)} | {_cell(trainable)} |")
    lines.extend(["", "## Refused fields", "",
                  "These get a 400 whose `param` names the field and whose message says what to send instead:", "",
                  "| field | the error's message |", "|---|---|"])
    for name, message in params.REFUSED.items():
        lines.append(f"| `{name}` | {_cell(message)} |")
    lines.extend(["", "Any other field is refused the same way, its message listing the fields the route takes. "
                  "Within accepted fields, these values are refused:", "",
                  "- `response_format` other than `{\"type\": \"text\"}` (JSON mode needs constrained decoding);",
                  f"- `nvext` other than `{json.dumps({'extra_fields': sorted(params.NVEXT_EXTRA_FIELDS)})}`;",
                  "- `stream_options` with any key but `include_usage`, or without `stream: true`;",
                  "- `chat_template_kwargs` that set the template call's own arguments: "
                  + ", ".join(f"`{a}`" for a in sorted(params.TEMPLATE_ARGUMENTS)) + ";",
                  "- message content parts other than text (image, audio, file): a multimodal checkpoint's text "
                  "tower is what runs.", ""])
    return "\n".join(lines) + "\n"
