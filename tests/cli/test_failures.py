"""How the ``openenv`` command fails: Ctrl-C, an unexpected exception and messages that carry
brackets each end in one plain line on stderr and a non-zero exit code (a traceback only when
asked for). Run as a user runs it: a real ``python -m openenv.cli`` process."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

from openenv.cli._common import styled

DICE = Path(__file__).resolve().parent / "fixtures" / "dice_env"
HINT = "(for the traceback: openenv --debug, or OPENENV_DEBUG=1)"


def openenv_cli(*args: str, env: Optional[dict] = None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "openenv.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_COLOR": "1", **(env or {})},
        **kwargs,
    )


@pytest.fixture
def silent_server() -> Iterator[socket.socket]:
    """A TCP port that accepts connections (the kernel completes them) and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    yield listener
    listener.close()


def sigint_as_a_terminal_gives_it() -> None:
    """In the child: SIGINT handled by default. A shell starts background jobs (``make test &``)
    with SIGINT ignored, and Python then keeps ignoring it: the Ctrl-C under test would not come."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt_a_waiting_validate(listener: socket.socket, env: Optional[dict] = None) -> subprocess.Popen:
    """``openenv validate URL`` waiting on a server that never answers, then Ctrl-C (SIGINT)."""
    port = listener.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "openenv.cli", "validate", f"http://127.0.0.1:{port}", "--timeout", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NO_COLOR": "1", **(env or {})},
        preexec_fn=sigint_as_a_terminal_gives_it,
    )
    # Its request is in flight once its connection waits in the listener's queue.
    readable, _, _ = select.select([listener], [], [], 60)
    assert readable, "validate never connected"
    process.send_signal(signal.SIGINT)
    process.wait(timeout=60)
    return process


def stderr_lines(process: subprocess.Popen) -> List[str]:
    assert process.stderr is not None
    return process.stderr.read().splitlines()


# --- Ctrl-C -------------------------------------------------------------------------------------


def test_ctrl_c_during_a_long_command_ends_it_with_one_line_and_exit_130(silent_server):
    process = interrupt_a_waiting_validate(silent_server)
    lines = stderr_lines(process)
    assert process.returncode == 130, lines
    assert lines[-1] == "Interrupted."
    assert not any("Traceback" in line for line in lines)
    assert process.stdout is not None and process.stdout.read() == ""  # no report of checks it never finished


def test_debug_shows_where_ctrl_c_stopped_the_command(silent_server):
    process = interrupt_a_waiting_validate(silent_server, env={"OPENENV_DEBUG": "1"})
    lines = stderr_lines(process)
    assert process.returncode == 130
    assert "Interrupted here:" in lines and lines[-1] == "Interrupted."
    assert any(line.strip().startswith('File "') for line in lines)


# A Ctrl-C that lands inside a constructor leaves a half-built object whose __del__ fails later
# (asyncio's _SelectorSocketTransport without its _closing, as seen here); the same, made sure of.
HALF_BUILT = textwrap.dedent(
    """
    import os, signal, sys

    from openenv.cli.__main__ import app, main


    class Transport:
        def __init__(self):
            self.me = self  # in a cycle: collected by the collector, not at once
            os.kill(os.getpid(), signal.SIGINT)
            self._closing = False

        def __del__(self):
            if not self._closing:
                pass


    @app.command("connect")
    def connect() -> None:
        Transport()


    sys.exit(main(sys.argv[1:]))
    """
)


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
def test_what_a_ctrl_c_leaves_half_built_does_not_print_after_the_last_line(debug):
    result = subprocess.run(
        [sys.executable, "-c", HALF_BUILT, "connect"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NO_COLOR": "1", "OPENENV_DEBUG": "1" if debug else "0"},
        preexec_fn=sigint_as_a_terminal_gives_it,
    )
    assert result.returncode == 130, result.stderr
    lines = result.stderr.splitlines()
    if debug:  # --debug shows everything, the leftover's complaint included
        assert any("has no attribute '_closing'" in line for line in lines), lines
    else:
        assert lines == ["Interrupted."]


# --- an unexpected exception --------------------------------------------------------------------

# The real entry point, with one more command that fails the way a bug would.
EXPLODING = textwrap.dedent(
    """
    import sys

    from openenv.cli.__main__ import app, main


    @app.command("explode")
    def explode() -> None:
        raise RuntimeError("the disk [hub] caught fire")


    sys.exit(main(sys.argv[1:]))
    """
)


def run_exploding(*args: str, env: Optional[dict] = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", EXPLODING, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NO_COLOR": "1", **(env or {})},
    )


def test_an_unexpected_exception_is_one_line_that_says_how_to_see_more(monkeypatch):
    monkeypatch.delenv("OPENENV_DEBUG", raising=False)
    result = run_exploding("explode")
    assert result.returncode == 1
    assert result.stderr == f"Error: unexpected RuntimeError: the disk [hub] caught fire {HINT}\n"


@pytest.mark.parametrize(
    ("args", "env"), [(["--debug", "explode"], {}), (["explode"], {"OPENENV_DEBUG": "1"})], ids=["--debug", "env"]
)
def test_debug_shows_the_traceback_of_an_unexpected_exception(args, env):
    result = run_exploding(*args, env=env)
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert ", in explode\nRuntimeError: the disk [hub] caught fire\n" in result.stderr
    assert result.stderr.splitlines()[-1] == "Error: unexpected RuntimeError: the disk [hub] caught fire"


# --- brackets in messages -----------------------------------------------------------------------


def test_an_install_hint_keeps_its_extra(tmp_path):
    """``openenv push`` without the Hub library says which extra brings it."""
    hidden = tmp_path / "no-hub" / "huggingface_hub"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text('raise ImportError("huggingface_hub is hidden from this process")\n')
    path = os.pathsep.join(filter(None, [str(hidden.parent), os.environ.get("PYTHONPATH")]))
    result = openenv_cli("push", str(DICE), "--repo-id", "me/dice", env={"PYTHONPATH": path})
    assert result.returncode == 1
    assert result.stderr.strip() == "Error: huggingface_hub is not installed: pip install 'openenv[hub]'"


@pytest.mark.parametrize("name", ["x[hub]", "x[/]", "x[bold]"])
def test_a_name_with_brackets_is_quoted_as_typed(tmp_path, name):
    result = openenv_cli("init", name, "--output-dir", str(tmp_path))
    assert result.returncode == 1
    assert result.stderr.startswith(f"Error: {name!r} cannot be an environment name")


def test_a_path_with_brackets_is_quoted_as_typed(tmp_path):
    result = openenv_cli("serve", str(tmp_path / "envs[dev]"))
    assert result.returncode == 1
    assert f"{tmp_path / 'envs[dev]'} is not a directory" in result.stderr


def test_styled_fills_in_values_as_plain_text_in_the_templates_style():
    text = styled("[bold]{}[/] at {}", "a[/]b", "[hub]")
    assert text.plain == "a[/]b at [hub]"
    assert [(span.start, span.end, str(span.style)) for span in text.spans] == [(0, 5, "bold")]
