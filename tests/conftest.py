from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from typing import Any, Iterator

import pytest

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.serving.runner import BackgroundServer

from .envs import TRACKER, CounterAction, CounterEnv, CounterObservation, CounterState

# A deployment's settings in the shell running the tests (a token exported for `openenv serve`)
# would change what every in-process server answers: the tests set them where they mean to.
for _setting in ("OPENENV_AUTH_TOKEN", "OPENENV_ERROR_DETAILS", "ENABLE_WEB_INTERFACE"):
    os.environ.pop(_setting, None)


@contextlib.contextmanager
def serve(app: Any, uds: bool = False, **overrides: Any) -> Iterator[BackgroundServer]:
    """A real uvicorn server for ``app`` on 127.0.0.1 (or a Unix socket); ``overrides`` go to
    uvicorn's config."""
    if uds:
        with tempfile.TemporaryDirectory(prefix="openenv-test-") as tmp:
            with BackgroundServer(app, uds=os.path.join(tmp, "env.sock"), **overrides) as server:
                yield server
    else:
        with BackgroundServer(app, **overrides) as server:
            yield server


def counter_app(env: Any = CounterEnv, **kwargs: Any) -> Any:
    kwargs.setdefault("max_concurrent_envs", 4)
    return create_app(env, CounterAction, CounterObservation, env_name="counter", state_cls=CounterState, **kwargs)


_COMPRESSION = {"offer": "deflate"}


@pytest.fixture(params=["deflate", None], ids=["deflate", "plain"])
def compression_offer(request: Any) -> Any:
    """Runs a WebSocket test twice: with clients offering compression (the server then frames
    every message with websockets' own machinery) and without (the server's own framing,
    ``ws_frames``). Use it with :func:`connect`."""
    _COMPRESSION["offer"] = request.param
    yield request.param
    _COMPRESSION["offer"] = "deflate"


def connect(*args: Any, **kwargs: Any) -> Any:
    """``websockets.asyncio.client.connect``, offering compression as :func:`compression_offer`
    says (websockets' own default otherwise)."""
    from websockets.asyncio.client import connect as ws_connect

    kwargs.setdefault("compression", _COMPRESSION["offer"])
    return ws_connect(*args, **kwargs)


def pytest_collection_modifyitems(items: Any) -> None:
    """Skip the tests of what relies on a library's internals where that is not used (with
    ``OPENENV_LIBRARY_INTERNALS=0``, or on a release past the tested ones): the server then runs
    on the library's public API, and the rest of the suite says it still works."""
    from openenv.core.env_server._compat import fastmcp as fastmcp_compat
    from openenv.core.env_server._compat import uvicorn as uvicorn_compat

    used = {
        "uvicorn": uvicorn_compat.tested(),
        "uvicorn-guard": uvicorn_compat.guard_tested(),
        "fastmcp": fastmcp_compat.tested(),
    }
    for item in items:
        for mark in item.iter_markers("internals"):
            library = mark.args[0] if mark.args else "uvicorn"
            if not used[library]:
                item.add_marker(pytest.mark.skip(reason=f"tests what relies on {library}'s internals, not used here"))


@pytest.fixture(autouse=True)
def _reset_tracker() -> None:
    TRACKER.reset()


@pytest.fixture
def counter_server() -> Iterator[BackgroundServer]:
    with serve(counter_app()) as server:
        yield server


async def until(predicate: Any, timeout: float = 5.0) -> None:
    """Wait for ``predicate()`` to hold (server-side cleanup runs in the background)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout:.1f} s")
        await asyncio.sleep(0.02)
