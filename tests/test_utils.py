"""Helpers shared by clients and providers: URLs, running coroutines, timeouts."""

from __future__ import annotations

import asyncio

import pytest

from openenv.core.utils import convert_to_ws_url, hf_space_subdomain, parse_endpoint, run_async_safely, within


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


@pytest.mark.parametrize(
    "url", ["http://127.0.0.2:9", "http://[::1]:9", "http://[::ffff:127.0.0.1]:9", "http://0.0.0.0:9", "http://[::]:9"]
)
def test_loopback_and_unspecified_addresses_count_as_this_host(url):
    assert parse_endpoint(url).is_loopback


@pytest.mark.parametrize(
    "url", ["http://10.0.0.1:9", "http://[::ffff:10.0.0.1]:9", "http://127.example.org", "http://[2001:db8::1]"]
)
def test_other_hosts_are_not_loopback(url):
    assert not parse_endpoint(url).is_loopback


def test_certainly_local_leaves_out_what_only_probably_is():
    """What may receive a secret meant for this machine's servers: no *.localhost names (DNS may
    answer them), no all-interfaces addresses."""
    from openenv.core.utils import is_local_host, is_loopback_ip

    local = [
        "unix:///tmp/env.sock",
        "http://localhost:1",
        "http://127.0.0.9:1",
        "http://[::1]:1",
        "http://[::ffff:127.0.0.1]:1",
    ]
    elsewhere = [
        "http://env.localhost:1",
        "http://0.0.0.0:1",
        "http://[::]:1",
        "http://10.0.0.1:1",
        "https://x.hf.space",
    ]
    assert [parse_endpoint(url).is_certainly_local for url in local] == [True] * len(local)
    assert [parse_endpoint(url).is_certainly_local for url in elsewhere] == [False] * len(elsewhere)
    assert is_local_host("localhost") and not is_loopback_ip("localhost")  # a name is no IP address
    assert is_loopback_ip("::ffff:127.1.2.3") and not is_loopback_ip("unknown")


@pytest.mark.parametrize("url", ["http://h:9/?token=abc", "http://h:9/x#frag", "ws://h:9?x=1"])
def test_a_base_url_with_a_query_or_fragment_is_refused_not_silently_cut(url):
    with pytest.raises(ValueError, match="query string or fragment"):
        parse_endpoint(url)


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


def test_within_times_out_with_an_error_both_kinds_of_timeout_catch():
    async def main() -> None:
        assert await within(asyncio.sleep(0, "done"), 5) == "done"
        assert await within(asyncio.sleep(0, "done"), None) == "done"
        with pytest.raises(TimeoutError):
            await within(asyncio.sleep(10), 0.01)
        with pytest.raises(asyncio.TimeoutError):
            await within(asyncio.sleep(10), 0.01)

    asyncio.run(asyncio.wait_for(main(), 10))


def test_within_never_loses_a_cancellation_that_races_the_result():
    # asyncio.wait_for on Python 3.11 returns the result when the awaited call finishes in the
    # same loop iteration as the caller is cancelled, and the cancellation is gone: a Ctrl-C that
    # lands just as a reply arrives goes unnoticed. within() must let it through.
    async def race() -> str:
        loop = asyncio.get_running_loop()
        reply = loop.create_future()
        caller = asyncio.ensure_future(within(reply, 30))
        await asyncio.sleep(0)  # the caller now waits for the reply
        reply.set_result("reply")
        caller.cancel()
        try:
            await caller
        except asyncio.CancelledError:
            return "cancelled"
        return "cancellation lost"

    async def main() -> None:
        for _ in range(20):
            assert await race() == "cancelled"

    asyncio.run(asyncio.wait_for(main(), 10))


def test_a_number_from_the_environment_is_read_or_refused_by_name(monkeypatch):
    from openenv.core.utils import number_from_env

    monkeypatch.delenv("OPENENV_TEST_NUMBER", raising=False)
    assert number_from_env("OPENENV_TEST_NUMBER", "seconds") is None
    monkeypatch.setenv("OPENENV_TEST_NUMBER", "  ")
    assert number_from_env("OPENENV_TEST_NUMBER", "seconds") is None
    monkeypatch.setenv("OPENENV_TEST_NUMBER", " 2.5 ")
    assert number_from_env("OPENENV_TEST_NUMBER", "seconds") == 2.5
    monkeypatch.setenv("OPENENV_TEST_NUMBER", "soon")
    with pytest.raises(ValueError, match="OPENENV_TEST_NUMBER must be a number of seconds, got 'soon'"):
        number_from_env("OPENENV_TEST_NUMBER", "seconds")
