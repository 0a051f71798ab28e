"""`artmlx --help`: the commands listed by what a user is doing."""

from __future__ import annotations

import click

# `artmlx --help` lists the commands by what a user is doing, each with a one-line summary; a command
# missing here is listed under "Other" with its docstring's first sentence (a test keeps every one placed).
SECTIONS = (
    ("Train and evaluate", (
        ("train", "Train in one process: play groups, GRPO update, evaluate; repeat."),
        ("run", "Learner and N actors on this machine, supervised (the pipeline)."),
        ("eval", "Score a base model or adapters on held-out tasks, with a 95% CI."),
        ("plot", "Plot reward and eval score of one or more runs."),
        ("config", "Every config field with its default; --recipes lists recipes."),
    )),
    ("Models and serving", (
        ("model", "Import GGUF files, list packaged models, synthesize shapes."),
        ("serve", "OpenAI-compatible server with exact token ids and logprobs."),
    )),
    ("Several machines", (
        ("fleet", "doctor, up, down, logs, status, service: a fleet from a hosts file."),
        ("keygen", "Create CURVE keys for the learner and an actor."),
    )),
    ("Processes (what run and fleet up start)", (
        ("learner", "The learner: trains on actors' groups, sends adapters."),
        ("actor", "An actor: plays groups with the latest adapters."),
        ("status", "A running learner's state and its actors."),
    )),
    ("Measure", (
        ("bench", "Speed and memory benchmarks, side by side in one process."),
    )),
)


class SectionedGroup(click.Group):
    """A click group whose help lists commands in `SECTIONS` instead of one alphabetical block."""

    def format_commands(self, ctx, formatter) -> None:
        visible = {name: command for name in self.list_commands(ctx)
                   if (command := self.get_command(ctx, name)) is not None and not command.hidden}
        placed = {name for _, rows in SECTIONS for name, _ in rows}
        limit = formatter.width - 6 - max(map(len, visible), default=0)
        sections = [(title, [(n, summary) for n, summary in rows if n in visible]) for title, rows in SECTIONS]
        sections.append(("Other", [(n, visible[n].get_short_help_str(limit)) for n in visible if n not in placed]))
        for title, rows in sections:
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)
