"""Plain help for ``openenv`` and its commands: the usage line, the description, then each
argument and option with the name of its value (``--port PORT``) and its default, wrapped to the
terminal (at most :data:`WIDTH` columns, the ``max_content_width`` of the app).

typer's own help shows each value's Python type (``<str>``, and ``<bool>`` even on ``--help``),
writes a required argument as ``{NAME}`` and draws boxes that wrap badly in a narrow terminal;
this help shows only what a user types. It relies on click's public ``Command``/``Parameter``
attributes and ``HelpFormatter`` methods, which typer's classes keep.
"""

from __future__ import annotations

from typing import Any, List, Tuple

from rich.errors import MarkupError
from rich.text import Text
from typer.core import TyperCommand, TyperGroup

WIDTH = 100


def plain(text: str) -> str:
    """``text`` without rich markup (command docstrings use ``[bold]...[/]``)."""
    try:
        return Text.from_markup(text).plain
    except MarkupError:
        return text


def _value_name(param: Any) -> str:
    return param.metavar or param.name.upper()


def _usage_pieces(command: Any) -> List[str]:
    pieces = ["[OPTIONS]"] if any(p.param_type_name == "option" for p in command.params) else []
    for param in command.params:
        if param.param_type_name == "argument":
            name = _value_name(param) + ("..." if param.nargs != 1 else "")
            pieces.append(name if param.required else f"[{name}]")
    return pieces


def _default(param: Any) -> str:
    """`` [default: X]`` where a default is worth showing (not for flags off by default)."""
    default = param.default
    if not param.show_default or default is None or default is False or default == () or default == []:
        return ""
    if getattr(param, "is_flag", False):
        if param.secondary_opts:  # --sandbox/--no-sandbox: the one that is on
            on = param.opts[0] if default else param.secondary_opts[0]
            return f"  [default: {on.lstrip('-')}]"
        return ""
    if hasattr(default, "value"):  # an Enum
        default = default.value
    return f"  [default: {default}]"


def _rows(command: Any, ctx: Any) -> Tuple[List[Tuple[str, str]], List[Tuple[str, str]]]:
    arguments, options = [], []
    for param in command.get_params(ctx):
        if getattr(param, "hidden", False):
            continue
        text = plain(getattr(param, "help", None) or "") + _default(param)
        if param.param_type_name == "argument":
            arguments.append((_value_name(param), text))
            continue
        # The short names and the first long one; further long ones are aliases kept for old scripts.
        longs = [name for name in param.opts if name.startswith("--")]
        names = ", ".join([name for name in param.opts if not name.startswith("--")] + longs[:1])
        if param.secondary_opts:
            names += " / " + ", ".join(param.secondary_opts)
        if not param.is_flag:
            names += " " + _value_name(param)
        options.append((names, text))
    return arguments, options


def _description(command: Any, formatter: Any) -> None:
    if command.help:
        formatter.write_paragraph()
        with formatter.indentation():
            for number, paragraph in enumerate(plain(command.help).strip().split("\n\n")):
                if number:
                    formatter.write_paragraph()
                formatter.write_text(" ".join(paragraph.split()))


class PlainCommand(TyperCommand):
    """A command whose help is :mod:`plain <openenv.cli._help>`."""

    def collect_usage_pieces(self, ctx: Any) -> List[str]:
        return _usage_pieces(self)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self.format_usage(ctx, formatter)
        _description(self, formatter)
        arguments, options = _rows(self, ctx)
        for title, rows in (("Arguments", arguments), ("Options", options)):
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


class PlainGroup(TyperGroup):
    """The ``openenv`` group, with :mod:`plain <openenv.cli._help>` help."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self.format_usage(ctx, formatter)
        _description(self, formatter)
        _, options = _rows(self, ctx)
        with formatter.section("Options"):
            formatter.write_dl(options)
        commands = [(name, plain(self.commands[name].get_short_help_str(WIDTH))) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(commands)
        formatter.write_paragraph()
        if ctx.parent is None:
            formatter.write_text("Run 'openenv help COMMAND' (or 'openenv COMMAND --help') for a command's options.")
        else:  # a group of commands (`openenv skills`): `openenv help` knows only the top level
            formatter.write_text(f"Run '{ctx.command_path} COMMAND --help' for a command's options.")
