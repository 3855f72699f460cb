"""The environments and apps the benchmarks serve, and the raw-websockets floor server.

python bench/apps.py <name> <port>      # name: sync | loop | async | echo | floor | floor-echo
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any, Optional

from fastapi import WebSocket

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

MAX_SESSIONS = 2048
ROLES_TOKEN = "bench-orchestrator-token-0123456789"


class PingAction(Action):
    message: str = ""
    sleep_s: float = 0.0


class PingObservation(Observation):
    echoed: str = ""


class TrivialEnv(Environment[PingAction, PingObservation, State]):
    """Echoes the action's message: the cheapest possible environment."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id="bench", step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> PingObservation:
        self._state = State(episode_id="bench", step_count=0)
        return PingObservation(echoed="ready", reward=0.0)

    def step(self, action: PingAction, timeout_s: Optional[float] = None, **kwargs: Any) -> PingObservation:
        if action.sleep_s:
            time.sleep(action.sleep_s)
        return self._advance(action)

    def _advance(self, action: PingAction) -> PingObservation:
        self._state.step_count += 1
        return PingObservation(echoed=action.message, reward=1.0)

    @property
    def state(self) -> State:
        return self._state


class LoopTrivialEnv(TrivialEnv):
    """The same sync environment, called on the server's event loop (it opted in)."""

    RUNS_ON_EVENT_LOOP = True


class AsyncTrivialEnv(TrivialEnv):
    """The same environment written async: it runs on the server's event loop."""

    async def reset_async(
        self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any
    ) -> PingObservation:
        return self.reset(seed, episode_id)

    async def step_async(self, action: PingAction, timeout_s: Optional[float] = None, **kwargs: Any) -> PingObservation:
        if action.sleep_s:
            await asyncio.sleep(action.sleep_s)
        return self._advance(action)


def null_app() -> Any:
    """A FastAPI WebSocket route answering a fixed frame: uvicorn + Starlette, no OpenEnv."""
    from fastapi import FastAPI

    app = FastAPI()
    reply = json.dumps(TRIVIAL_REPLY, separators=(",", ":"))

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await websocket.accept()
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            json.loads(message["text"])
            await websocket.send({"type": "websocket.send", "text": reply})

    return app


def make_app(name: str) -> Any:
    from fastapi import FastAPI

    from openenv.core.env_server.http_server import create_app

    if name == "null":
        return null_app()
    if name == "echo":
        os.environ["MAX_CONCURRENT_ENVS"] = str(MAX_SESSIONS)
        from echo_env.server.app import app
    elif name == "sync-roles":  # with roles: every step carries the orchestrator's principal through the table
        app = create_app(
            TrivialEnv,
            PingAction,
            PingObservation,
            max_concurrent_envs=MAX_SESSIONS,
            auth_token=ROLES_TOKEN,
            grader_token=ROLES_TOKEN[::-1],
        )
    else:
        env = {"sync": TrivialEnv, "loop": LoopTrivialEnv, "async": AsyncTrivialEnv}[name]
        app = create_app(env, PingAction, PingObservation, max_concurrent_envs=MAX_SESSIONS)
    assert isinstance(app, FastAPI)

    @app.post("/_bench/gc")
    async def collect() -> dict:
        import gc

        collected = gc.collect()
        objects = gc.get_objects()
        kinds: dict = {}
        for obj in objects:
            kinds[type(obj).__name__] = kinds.get(type(obj).__name__, 0) + 1
        top = dict(sorted(kinds.items(), key=lambda kv: -kv[1])[:12])
        return {"collected": collected, "tracked": len(objects), "by_type": top}

    @app.get("/_bench/sessions")
    async def sessions() -> dict:
        server = app.state.openenv_server
        return {
            "active": server.active_sessions,
            "stuck_workers": server.manager.pool.stuck,
            "threads": server.manager.pool.threads,
        }

    return app


# --- the floor: a raw websockets server doing the same JSON round trip ------------------------

TRIVIAL_REPLY = {
    "type": "observation",
    "data": {"observation": {"metadata": {}, "echoed": ""}, "reward": 1.0, "done": False},
}


def echo_reply(message: str) -> dict:
    """The frame the echo environment sends for an echo_message call, same keys and sizes."""
    result = {
        "content": [{"type": "text", "text": message}],
        "structured_content": {"result": message},
        "meta": {"fastmcp": {"wrap_result": True}},
        "data": message,
        "is_error": False,
    }
    observation = {"metadata": {}, "tool_name": "echo_message", "result": result, "error": None}
    return {"type": "observation", "data": {"observation": observation, "reward": 0.1 * len(message), "done": False}}


async def floor_handler(ws: Any, echo: bool) -> None:
    from websockets.exceptions import ConnectionClosed

    try:
        await _floor_loop(ws, echo)
    except ConnectionClosed:
        pass


async def _floor_loop(ws: Any, echo: bool) -> None:
    async for text in ws:
        message = json.loads(text)
        data = message.get("data") or {}
        if echo:
            reply = echo_reply(str((data.get("arguments") or {}).get("message", "")))
        else:
            reply = {
                "type": "observation",
                "data": {
                    "observation": {"metadata": {}, "echoed": data.get("message", "")},
                    "reward": 1.0,
                    "done": False,
                },
            }
        await ws.send(json.dumps(reply, separators=(",", ":")))


async def serve_floor(port: int, echo: bool, uds: Optional[str] = None) -> None:
    from websockets.asyncio.server import serve, unix_serve

    handler = lambda ws: floor_handler(ws, echo)  # noqa: E731
    if uds:
        async with unix_serve(handler, uds, compression=None, max_size=2**28):
            await asyncio.Future()
    async with serve(handler, "127.0.0.1", port, compression=None, max_size=2**28):
        await asyncio.Future()


def switch_off(parts: str) -> None:
    """Turn fast paths off in this process, for A/B runs of bench_ws (``BENCH_OFF=a,b``): ``plain``
    (reading whole small frames without websockets' parser), ``sendnow`` (writing answers without
    the ASGI send), ``direct`` (FastMCP's
    call_tool for every tool call)."""
    from openenv.core.env_server._compat import uvicorn as ws_protocol

    for part in filter(None, parts.split(",")):
        if part == "plain":
            ws_protocol.OpenEnvWebSocketProtocol._between_frames = lambda self: False
        elif part == "sendnow":
            ws_protocol.OpenEnvWebSocketProtocol.send_text_now = lambda self, text: False
        elif part == "direct":
            from openenv.core.env_server._compat import fastmcp as mcp_direct

            mcp_direct.DirectTools._eligible_key = lambda self: None
        else:
            raise SystemExit(f"BENCH_OFF: unknown part {part!r}")


def main() -> None:
    switch_off(os.environ.get("BENCH_OFF", ""))
    name, address = sys.argv[1], sys.argv[2]  # a port, or the path of a Unix socket
    uds = address if not address.isdigit() else None
    port = int(address) if uds is None else 0
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    if name.startswith("floor"):
        asyncio.run(serve_floor(port, echo=name == "floor-echo", uds=uds))
        return
    from openenv.core.env_server.serving.runner import run_server

    if os.environ.get("BENCH_GC"):
        import gc

        values = os.environ["BENCH_GC"].split(",")
        if values[0] == "freeze":
            gc.freeze()
            values = values[1:]
        if values:
            gc.set_threshold(*(int(x) for x in values))
    loop = os.environ.get("BENCH_LOOP", "auto")
    if uds:
        run_server(make_app(name), uds=uds, log_level="warning", access_log=False, loop=loop)
    else:
        run_server(make_app(name), port=port, log_level="warning", access_log=False, loop=loop)


if __name__ == "__main__":
    main()
