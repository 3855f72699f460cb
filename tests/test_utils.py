"""URL helpers shared by clients and providers."""

from __future__ import annotations

import asyncio

import pytest

from openenv.core.utils import convert_to_ws_url, hf_space_subdomain, parse_endpoint, run_async_safely


@pytest.mark.parametrize(
    "url, ws",
    [
        ("http://localhost:8000", "ws://localhost:8000"),
        ("http://localhost:8000/", "ws://localhost:8000"),
        ("https://org-env.hf.space", "wss://org-env.hf.space"),
        ("localhost:8000", "ws://localhost:8000"),
        ("http://host:1/prefix/", "ws://host:1/prefix"),
        ("ws://host:2", "ws://host:2"),
    ],
)
def test_convert_to_ws_url(url, ws):
    assert convert_to_ws_url(url) == ws


def test_unix_socket_endpoint():
    endpoint = parse_endpoint("unix:///tmp/env.sock")
    assert (endpoint.uds, endpoint.http_url, endpoint.ws_url, endpoint.is_loopback) == (
        "/tmp/env.sock",
        "http://localhost",
        "ws://localhost",
        True,
    )
    with pytest.raises(ValueError, match="absolute path"):
        parse_endpoint("unix://relative.sock")


def test_loopback_detection():
    assert parse_endpoint("http://127.0.0.1:9").is_loopback
    assert parse_endpoint("http://localhost:9").is_loopback
    assert not parse_endpoint("https://example.org").is_loopback


def test_hf_space_subdomain():
    """Spec §12.15: lower-cased repo id, every non-alphanumeric character a dash."""
    assert hf_space_subdomain("OpenEnv/Echo_Env") == "openenv-echo-env"
    assert hf_space_subdomain("org/my.env-2") == "org-my-env-2"


def test_run_async_safely_from_sync_code_and_from_a_running_loop():
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    assert run_async_safely(answer()) == 42

    async def inside() -> int:
        return run_async_safely(answer())  # a loop is running in this thread

    assert asyncio.run(inside()) == 42
