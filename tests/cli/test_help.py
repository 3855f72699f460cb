"""The ``openenv`` command's own surface: help that shows only what a user types, ``--version``,
``openenv help``, and usage errors in plain words. Run as a user runs it: ``python -m openenv.cli``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import openenv

COMMANDS = ["init", "serve", "validate", "build", "push", "list", "fork", "skills", "help"]


def openenv_cli(*args: str, columns: int = 100) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": str(columns), "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "openenv.cli", *args], capture_output=True, text=True, env=env, timeout=60
    )


def test_a_bare_openenv_shows_the_commands_and_exits_0():
    result = openenv_cli()
    assert result.returncode == 0, result.stderr
    assert "Error" not in result.stdout + result.stderr
    for command in COMMANDS:
        assert f"\n  {command} " in result.stdout, command
    assert "openenv help COMMAND" in result.stdout


def test_version_prints_the_installed_release():
    result = openenv_cli("--version")
    assert (result.returncode, result.stdout) == (0, f"openenv {openenv.__version__}\n")


def test_help_command_shows_the_same_help_as_dash_dash_help():
    assert openenv_cli("help", "serve").stdout == openenv_cli("serve", "--help").stdout
    assert openenv_cli("help").stdout == openenv_cli("--help").stdout


def test_help_of_an_unknown_command_suggests_the_near_one():
    result = openenv_cli("help", "srve")
    assert result.returncode == 1
    assert "no command 'srve': did you mean 'serve'?" in result.stderr


@pytest.mark.parametrize("command", [[], *[[c] for c in COMMANDS]], ids=["openenv", *COMMANDS])
def test_help_shows_no_python_types_and_fits_100_columns(command):
    result = openenv_cli(*command, "--help")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    for noise in ("<bool>", "<str>", "<int>", "<float>", "{NAME}", "{SPACE}", "│", "╭"):
        assert noise not in text, (noise, text)
    assert max(len(line) for line in text.splitlines()) <= 100, text
    assert text.startswith("Usage: openenv")


def test_a_long_option_alias_is_not_listed_twice():
    text = openenv_cli("fork", "--help").stdout
    assert "-s, --set-secret KEY=VALUE" in text and "--secret" not in text


def test_an_invalid_choice_reads_as_a_plain_usage_error(tmp_path):
    result = openenv_cli("init", "my_env", "--template", "foo", "--output-dir", str(tmp_path))
    assert result.returncode == 2
    assert "Error: Invalid value for '--template' / '-t': 'foo' is not one of 'typed', 'mcp'." in result.stderr
    assert "Value error" not in result.stderr and "BadParameter" not in result.stderr
    assert "Try 'openenv init -h' for help." in result.stderr


def test_an_unknown_option_names_it():
    result = openenv_cli("serve", "--sandboxx")
    assert result.returncode == 2 and "No such option: --sandboxx" in result.stderr
    assert "NoSuchOption" not in result.stderr


def test_serve_and_validate_spell_the_sandbox_switch_the_same_way():
    for command in ("serve", "validate"):
        assert "--sandbox / --no-sandbox" in openenv_cli(command, "--help").stdout, command
    build = openenv_cli("build", "--help").stdout
    assert "--no-build-isolation" in build and "--no-isolation" not in build  # pip's build isolation
