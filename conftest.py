"""Runs every Python snippet of README.md and docs/*.md as a user would paste it: each block on
its own, as a fresh ``python`` process started in the repository root. A snippet that talks to
``http://127.0.0.1:8000`` (the quick-start's echo server) is pointed at an echo server that a
fixture starts on a free port instead; everything else it needs (a sandbox, a server of its
own) it starts itself, as the reader would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
from sybil import Sybil
from sybil.parsers.markdown import CodeBlockParser

ROOT = Path(__file__).resolve().parent
DOCS_URL = "http://127.0.0.1:8000"
SNIPPET_TIMEOUT_S = 180


@pytest.fixture(scope="session")
def echo_url() -> Iterator[str]:
    """A real echo environment server on 127.0.0.1, for the snippets that use one.

    It serves an app of its own, built as ``echo_env.server.app`` builds its ``app``: tests that
    run in this process between two snippets serve that module's app and stop it, which closes
    the app's sessions for every server of it."""
    from echo_env.models import EchoObservation
    from echo_env.server.echo_environment import EchoEnvironment

    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
    from openenv.core.env_server.serving.runner import BackgroundServer

    app = create_app(
        EchoEnvironment, CallToolAction, CallToolObservation, env_name="echo_env", reset_observation_cls=EchoObservation
    )
    with BackgroundServer(app) as server:
        yield server.base_url


def _run_snippet(example: Any) -> None:
    source = example.parsed
    if DOCS_URL in source:
        source = source.replace(DOCS_URL, example.namespace["echo_url"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENENV_")}
    done = subprocess.run(
        [sys.executable, "-"],
        input=source,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=SNIPPET_TIMEOUT_S,
    )
    if done.returncode != 0:
        where = f"{Path(example.path).relative_to(ROOT)}, line {example.line}"
        raise AssertionError(f"the snippet at {where} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")


pytest_collect_file = Sybil(
    parsers=[CodeBlockParser(language="python", evaluator=_run_snippet)],
    patterns=["README.md", "docs/*.md"],
    fixtures=["echo_url"],
).pytest()
