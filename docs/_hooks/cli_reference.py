"""MkDocs hook: the command-line reference page, generated from the click commands.

``docs/reference/cli.md`` holds a marker; it is replaced by each command's ``--help`` text,
so the reference can never drift from the commands.
"""

from __future__ import annotations

from typing import Any

MARKER = "<!-- pitstop-cli-reference -->"


def _help(name: str | None) -> str:
    import click

    from pitstop.cli.app import all_commands, cli

    command = cli if name is None else all_commands()[name]
    parent = click.Context(cli, info_name="pitstop", terminal_width=100, max_content_width=100)
    ctx = parent if name is None else click.Context(command, info_name=name, parent=parent,
                                                   terminal_width=100, max_content_width=100)
    return command.get_help(ctx)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if MARKER not in markdown:
        return markdown
    from pitstop.cli.app import all_commands

    parts = ["## pitstop\n", "```text", _help(None), "```\n"]
    for name in all_commands():
        parts += [f"## pitstop {name}\n", "```text", _help(name), "```\n"]
    return markdown.replace(MARKER, "\n".join(parts))
