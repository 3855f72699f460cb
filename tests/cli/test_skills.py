"""``openenv skills``: the ``openenv-cli`` agent skill, what it says and where ``add`` puts it.

Each test runs the real command in a scratch working directory with a scratch ``HOME``; the
skill's snippets run against a real server, and the wheel built from the source tree carries the
skill's template.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

import openenv
from openenv.cli.__main__ import app, main
from openenv.core.env_server.serving.runner import BackgroundServer

REPO = Path(__file__).resolve().parents[2]
AGENT_DIRS = {"claude": ".claude", "codex": ".codex", "cursor": ".cursor", "opencode": ".opencode"}
GLOBAL_AGENT_DIRS = {"claude": ".claude", "codex": ".codex", "cursor": ".cursor", "opencode": ".config/opencode"}


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A scratch working directory, with a scratch home directory beside it."""
    cwd = tmp_path / "project"
    cwd.mkdir()
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return cwd


def preview(capsys: pytest.CaptureFixture) -> str:
    assert main(["skills", "preview"]) == 0
    return capsys.readouterr().out


def files_under(directory: Path) -> List[str]:
    """Every file, directory and link under ``directory``, relative, links marked ``@``."""
    return sorted(p.relative_to(directory).as_posix() + ("@" if p.is_symlink() else "") for p in directory.rglob("*"))


def python_blocks(text: str) -> List[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


# --- what the skill says ----------------------------------------------------------------------


def test_the_skill_is_named_openenv_cli_and_says_when_to_use_it(capsys):
    text = preview(capsys)
    assert text.startswith("---\n")
    front = yaml.safe_load(text.split("---\n")[1])
    assert front["name"] == "openenv-cli"
    assert "OpenEnv" in front["description"] and "Use it when" in front["description"]


def test_the_skill_names_the_release_that_wrote_it(capsys):
    assert f"openenv {openenv.__version__}" in preview(capsys)


def test_the_skill_lists_every_command_of_this_cli(capsys):
    text = preview(capsys)
    top = [c.name for c in app.registered_commands if c.name != "help"] + ["skills preview", "skills add"]
    for command in top:
        assert f"* `openenv {command}" in text, command


def test_every_command_and_option_the_skill_mentions_exists(capsys):
    """The skill cannot drift from the CLI: a renamed command or option fails here."""
    import typer.main

    text = preview(capsys)
    root = typer.main.get_command(app)
    commands = set(root.commands)
    everything = [root, *root.commands.values(), *root.commands["skills"].commands.values()]
    options = {
        name for command in everything for param in command.params for name in [*param.opts, *param.secondary_opts]
    }
    for name in re.findall(r"(?:^|`)openenv (?:--debug )?([a-z][a-z-]*)", text, re.M):  # commands, not imports
        if name != "help":  # "openenv help COMMAND"
            assert name in commands, f"the skill mentions `openenv {name}`"
    for option in set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", text)):
        assert option in options, f"the skill mentions {option}, which no openenv command has"


def test_the_skills_environment_serves_and_its_client_snippet_plays_it(capsys, tmp_path):
    environment, client = python_blocks(preview(capsys))
    namespace: Dict[str, object] = {}
    exec(compile(environment, "SKILL.md", "exec"), namespace)  # the environment snippet, as written
    with BackgroundServer(namespace["app"]) as server:
        snippet = client.replace("http://127.0.0.1:8000", server.base_url)
        assert snippet != client  # the snippet names the default address, which the server replaces
        ran = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert "guess a number from 1 to 100" in ran.stdout


# --- where `add` puts it ---------------------------------------------------------------------


def test_add_writes_the_skill_in_the_project_and_prints_its_path(work, capsys):
    text = preview(capsys)
    assert main(["skills", "add"]) == 0
    skill = work / ".agents" / "skills" / "openenv-cli" / "SKILL.md"
    assert skill.read_text() == text
    assert capsys.readouterr().out.strip() == str(skill)
    assert files_under(work) == [
        ".agents",
        ".agents/skills",
        ".agents/skills/openenv-cli",
        ".agents/skills/openenv-cli/SKILL.md",
    ]


@pytest.mark.parametrize("agent", sorted(AGENT_DIRS))
def test_each_agent_flag_links_that_agents_skills_to_the_one_copy(work, agent):
    assert main(["skills", "add", f"--{agent}"]) == 0
    link = work / AGENT_DIRS[agent] / "skills" / "openenv-cli"
    assert link.is_symlink()
    assert not os.path.isabs(os.readlink(link))  # relative: moving the project keeps it working
    assert link.resolve() == (work / ".agents" / "skills" / "openenv-cli").resolve()
    assert (link / "SKILL.md").is_file()
    others = set(AGENT_DIRS.values()) - {AGENT_DIRS[agent]}
    assert not any((work / other).exists() for other in others)


def test_links_still_hold_after_the_project_moves(work, tmp_path, monkeypatch):
    assert main(["skills", "add", "--claude", "--opencode"]) == 0
    monkeypatch.chdir(tmp_path)
    moved = shutil.move(str(work), str(tmp_path / "moved"))
    for agent in ("claude", "opencode"):
        assert (Path(moved) / AGENT_DIRS[agent] / "skills" / "openenv-cli" / "SKILL.md").is_file()


def test_global_installs_under_the_home_directory(work, tmp_path):
    home = tmp_path / "home"
    assert main(["skills", "add", "--global", "--claude", "--codex", "--cursor", "--opencode"]) == 0
    folder = home / ".agents" / "skills" / "openenv-cli"
    assert (folder / "SKILL.md").is_file()
    for agent, directory in GLOBAL_AGENT_DIRS.items():
        link = home / directory / "skills" / "openenv-cli"
        assert link.is_symlink() and link.resolve() == folder.resolve(), agent
    assert files_under(work) == []  # nothing in the project


def test_g_is_short_for_global(work, tmp_path):
    assert main(["skills", "add", "-g"]) == 0
    assert (tmp_path / "home" / ".agents" / "skills" / "openenv-cli" / "SKILL.md").is_file()


def test_dest_writes_only_dest_openenv_cli(work, tmp_path, capsys):
    text = preview(capsys)
    assert main(["skills", "add", "--dest", str(tmp_path / "mine")]) == 0
    assert (tmp_path / "mine" / "openenv-cli" / "SKILL.md").read_text() == text
    assert files_under(tmp_path / "mine") == ["openenv-cli", "openenv-cli/SKILL.md"]
    assert files_under(work) == [] and files_under(tmp_path / "home") == []


@pytest.mark.parametrize("other", ["--claude", "--codex", "--cursor", "--opencode", "--global", "-g"])
def test_dest_refuses_agent_flags_and_global(work, tmp_path, capsys, other):
    assert main(["skills", "add", "--dest", str(tmp_path / "mine"), other]) == 1
    error = capsys.readouterr().err
    assert "Error: --dest cannot be combined with" in error
    assert ("--global" if other == "-g" else other) in error
    assert not (tmp_path / "mine").exists() and files_under(work) == [] and files_under(tmp_path / "home") == []


def test_an_existing_skill_is_refused_and_left_alone_without_force(work, capsys):
    assert main(["skills", "add"]) == 0
    skill = work / ".agents" / "skills" / "openenv-cli" / "SKILL.md"
    skill.write_text("my own notes")
    capsys.readouterr()
    assert main(["skills", "add"]) == 1
    folder = work / ".agents" / "skills" / "openenv-cli"
    assert f"Skill already exists at {folder}. Re-run with --force to overwrite." in capsys.readouterr().err
    assert skill.read_text() == "my own notes"


def test_an_agents_own_skill_of_that_name_stops_everything_without_force(work, capsys):
    mine = work / ".claude" / "skills" / "openenv-cli"
    mine.mkdir(parents=True)
    (mine / "SKILL.md").write_text("someone else's")
    assert main(["skills", "add", "--codex", "--claude"]) == 1
    assert f"Skill already exists at {mine}." in capsys.readouterr().err
    assert (mine / "SKILL.md").read_text() == "someone else's"
    assert files_under(work) == [
        ".claude",
        ".claude/skills",
        ".claude/skills/openenv-cli",
        ".claude/skills/openenv-cli/SKILL.md",
    ]


def test_force_replaces_the_skill_and_the_links(work, tmp_path, capsys):
    text = preview(capsys)
    folder = work / ".agents" / "skills" / "openenv-cli"
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text("stale")
    (folder / "extra.txt").write_text("left from before")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (work / ".claude" / "skills").mkdir(parents=True)
    (work / ".claude" / "skills" / "openenv-cli").symlink_to(elsewhere)
    assert main(["skills", "add", "--claude", "--force"]) == 0
    assert (folder / "SKILL.md").read_text() == text and not (folder / "extra.txt").exists()
    assert (work / ".claude" / "skills" / "openenv-cli").resolve() == folder.resolve()
    assert elsewhere.is_dir()  # a link is replaced, never followed


def test_a_bare_skills_shows_its_commands(capsys):
    assert main(["skills"]) == 0
    help_text = capsys.readouterr().out
    assert "preview" in help_text and "add" in help_text and "openenv skills COMMAND --help" in help_text


# --- shipped with the package ----------------------------------------------------------------


def test_the_wheel_carries_the_skill(tmp_path):
    """The template is package data: a wheel built from this tree has it, and its CLI prints the
    same skill as this checkout's."""
    source = tmp_path / "openenv-src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--skip-dependency-check",
            "--outdir",
            str(tmp_path / "dist"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    unpacked = tmp_path / "unpacked"
    with zipfile.ZipFile(wheel) as archive:
        assert "openenv/cli/templates/skills/SKILL.md.tmpl" in archive.namelist()
        archive.extractall(unpacked)
    env = {**os.environ, "PYTHONPATH": str(unpacked)}  # the wheel's openenv, ahead of this checkout's
    from_wheel = subprocess.run(
        [sys.executable, "-m", "openenv.cli", "skills", "preview"], capture_output=True, text=True, env=env, timeout=60
    )
    here = subprocess.run(
        [sys.executable, "-m", "openenv.cli", "skills", "preview"], capture_output=True, text=True, timeout=60
    )
    assert from_wheel.returncode == 0, from_wheel.stderr
    assert from_wheel.stdout == here.stdout
