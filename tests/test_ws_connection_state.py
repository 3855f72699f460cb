"""The ``/ws`` connection's state (transports.ws.ConnectionState) on a live server: the moves a
connection makes for each way it can end, and that an invalid move is refused."""

from __future__ import annotations

import asyncio
import json
from typing import Any, List

import pytest

from openenv.core.env_server.transports import ws as ws_transport
from openenv.core.env_server.transports.ws import ConnectionState, WSConnection

from .conftest import connect, counter_app, serve

S = ConnectionState


@pytest.fixture
def moves(monkeypatch) -> List[List[ConnectionState]]:
    """Every connection's moves, in order (the real method still runs)."""
    seen: dict = {}
    real = WSConnection._move

    def spy(self: WSConnection, new: ConnectionState) -> None:
        real(self, new)
        seen.setdefault(id(self), []).append(new)

    monkeypatch.setattr(WSConnection, "_move", spy)
    return seen  # type: ignore[return-value]


def ws_url(server: Any) -> str:
    return server.base_url.replace("http://", "ws://") + "/ws"


async def ask(ws: Any, message: Any) -> dict:
    await ws.send(json.dumps(message))
    return json.loads(await asyncio.wait_for(ws.recv(), 10))


async def until(predicate: Any) -> None:
    for _ in range(500):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_a_close_message_closes_from_the_server_side(moves) -> None:
    with serve(counter_app()) as server:
        async with connect(ws_url(server)) as ws:
            await ask(ws, {"type": "reset", "data": {}})
            await ws.send(json.dumps({"type": "close"}))
            await asyncio.wait_for(ws.wait_closed(), 10)
        await until(lambda: any(m[-1] is S.CLOSED for m in moves.values()))
    assert list(moves.values()) == [[S.OPEN, S.CLOSING, S.CLOSED]]


async def test_a_client_that_leaves_is_gone_then_closed(moves) -> None:
    with serve(counter_app()) as server:
        async with connect(ws_url(server)) as ws:
            await ask(ws, {"type": "reset", "data": {}})
        await until(lambda: any(m[-1] is S.CLOSED for m in moves.values()))
    assert list(moves.values()) == [[S.OPEN, S.GONE, S.CLOSED]]


async def test_a_client_that_leaves_mid_step_is_gone_then_closed(moves) -> None:
    with serve(counter_app()) as server:
        ws = await connect(ws_url(server))
        await ask(ws, {"type": "reset", "data": {}})
        await ws.send(json.dumps({"type": "step", "data": {"sleep_s": 0.5}}))
        await asyncio.sleep(ws_transport.WATCH_AFTER_S * 3)  # the step runs: the watcher reads
        await ws.close()
        await until(lambda: any(m[-1] is S.CLOSED for m in moves.values()))
    assert list(moves.values()) == [[S.OPEN, S.GONE, S.CLOSED]]


async def test_a_refused_session_closes_during_the_handshake(moves) -> None:
    with serve(counter_app(max_concurrent_envs=1)) as server:
        async with connect(ws_url(server)) as first:
            await ask(first, {"type": "reset", "data": {}})
            async with connect(ws_url(server)) as second:
                refusal = json.loads(await asyncio.wait_for(second.recv(), 10))
                assert refusal["data"]["code"] == "CAPACITY_REACHED"
                await asyncio.wait_for(second.wait_closed(), 10)
                assert second.close_code == 1013
            await until(lambda: sum(m[-1] is S.CLOSED for m in moves.values()) == 1)
            assert [S.CLOSING, S.CLOSED] in list(moves.values())


def test_an_invalid_move_is_refused() -> None:
    connection = WSConnection.__new__(WSConnection)
    connection.state = S.CLOSED
    with pytest.raises(RuntimeError, match="closed -> open"):
        WSConnection._move(connection, S.OPEN)
