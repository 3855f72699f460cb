"""Session snapshots: fork, snapshot and restore over every transport, and the attacks on them.

Real servers on 127.0.0.1 (uvicorn), real clients; the environments are plain Python classes of
this module with seeded randomness, so that a continuation that is not exact shows.
"""

from __future__ import annotations

import asyncio
import base64
import random
import threading
from typing import Any, List, Optional

import httpx
import pytest
from fastmcp import Context, FastMCP

from openenv.core.client_errors import (
    CapacityReachedError,
    NotSupportedError,
    SnapshotRefusedError,
)
from openenv.core.client_types import Snapshot
from openenv.core.env_server.exceptions import SnapshotUnsupportedError
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.snapshot_data import UnsavableError, decode, encode
from openenv.core.env_server.types import Action, Observation, State
from openenv.core.generic_client import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient

from .conftest import serve


class DiceAction(Action):
    bet: int = 1


class DiceObservation(Observation):
    roll: int = 0
    total: int = 0
    history: List[int] = []


class DiceState(State):
    total: int = 0


class DiceEnv(Environment[DiceAction, DiceObservation, DiceState]):
    """Rolls a seeded die each step: the reward depends on the generator's hidden state, so a
    fork that did not carry it would diverge at once."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    SUPPORTS_SNAPSHOT = True

    def __init__(self) -> None:
        super().__init__()
        self.rng = random.Random(0)
        self.total = 0
        self.history: List[int] = []
        self._state = DiceState(episode_id=None, step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> DiceObservation:
        self.rng = random.Random(seed)
        self.total = 0
        self.history = []
        self._state = DiceState(episode_id=episode_id or "e", step_count=0)
        return DiceObservation(done=False, reward=0.0)

    def step(self, action: DiceAction, timeout_s: Optional[float] = None, **kwargs: Any) -> DiceObservation:
        roll = self.rng.randint(1, 6)
        self.total += roll * action.bet
        self.history.append(roll)
        self._state.step_count += 1
        self._state.total = self.total
        reward = float(roll == 6) + self.rng.random()
        return DiceObservation(
            done=self._state.step_count >= 100, reward=reward, roll=roll, total=self.total, history=list(self.history)
        )

    @property
    def state(self) -> DiceState:
        return self._state


class CoinEnv(DiceEnv):
    """Another environment (another class): a DiceEnv snapshot must not load into it."""


class NoSnapshotEnv(DiceEnv):
    SUPPORTS_SNAPSHOT = False


class LockedEnv(DiceEnv):
    """Claims snapshots but holds a lock: refused, naming the attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.guard = threading.Lock()


class PickyEnv(DiceEnv):
    """Saves a session until its total passes 3, then refuses it, saying why (an environment
    whose engine cannot save every position exactly)."""

    def snapshot_state(self) -> Any:
        if self.total > 3:
            raise SnapshotUnsupportedError("PickyEnv cannot save a session past a total of 3: its engine forgets")
        return super().snapshot_state()


class HandleEnv(DiceEnv):
    """Refuses with the codec's own error, as an override that checks what it holds may."""

    def snapshot_state(self) -> Any:
        raise UnsavableError("self.engine", "a native engine")


def dice_app(env: Any = DiceEnv, **kwargs: Any) -> Any:
    kwargs.setdefault("max_concurrent_envs", 16)
    return create_app(env, DiceAction, DiceObservation, env_name="dice", state_cls=DiceState, **kwargs)


def client(url: str) -> GenericEnvClient:
    return GenericEnvClient(base_url=url)


def trace(results: List[Any]) -> List[Any]:
    return [(r.observation["roll"], r.observation["total"], r.reward, r.done) for r in results]


KEY = "test-key-0123456789"


async def _play(env: Any, bets: List[int]) -> List[Any]:
    return [await env.step({"bet": bet}) for bet in bets]


def test_fork_into_eight_continues_exactly_and_forks_do_not_touch_each_other() -> None:
    with serve(dice_app()) as server:

        async def main() -> None:
            async with client(server.base_url) as env:
                await env.reset(seed=7)
                await _play(env, [1, 2, 3, 1, 2])  # a seeded prefix
                forks = await env.fork(8)
                assert len(forks) == 8
                following = [2, 1, 3, 1, 1, 2]
                original = trace(await _play(env, following))
                # each fork, given the original's next actions, sees what the original saw
                for fork in forks:
                    assert trace(await _play(fork, following)) == original
                # forks are independent: stepping one leaves the others where they were
                a, b = forks[0], forks[1]
                await _play(a, [3, 3, 3])
                assert (await b.state())["step_count"] == 5 + len(following)
                assert (await a.state())["step_count"] == 5 + len(following) + 3
                # and a fork of different actions diverges from the others
                c = (await env.fork(1))[0]
                assert (await c.state())["step_count"] == 5 + len(following)

        asyncio.run(main())


def test_snapshot_restores_on_a_fresh_server_with_the_same_key_and_not_on_another() -> None:
    async def take() -> tuple:
        with serve(dice_app(snapshot_key=KEY)) as first:
            async with client(first.base_url) as env:
                await env.reset(seed=3)
                await _play(env, [1] * 50)
                snap = await env.snapshot()
                expected = trace(await _play(env, [2, 1, 2]))
        return snap, expected

    snap, expected = asyncio.run(take())
    assert isinstance(snap, Snapshot) and snap.info["env"] == "dice" and snap.info["version"] == 1
    with serve(dice_app(snapshot_key=KEY)) as second:

        async def again() -> None:
            async with client(second.base_url) as env:
                state = await env.restore(snap)
                assert state["step_count"] == 50
                assert trace(await _play(env, [2, 1, 2])) == expected

        asyncio.run(again())
    with serve(dice_app(snapshot_key="another-key-000000")) as other:

        async def refused() -> None:
            async with client(other.base_url) as env:
                await env.reset(seed=1)
                with pytest.raises(SnapshotRefusedError) as info:
                    await env.restore(snap)
                assert info.value.details["reason"] == "forged"
                assert (await env.state())["step_count"] == 0  # nothing was loaded
                await env.step({"bet": 1})  # and it keeps serving

        asyncio.run(refused())


def test_a_changed_byte_is_refused_before_anything_is_loaded() -> None:
    with serve(dice_app()) as server:

        async def main() -> None:
            async with client(server.base_url) as env:
                await env.reset(seed=5)
                await _play(env, [1, 1])
                snap = await env.snapshot()
                await _play(env, [1])
                for where in (len(snap.data) // 2, len(snap.data) - 1, 60):  # body, tail, header
                    changed = bytearray(snap.data)
                    changed[where] ^= 0x01
                    with pytest.raises(SnapshotRefusedError) as info:
                        await env.restore(Snapshot(bytes(changed)))
                    assert info.value.details["reason"] == "forged", where
                    assert (await env.state())["step_count"] == 3
                with pytest.raises(SnapshotRefusedError):
                    await env.restore(Snapshot(b"not a snapshot at all"))
                assert (await env.restore(snap))["step_count"] == 2  # the genuine one still loads

        asyncio.run(main())


def test_the_unchanged_snapshot_loads_where_a_forged_one_is_refused_without_the_check(monkeypatch: Any) -> None:
    """The refusal above is the signature's doing: with the check made to pass, the changed
    snapshot is loaded (the attack works without the mitigation)."""
    from openenv.core.env_server import snapshots

    with serve(dice_app()) as server:

        async def main() -> None:
            async with client(server.base_url) as env:
                await env.reset(seed=5)
                await _play(env, [1, 1])
                snap = await env.snapshot()
                tampered = _tamper_total(snap, 1000)
                with pytest.raises(SnapshotRefusedError):
                    await env.restore(tampered)
                monkeypatch.setattr(snapshots.hmac, "compare_digest", lambda a, b: True)
                state = await env.restore(tampered)
                assert state["total"] == 1000  # the forged state was loaded

        asyncio.run(main())


def _tamper_total(snap: Snapshot, total: int) -> Snapshot:
    """The snapshot with its state's ``total`` changed, and its header and body rebuilt: a
    well-formed snapshot whose signature is no longer right."""
    import json
    import struct
    import zlib

    from openenv.core.env_server.snapshots import MAGIC

    data = snap.data
    start = len(MAGIC) + 32
    (length,) = struct.unpack_from(">I", data, start)
    header = json.loads(data[start + 4 : start + 4 + length])
    tree = json.loads(zlib.decompress(data[start + 4 + length :]))
    state = decode(tree)
    state["total"] = total
    state["_state"].total = total
    body = json.dumps(encode(state)).encode()
    header["size"] = len(body)
    head = json.dumps(header).encode()
    return Snapshot(data[:start] + struct.pack(">I", len(head)) + head + zlib.compress(body))


def test_snapshots_of_another_environment_or_version_are_refused(monkeypatch: Any) -> None:
    with serve(dice_app(snapshot_key=KEY)) as dice, serve(dice_app(CoinEnv, snapshot_key=KEY)) as coin:

        async def main() -> None:
            async with client(dice.base_url) as env:
                await env.reset(seed=1)
                snap = await env.snapshot()
            async with client(coin.base_url) as env:
                await env.reset(seed=2)
                await env.step({"bet": 1})
                with pytest.raises(SnapshotRefusedError) as info:
                    await env.restore(snap)
                assert info.value.details["reason"] == "environment"
                assert "DiceEnv" in str(info.value) and "restore it on a server of that environment" in str(info.value)
                assert (await env.state())["step_count"] == 1
            monkeypatch.setattr(DiceEnv, "SNAPSHOT_VERSION", 2)  # the environment's layout changed since
            async with client(dice.base_url) as env:
                await env.reset(seed=2)
                await env.step({"bet": 1})
                with pytest.raises(SnapshotRefusedError) as info:
                    await env.restore(snap)
                assert info.value.details["reason"] == "version"
                assert (await env.state())["step_count"] == 1

        asyncio.run(main())


def test_a_huge_snapshot_is_refused_and_the_server_keeps_serving(monkeypatch: Any) -> None:
    monkeypatch.setenv("OPENENV_MAX_SNAPSHOT_MB", "1")
    with serve(dice_app()) as server:

        async def main() -> None:
            async with client(server.base_url) as env:
                await env.reset(seed=1)
                huge = Snapshot(b"OPENENV-SNAPSHOT/1\n" + bytes(3 * 1024 * 1024))
                with pytest.raises(SnapshotRefusedError) as info:
                    await env.restore(huge)
                assert info.value.details["reason"] == "too_large"
                assert "OPENENV_MAX_SNAPSHOT_MB" in str(info.value)
                assert (await env.step({"bet": 1})).observation["total"] > 0

        asyncio.run(main())
    with serve(dice_app(BulkyDiceEnv)) as bulky:  # what the server would make is bounded too

        async def made() -> None:
            async with client(bulky.base_url) as env:
                await env.reset(seed=1)
                with pytest.raises(SnapshotRefusedError, match=r"The snapshot made is .* over this server's limit"):
                    await env.snapshot()
                await env.step({"bet": 1})

        asyncio.run(made())


def test_environments_that_cannot_snapshot_say_why() -> None:
    with serve(dice_app(NoSnapshotEnv)) as plain, serve(dice_app(LockedEnv)) as locked:

        async def main() -> None:
            async with client(plain.base_url) as env:
                await env.reset(seed=1)
                with pytest.raises(NotSupportedError, match="SUPPORTS_SNAPSHOT"):
                    await env.snapshot()
                await env.step({"bet": 1})
            async with client(locked.base_url) as env:
                await env.reset(seed=1)
                with pytest.raises(NotSupportedError, match=r"self\.guard holds a lock"):
                    await env.snapshot()
                await env.step({"bet": 1})

        asyncio.run(main())


def test_an_environment_refuses_the_sessions_it_cannot_save_and_they_go_on() -> None:
    with serve(dice_app(PickyEnv)) as picky, serve(dice_app(HandleEnv)) as handle:

        async def main() -> None:
            async with client(picky.base_url) as env:
                await env.reset(seed=1)
                early = await env.snapshot()  # saved while it can be
                await _play(env, [1, 1, 1])
                for refused in (env.snapshot(), env.fork(2)):
                    with pytest.raises(NotSupportedError, match="past a total of 3: its engine forgets"):
                        await refused
                after = trace(await _play(env, [2]))  # the session goes on
                await env.restore(early)
                assert (await env.state())["step_count"] == 0
                assert trace(await _play(env, [1, 1, 1, 2]))[-1] == after[-1]
            async with client(handle.base_url) as env:
                await env.reset(seed=1)
                with pytest.raises(NotSupportedError) as refused:
                    await env.snapshot()
                assert "self.engine holds a native engine" in str(refused.value)
                assert "SNAPSHOT_EXCLUDE" not in str(refused.value)  # no advice meant for the default

        asyncio.run(main())
        with httpx.Client(base_url=picky.base_url) as http:  # a named session, over HTTP and MCP

            def rpc(method: str, **params: Any) -> Any:
                body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
                return http.post("/mcp", json=body).json()

            sid = rpc("openenv/session/create")["result"]["session_id"]
            http.post("/reset", json={"session_id": sid, "seed": 1})
            for _ in range(3):
                http.post("/step", json={"session_id": sid, "action": {"bet": 2}})
            answer = http.post("/openenv/snapshot", json={"session_id": sid})
            assert answer.status_code == 501 and "its engine forgets" in answer.text
            error = rpc("openenv/session/snapshot", session_id=sid)["error"]
            assert error["code"] == -32601 and "its engine forgets" in error["message"]
            assert http.post("/step", json={"session_id": sid, "action": {"bet": 1}}).status_code == 200


def test_fork_that_does_not_fit_keeps_nothing_and_says_so() -> None:
    with serve(dice_app(max_concurrent_envs=3)) as server:

        async def main() -> None:
            async with client(server.base_url) as env:
                await env.reset(seed=1)
                with pytest.raises(CapacityReachedError, match=r"fork\(4\) needs 4 new sessions"):
                    await env.fork(4)
                async with httpx.AsyncClient(base_url=server.base_url) as http:
                    for _ in range(50):  # the forks made are closed (in the background)
                        capacity = (await http.get("/openenv/capacity")).json()
                        if capacity["active_sessions"] == 1:
                            break
                        await asyncio.sleep(0.05)
                    assert capacity["active_sessions"] == 1
                forks = await env.fork(2)  # what fits is forked
                assert [(await f.state())["step_count"] for f in forks] == [0, 0]

        asyncio.run(main())


def test_http_and_mcp_snapshot_and_restore_a_named_session() -> None:
    with serve(dice_app()) as server:
        with httpx.Client(base_url=server.base_url) as http:

            def rpc(method: str, **params: Any) -> Any:
                body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
                return http.post("/mcp", json=body).json()

            sid = rpc("openenv/session/create")["result"]["session_id"]
            http.post("/reset", json={"session_id": sid, "seed": 9})
            for _ in range(3):
                http.post("/step", json={"session_id": sid, "action": {"bet": 2}})
            taken = http.post("/openenv/snapshot", json={"session_id": sid}).json()
            unnamed = {"jsonrpc": "2.0", "id": 1, "method": "openenv/session/snapshot", "params": {}}
            assert "name one (session_id)" in http.post("/mcp", json=unnamed).json()["error"]["message"]
            by_mcp = rpc("openenv/session/snapshot", session_id=sid)["result"]
            assert taken["bytes"] == len(base64.b64decode(taken["snapshot"]))
            after = http.post("/step", json={"session_id": sid, "action": {"bet": 1}}).json()
            # restore over HTTP, then the same step again gives the same answer
            restored = http.post("/openenv/restore", json={"session_id": sid, "snapshot": taken["snapshot"]}).json()
            assert restored["state"]["step_count"] == 3
            again = http.post("/step", json={"session_id": sid, "action": {"bet": 1}}).json()
            assert again == after
            # over MCP too
            state = rpc("openenv/session/restore", session_id=sid, snapshot=by_mcp["snapshot"])["result"]["state"]
            assert state["step_count"] == 3
            assert http.post("/step", json={"session_id": sid, "action": {"bet": 1}}).json() == after
            # a changed snapshot: refused with the code, over both
            bad = base64.b64encode(b"x" + base64.b64decode(taken["snapshot"])[1:]).decode()
            refused = http.post("/openenv/restore", json={"session_id": sid, "snapshot": bad})
            assert refused.status_code == 400 and refused.json()["code"] == "SNAPSHOT_REFUSED"
            error = rpc("openenv/session/restore", session_id=sid, snapshot="not base64!")["error"]
            assert error["data"]["code"] == "SNAPSHOT_REFUSED"


def test_sync_clients_fork_and_restore() -> None:
    with serve(dice_app()) as server:
        with client(server.base_url).sync() as env:
            env.reset(seed=11)
            env.step({"bet": 1})
            snap = env.snapshot()
            forks = env.fork(2)
            expected = trace([env.step({"bet": 3}) for _ in range(3)])
            for fork in forks:
                assert trace([fork.step({"bet": 3}) for _ in range(3)]) == expected
            env.restore(snap)
            assert trace([env.step({"bet": 3}) for _ in range(3)]) == expected


def test_restore_is_applied_once_when_sent_again() -> None:
    """A numbered restore sent again (its answer lost) is answered from the record and not run
    again: here the repeat carries another snapshot, which is not loaded."""
    with serve(dice_app()) as server:
        with httpx.Client(base_url=server.base_url) as http:
            body = {"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create", "params": {}}
            sid = http.post("/mcp", json=body).json()["result"]["session_id"]
            http.post("/reset", json={"session_id": sid, "seed": 1})
            at_start = http.post("/openenv/snapshot", json={"session_id": sid}).json()["snapshot"]
            http.post("/step", json={"session_id": sid, "action": {"bet": 1}})
            after_one = http.post("/openenv/snapshot", json={"session_id": sid}).json()["snapshot"]
            headers = {"X-OpenEnv-Seq": "7"}
            first = http.post("/openenv/restore", json={"session_id": sid, "snapshot": at_start}, headers=headers)
            assert first.json()["state"]["step_count"] == 0
            repeat = http.post("/openenv/restore", json={"session_id": sid, "snapshot": after_one}, headers=headers)
            assert repeat.json() == first.json()
            assert http.get("/state", params={"session_id": sid}).json()["step_count"] == 0


def test_the_default_state_format_carries_python_data_exactly() -> None:
    import collections
    import math

    shared = [1, 2]
    rng = random.Random(4)
    value = {
        "a": shared,
        "b": shared,
        "t": (1, "x", None),
        "s": {1, 2},
        "nan": math.nan,
        "bytes": b"\x00\xff",
        "dq": collections.deque([1], maxlen=3),
        "rng": rng,
        "state": DiceState(episode_id="x", step_count=2, total=5),
        "k": {(1, 2): "tuple key"},
    }
    out = decode(encode(value))
    assert out["a"] is out["b"] and out["a"] == shared
    assert out["rng"].random() == rng.random()
    assert out["state"] == value["state"] and out["k"] == value["k"] and out["dq"].maxlen == 3
    with pytest.raises(UnsavableError, match=r"self\.f holds the function '.*<lambda>'"):
        encode({"f": lambda: 1})


class _Holder:
    def __init__(self, inner: Any) -> None:
        self.inner = inner


def test_a_refusal_names_attributes_as_attributes() -> None:
    # an object's attribute is `.name` in the path, a dict's item `['name']`
    with pytest.raises(UnsavableError, match=r"^self\.env\.inner\['cache'\]\.inner holds a lock"):
        encode({"env": _Holder({"cache": _Holder(threading.Lock())})})


def test_numpy_dtypes_travel_exactly() -> None:
    numpy = pytest.importorskip("numpy")
    structured = numpy.dtype([("x", "<f4"), ("n", ">i2", (2,))])
    value = {"f": numpy.dtype("float32"), "i": numpy.dtype(numpy.int64), "s": structured, "again": structured}
    out = decode(encode(value))
    assert out == value and all(type(out[k]) is type(value[k]) for k in value)
    assert out["s"].fields == structured.fields


class BulkyDiceEnv(DiceEnv):
    """A DiceEnv whose state holds 2 MiB of random bytes (incompressible)."""

    def __init__(self) -> None:
        super().__init__()
        self.blob = random.Random(1).randbytes(2 * 1024 * 1024)


def test_fork_of_a_large_session_waits_for_a_busy_servers_budget(monkeypatch: Any) -> None:
    """Each restore carries the snapshot: eight at once (~22 MiB) overrun a 6 MiB budget of bytes
    in flight; the server refuses the surplus (SERVER_BUSY, nothing run) and fork sends them again."""
    monkeypatch.setenv("OPENENV_MAX_INFLIGHT_MB", "6")
    with serve(dice_app(BulkyDiceEnv)) as server:

        async def main() -> None:
            async with client(server.base_url) as env:
                await env.reset(seed=2)
                await _play(env, [1, 2])
                forks = await env.fork(8)
                expected = trace(await _play(env, [3, 1]))
                for fork in forks:
                    assert trace(await _play(fork, [3, 1])) == expected

        asyncio.run(main())


class TallyEnv(MCPEnvironment):
    """An MCP environment whose tool keeps per-session state in the environment's attributes: a
    seeded generator and a running tally. Its own SNAPSHOT_EXCLUDE (a lock, say a cache's) adds to
    the base's (the FastMCP server, the tool tables, the client connection)."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    SUPPORTS_SNAPSHOT = True
    SNAPSHOT_EXCLUDE = ("_guard",)

    def __init__(self) -> None:
        mcp = FastMCP("tally")
        self.rng = random.Random(0)
        self.tally: List[int] = []
        self._guard = threading.Lock()  # a snapshot cannot carry it: it must be left out

        @mcp.tool
        def draw(bet: int = 1) -> dict:
            """Draw a number and add it, times ``bet``, to the tally."""
            self.tally.append(self.rng.randint(1, 100) * bet)
            return {"sum": sum(self.tally), "draws": len(self.tally), "noise": self.rng.random()}

        super().__init__(mcp)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> Observation:
        self.rng = random.Random(seed)
        self.tally = []
        return Observation()

    def _step_impl(self, action: Any, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        return Observation()

    @property
    def state(self) -> State:
        return State(step_count=len(self.tally))


class ContextTallyEnv(TallyEnv):
    """Keeps a tool's state with FastMCP's Context instead (``ctx.set_state``)."""

    def __init__(self) -> None:
        super().__init__()

        @self.mcp_server.tool
        async def bump(ctx: Context) -> int:
            total = (await ctx.get_state("total") or 0) + 1
            await ctx.set_state("total", total)
            return total


def test_mcp_tool_state_kept_in_the_environment_forks_over_tools_call_on_ws() -> None:
    saved = TallyEnv().snapshot_state()
    assert set(saved) == {"transform", "rubric", "rng", "tally"}  # the base's machinery, and _guard, left out
    app = create_app(TallyEnv, CallToolAction, CallToolObservation, env_name="tally", max_concurrent_envs=16)
    with serve(app) as server:

        async def main() -> None:
            async with MCPToolClient(base_url=server.base_url) as env:  # tools/call as MCP frames on /ws
                await env.reset(seed=5)
                for bet in (1, 2, 3):
                    await env.call_tool("draw", bet=bet)
                forks = await env.fork(8)
                expected = [await env.call_tool("draw", bet=bet) for bet in (2, 1, 4)]
                assert expected[0]["draws"] == 4
                for fork in forks:  # each fork's tool state is the original's at the fork
                    assert [await fork.call_tool("draw", bet=bet) for bet in (2, 1, 4)] == expected
                (late,) = await env.fork(1)  # forks are independent: this one starts where env is
                assert (await late.call_tool("draw"))["draws"] == 7
                assert (await forks[0].call_tool("draw"))["draws"] == 7

        asyncio.run(main())


def test_mcp_tool_state_in_fastmcp_context_is_refused_not_dropped() -> None:
    """What a tool keeps with FastMCP's Context lives in FastMCP's session store, out of a
    snapshot's reach: once such a tool has run in the session, snapshots are refused, saying why;
    a restore drops the restoring instance's connection (the saved session had none)."""
    app = create_app(ContextTallyEnv, CallToolAction, CallToolObservation, env_name="ctx", max_concurrent_envs=4)
    with serve(app) as server:

        async def main() -> None:
            async with MCPToolClient(base_url=server.base_url) as env:
                await env.reset(seed=1)
                before = await env.snapshot()  # no Context tool called yet: nothing out of reach
                assert [await env.call_tool("bump"), await env.call_tool("bump")] == [1, 2]
                with pytest.raises(NotSupportedError, match=r"FastMCP's Context.*ctx\.set_state"):
                    await env.snapshot()
                assert await env.call_tool("bump") == 3  # the session goes on
                await env.restore(before)
                assert await env.call_tool("bump") == 1  # as the saved session would have answered

        asyncio.run(main())
