"""The run-time checks of a running server: ``check_url``, and the second half of ``check_package``.

They speak HTTP (``/health``, ``/metadata``, ``/schema``, ``POST /mcp``) and the ``/ws`` protocol
through our own client, frame by frame, and judge each answer the way any client (ours or
upstream's) relies on it: a reset/step/state round trip, an invalid action answered with an error
frame on a connection that keeps working, the same episode for the same seed, sessions that do
not share state, and MCP tools listed alike on ``/ws`` and ``POST /mcp``.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ..utils import run_async_safely, within
from ._common import (
    SEED,
    Progress,
    comparable,
    example,
    fields,
    first_difference,
    invalid_variant,
    quiet,
    seed_verdict,
    short,
)
from .report import CheckReport, Status

_MCP_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}


def check_url(
    url: str,
    *,
    timeout_s: float = 30.0,
    action: Optional[Dict[str, Any]] = None,
    raise_on_failure: bool = True,
    progress: Progress = quiet,
) -> CheckReport:
    """Check the running server at ``url`` (``http(s)://host:port`` or ``unix:///path.sock``), as
    ``openenv validate URL`` does: its HTTP routes, then reset/step/state and the rest over
    ``/ws``. ``action`` is a valid step action as JSON data (default: one made from the action
    schema, or a call of the first MCP tool); ``timeout_s`` bounds each request. The token of
    ``$OPENENV_AUTH_TOKEN`` is sent to a server on this machine only.

    Raises :class:`~openenv.core.checks.EnvCheckError` naming every failed check (warnings are
    issued as :class:`~openenv.core.checks.EnvCheckWarning`); with ``raise_on_failure=False``,
    returns the :class:`~openenv.core.checks.CheckReport` instead."""
    report = CheckReport(target=url, kind="url")
    progress(f"Checking the server at {url} ...")
    ServerProbe(url, report, Hints(), timeout_s, action, send_token=True).check()
    return report.finish(raise_on_failure)


def skip_rest(report: CheckReport, reason: str) -> None:
    """Mark every run-time check not run yet as skipped."""
    done = {c.id for c in report.checks}
    if report.kind == "url":  # nothing was started
        done.add("server.start")
    for id, title in _RUNTIME_CHECKS:
        if id not in done:
            report.add(id, title, Status.SKIPPED, reason)


_RUNTIME_CHECKS = [
    ("server.start", "Server starts"),
    ("http.health", "GET /health"),
    ("http.metadata", "GET /metadata"),
    ("http.schema", "GET /schema"),
    ("mcp.tools", "MCP tools/list"),
    ("ws.round_trip", "reset / step / state over /ws"),
    ("ws.invalid_action", "Invalid action answered, connection kept"),
    ("ws.seed_determinism", "Same seed, same episode"),
    ("ws.snapshot", "Snapshot, restore, and continue the same"),
    ("ws.concurrent_sessions", "Concurrent sessions are independent"),
]


@dataclass
class Hints:
    """What importing the app told about it (nothing, for a URL)."""

    max_sessions: Optional[int] = None
    reset_accepts_seed: Optional[bool] = None
    mcp: Optional[bool] = None
    env_class: Optional[str] = None


class _Broken(Exception):
    """The connection failed (closed, timed out, or sent something that is not a JSON object)."""


_TOKEN_HINT = " (the server wants a token: set OPENENV_AUTH_TOKEN; validate sends it to servers on this machine only)"


def _auth_headers(endpoint: Any) -> Dict[str, str]:
    """The bearer token of ``$OPENENV_AUTH_TOKEN``, for a server named by URL on this machine (a
    loopback address, ``localhost`` or a Unix socket) that requires one; never sent elsewhere,
    where it may not be that server's (a ``*.localhost`` name may be looked up in DNS)."""
    token = os.environ.get("OPENENV_AUTH_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token and endpoint.is_certainly_local else {}


class _Connection:
    """One ``/ws`` session through our own client, spoken to frame by frame. An error frame is an
    answer like any other (the checks judge it); a connection that breaks (closed, timed out, a
    reply that is not a JSON object) raises :class:`_Broken` and is never resumed, so that a
    server that drops its clients shows."""

    def __init__(self, url: str, timeout_s: float, headers: Dict[str, str]) -> None:
        from ..generic_client import GenericEnvClient

        self.client = GenericEnvClient(
            base_url=url,
            connect_timeout_s=timeout_s,
            message_timeout_s=timeout_s,
            headers=headers,
            reconnect_timeout_s=0,
        )
        self.timeout_s = timeout_s
        self.broken = False

    async def __aenter__(self) -> _Connection:
        try:
            await self.client.connect()
        except Exception as exc:
            self.broken = True
            raise _Broken(f"could not open {self.client._ws_url}: {exc}") from None
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await within(self.client.close(), 5.0)
        except Exception:
            pass

    async def ask(self, frame: Dict[str, Any]) -> Dict[str, Any]:
        from ..client_errors import ServerError, SessionLostError

        what = f"a {frame.get('type')} frame"
        try:
            return await self.client._send_and_receive(frame)
        except ServerError as exc:
            return {"type": "error", "data": {**exc.details, "message": exc.message, "code": exc.code}}
        except SessionLostError as exc:
            self.broken = True
            raise _Broken(f"the server closed the connection on {what} ({exc})") from None
        except TimeoutError:
            self.broken = True
            raise _Broken(f"no answer to {what} within {self.timeout_s:g} s") from None
        except Exception as exc:  # a reply that is not a JSON object, a connection refused
            self.broken = True
            raise _Broken(f"{what} failed: {exc}") from None


class _Refused(Exception):
    """The server answered with an error frame where it should not have."""

    def __init__(self, reply: Dict[str, Any]) -> None:
        data = reply.get("data") if isinstance(reply.get("data"), dict) else {}
        self.code = str(data.get("code", ""))
        self.message = str(data.get("message", reply))
        super().__init__(f"{self.message} (code {self.code or 'none'})")


def _observation(reply: Dict[str, Any], what: str) -> Dict[str, Any]:
    """The data of an observation frame; raises :class:`_Refused` or ``ValueError`` (bad shape)."""
    if reply.get("type") == "error":
        raise _Refused(reply)
    if reply.get("type") != "observation":
        raise ValueError(f"{what} was answered with a {reply.get('type')!r} frame, not 'observation'")
    data = reply.get("data")
    problems = []
    if not isinstance(data, dict):
        problems.append("data is not an object")
    else:
        if not isinstance(data.get("observation"), dict):
            problems.append("data.observation is not an object")
        if not isinstance(data.get("done"), bool):
            problems.append("data.done is not a boolean")
        reward = data.get("reward")
        if reward is not None and not isinstance(reward, (int, float)):
            problems.append(f"data.reward is {type(reward).__name__}, not a number or null")
    if problems:
        raise ValueError(f"the observation frame answering {what} is malformed: {'; '.join(problems)}")
    return data  # type: ignore[return-value]


class ServerProbe:
    """Runs the run-time checks against one server, adding them to the report in order."""

    def __init__(
        self,
        base_url: str,
        report: CheckReport,
        hints: Hints,
        timeout_s: float,
        action: Optional[Dict[str, Any]],
        send_token: bool = False,
    ) -> None:
        from ..utils import parse_endpoint

        self.url = base_url
        self.endpoint = parse_endpoint(base_url)
        # A server validate started itself (a package) has no token: the user's is not its business.
        self.headers = _auth_headers(self.endpoint) if send_token else {}
        self.report = report
        self.hints = hints
        self.timeout_s = timeout_s
        self.explicit_action = action
        self.schema: Dict[str, Any] = {}
        self.tools: List[Dict[str, Any]] = []
        self.action: Optional[Dict[str, Any]] = None  # a step action the server accepted
        self.main: Optional[_Connection] = None

    def _http(self) -> Any:
        import httpx

        headers = self.headers
        if self.endpoint.uds:
            transport = httpx.AsyncHTTPTransport(uds=self.endpoint.uds)
            return httpx.AsyncClient(
                base_url=self.endpoint.http_url, transport=transport, timeout=self.timeout_s, headers=headers
            )
        return httpx.AsyncClient(
            base_url=self.endpoint.http_url,
            timeout=self.timeout_s,
            trust_env=not self.endpoint.is_loopback,
            headers=headers,
        )

    def check(self) -> None:
        """Run the checks from sync code."""
        run_async_safely(self._run())

    async def _run(self) -> None:
        async with self._http() as http:
            if not await self._health(http):
                skip_rest(self.report, "the server did not answer GET /health")
                return
            await self._metadata(http)
            await self._schema(http)
            try:
                async with _Connection(self.url, self.timeout_s, self.headers) as main:
                    self.main = main
                    await self._mcp_tools(http)
                    if await self._round_trip():
                        await self._invalid_action()
                        await self._determinism()
                        await self._snapshot()
                        await self._concurrency()
            except _Broken as exc:
                if self.report.get("ws.round_trip") is None:
                    self.report.add("ws.round_trip", "reset / step / state over /ws", Status.FAILED, str(exc))
        skip_rest(self.report, "needs a working reset/step round trip over /ws")

    async def _session(self) -> _Connection:
        """The main connection, opened again if an earlier check broke it."""
        assert self.main is not None
        if self.main.broken:
            await self.main.__aexit__()
            self.main = await _Connection(self.url, self.timeout_s, self.headers).__aenter__()
        return self.main

    # --- HTTP ------------------------------------------------------------------------------------

    async def _get(self, http: Any, path: str) -> Tuple[Optional[Any], str]:
        try:
            response = await http.get(path)
        except Exception as exc:
            return None, f"GET {path} failed: {type(exc).__name__}: {exc}"
        if response.status_code != 200:
            hint = _TOKEN_HINT if response.status_code == 401 else ""
            return None, f"GET {path} answered HTTP {response.status_code}: {response.text[:200]}{hint}"
        try:
            return response.json(), ""
        except ValueError:
            return None, f"GET {path} did not answer JSON: {response.text[:200]!r}"

    async def _health(self, http: Any) -> bool:
        body, error = await self._get(http, "/health")
        if error:
            self.report.add("http.health", "GET /health", Status.FAILED, error)
            return False
        if not isinstance(body, dict) or body.get("status") != "healthy":
            self.report.add(
                "http.health", "GET /health", Status.FAILED, f'expected {{"status": "healthy"}}, got {body}'
            )
        else:
            self.report.add("http.health", "GET /health", Status.PASSED, "healthy")
        return True

    async def _metadata(self, http: Any) -> None:
        body, error = await self._get(http, "/metadata")
        missing = [] if error else [k for k in ("name", "description") if not isinstance(body.get(k), str)]
        if error or missing:
            detail = error or f"name and description must be strings; missing or wrong: {', '.join(missing)}"
            self.report.add("http.metadata", "GET /metadata", Status.FAILED, detail)
            return
        if self.report.name is None:
            self.report.name = body["name"]
        version = f" {body['version']}" if body.get("version") else ""
        self.report.add("http.metadata", "GET /metadata", Status.PASSED, f"{body['name']}{version}")

    async def _schema(self, http: Any) -> None:
        body, error = await self._get(http, "/schema")
        if not error:
            bad = [k for k in ("action", "observation", "state") if not _is_object_schema(body.get(k))]
            if bad:
                error = f"{', '.join(bad)} missing or not a JSON schema of an object"
        if error:
            self.report.add("http.schema", "GET /schema", Status.FAILED, error)
            return
        self.schema = body
        parts = []
        for key in ("action", "observation", "state"):
            required = body[key].get("required") or []
            parts.append(
                f"{key} {body[key].get('title', '?')}" + (f" (requires {', '.join(required)})" if required else "")
            )
        self.report.add("http.schema", "GET /schema", Status.PASSED, "; ".join(parts))

    # --- MCP -------------------------------------------------------------------------------------

    def _looks_mcp(self) -> bool:
        if self.hints.mcp:
            return True
        properties = (self.schema.get("action") or {}).get("properties") or {}
        return "tool_name" in properties or (properties.get("type") or {}).get("const") in ("call_tool", "list_tools")

    async def _mcp_tools(self, http: Any) -> None:
        title = "MCP tools/list"
        expected = self._looks_mcp()
        over_http, http_error = await self._tools_over_http(http)
        if not expected:
            if over_http:
                names = ", ".join(t.get("name", "?") for t in over_http)
                self.report.add("mcp.tools", title, Status.PASSED, f"POST /mcp lists {names}")
                self.tools = over_http
            else:
                self.report.add("mcp.tools", title, Status.SKIPPED, "not an MCP environment")
            return
        try:
            over_ws, ws_error = await self._tools_over_ws()
        except _Broken as exc:
            over_ws, ws_error = [], f"the /ws mcp frame failed: {exc}"
        problems = [e for e in (ws_error, http_error) if e]
        if problems:
            self.report.add("mcp.tools", title, Status.FAILED, "; ".join(problems))
            return
        names = [t.get("name") for t in over_ws]
        if names != [t.get("name") for t in over_http]:
            self.report.add(
                "mcp.tools",
                title,
                Status.WARNING,
                f"/ws lists {names} but POST /mcp lists {[t.get('name') for t in over_http]}",
            )
        else:
            joined = ", ".join(str(n) for n in names) or "no tools"
            self.report.add("mcp.tools", title, Status.PASSED, f"{joined} (over /ws and POST /mcp)")
        self.tools = over_ws

    async def _tools_over_http(self, http: Any) -> Tuple[List[Dict[str, Any]], str]:
        try:
            response = await http.post("/mcp", json=_MCP_LIST)
            return _tools_of(response.json(), "POST /mcp")
        except Exception as exc:
            return [], f"POST /mcp tools/list failed: {type(exc).__name__}: {exc}"

    async def _tools_over_ws(self) -> Tuple[List[Dict[str, Any]], str]:
        session = await self._session()
        reply = await session.ask({"type": "mcp", "data": _MCP_LIST})
        if reply.get("type") != "mcp":
            return [], f"the /ws mcp frame was answered with {short(reply, 200)}"
        return _tools_of(reply.get("data"), "the /ws mcp frame")

    # --- the /ws protocol ------------------------------------------------------------------------

    def _step_action(self) -> Tuple[Dict[str, Any], str]:
        """A step action to send, and where it came from."""
        if self.explicit_action is not None:
            return self.explicit_action, "given with --action"
        action_schema = self.schema.get("action") or {}
        properties = action_schema.get("properties") or {}
        if self.tools and "tool_name" in properties:
            tool = self.tools[0]
            input_schema = tool.get("inputSchema") or tool.get("input_schema") or {}
            action: Dict[str, Any] = {"tool_name": tool.get("name"), "arguments": example(input_schema, input_schema)}
            if "type" in properties:
                action = {"type": "call_tool", **action}
            return action, f"generated: a call of the tool {tool.get('name')!r}"
        return example(action_schema, action_schema) or {}, "generated from the action schema"

    async def _round_trip(self) -> bool:
        title = "reset / step / state over /ws"
        session = await self._session()
        action, origin = self._step_action()
        try:
            reset = _observation(await session.ask({"type": "reset", "data": {}}), "reset")
            step_reply = await session.ask({"type": "step", "data": action})
            try:
                step = _observation(step_reply, f"step {short(action)}")
            except _Refused as exc:
                if self.explicit_action is not None:
                    raise
                self.report.add(
                    "ws.round_trip",
                    title,
                    Status.WARNING,
                    f"reset worked, but the server refused the step action {short(action)} ({origin}): {exc}; "
                    "pass a valid action with --action '<json>' (check_url's action=) to run the step checks",
                )
                return False
            state = await session.ask({"type": "state"})
        except (_Refused, ValueError) as exc:
            self.report.add("ws.round_trip", title, Status.FAILED, str(exc))
            return False
        if state.get("type") != "state" or not isinstance(state.get("data"), dict):
            self.report.add(
                "ws.round_trip", title, Status.FAILED, f"a state frame was answered with {short(state, 200)}"
            )
            return False
        self.action = action
        notes = self._undeclared_fields(reset, "reset_observation") + self._undeclared_fields(step, "observation")
        detail = (
            f"reset -> observation with {fields(reset['observation'])}; step {short(action, 80)} ({origin}) -> "
            f"reward {step.get('reward')}, done {step['done']}; state with {fields(state['data'])}"
        )
        if notes:
            self.report.add("ws.round_trip", title, Status.WARNING, "; ".join(notes) + f". {detail}")
        else:
            self.report.add("ws.round_trip", title, Status.PASSED, detail)
        return True

    def _undeclared_fields(self, data: Dict[str, Any], key: str) -> List[str]:
        schema = self.schema.get(key) or self.schema.get("observation") or {}
        properties = schema.get("properties")
        if not isinstance(properties, dict) or schema.get("additionalProperties") is not False:
            return []
        extra = sorted(k for k in data["observation"] if k not in properties)
        if not extra:
            return []
        return [f"the {key.replace('_', ' ')} has fields /schema does not declare: {', '.join(extra)}"]

    async def _invalid_action(self) -> None:
        title = "Invalid action answered, connection kept"
        assert self.action is not None
        bad, why = invalid_variant(self.action, self.schema.get("action") or {})
        session = await self._session()
        try:
            reply = await session.ask({"type": "step", "data": bad})
        except _Broken as exc:
            self.report.add(
                "ws.invalid_action",
                title,
                Status.FAILED,
                f"after an invalid action ({why}): {exc}. The server must answer with an error frame and keep "
                "the connection (and its episode) open",
            )
            return
        if reply.get("type") != "error":
            self.report.add(
                "ws.invalid_action",
                title,
                Status.FAILED,
                f"the server accepted an invalid action ({why}) and answered a {reply.get('type')!r} frame; "
                "it must answer with an error frame (code VALIDATION_ERROR)",
            )
            return
        code = (reply.get("data") or {}).get("code")
        try:
            _observation(await session.ask({"type": "step", "data": self.action}), "the step after the error")
        except (_Broken, _Refused, ValueError) as exc:
            self.report.add(
                "ws.invalid_action",
                title,
                Status.FAILED,
                f"the invalid action ({why}) got an error frame ({code}), but a valid step on the same "
                f"connection then failed: {exc}",
            )
            return
        detail = f"{why} -> error frame {code}; a valid step on the same connection then worked"
        if code == "VALIDATION_ERROR":
            self.report.add("ws.invalid_action", title, Status.PASSED, detail)
        else:
            self.report.add("ws.invalid_action", title, Status.WARNING, f"{detail} (VALIDATION_ERROR expected)")

    async def _episode(self, seed: Optional[int]) -> Tuple[Any, Any]:
        """Reset (with ``seed``) and step once; the comparable parts of both answers."""
        session = await self._session()
        data = {"seed": seed} if seed is not None else {}
        reset = _observation(await session.ask({"type": "reset", "data": data}), f"reset {short(data)}")
        try:
            step = _observation(await session.ask({"type": "step", "data": self.action}), "step")
        except _Refused:  # e.g. the episode ended at reset: compare resets alone
            step = None
        return comparable(reset), comparable(step)

    async def _determinism(self) -> None:
        status, detail = await seed_verdict(
            self._episode, (_Refused, ValueError, _Broken), self.hints.env_class, self.hints.reset_accepts_seed
        )
        self.report.add("ws.seed_determinism", "Same seed, same episode", status, detail)

    async def _snapshot(self) -> None:
        """Over ``/ws``: a seeded step, a snapshot, two steps, the snapshot restored, the same two
        steps: the same observations. Skipped where the environment does not support snapshots
        (``NOT_SUPPORTED``) or the server has none (an OpenEnv 0.10 server: ``UNKNOWN_TYPE``)."""
        title = "Snapshot, restore, and continue the same"
        session = await self._session()

        async def two_steps() -> List[Any]:
            seen = []
            for _ in range(2):
                reply = await session.ask({"type": "step", "data": self.action})
                seen.append(comparable(reply.get("data")) if reply.get("type") == "observation" else "refused")
                if reply.get("type") != "observation" or (reply.get("data") or {}).get("done"):
                    break
            return seen

        try:
            _observation(await session.ask({"type": "reset", "data": {"seed": SEED}}), "reset")
            await session.ask({"type": "step", "data": self.action})
            taken = await session.ask({"type": "snapshot"})
            error = taken.get("data") or {}
            if taken.get("type") == "error":
                if error.get("code") in ("NOT_SUPPORTED", "UNKNOWN_TYPE"):
                    why = (
                        error.get("message") if error.get("code") == "NOT_SUPPORTED" else "the server has no snapshots"
                    )
                    self.report.add("ws.snapshot", title, Status.SKIPPED, str(why))
                else:
                    self.report.add("ws.snapshot", title, Status.FAILED, f"snapshot answered {short(error)}")
                return
            snapshot = error.get("snapshot")
            first = await two_steps()
            restored = await session.ask({"type": "restore", "data": {"snapshot": snapshot}})
            if restored.get("type") != "restore":
                self.report.add("ws.snapshot", title, Status.FAILED, f"restore answered {short(restored.get('data'))}")
                return
            again = await two_steps()
        except (_Refused, ValueError) as exc:
            self.report.add("ws.snapshot", title, Status.FAILED, f"the episode around the snapshot failed: {exc}")
            return
        if again != first:
            self.report.add(
                "ws.snapshot",
                title,
                Status.FAILED,
                f"after restore, the same actions gave other observations ({first_difference(first, again)})",
            )
            return
        size = error.get("bytes")
        self.report.add(
            "ws.snapshot",
            title,
            Status.PASSED,
            f"a {size}-byte snapshot; restored, {len(first)} step(s) repeated exactly",
        )

    async def _concurrency(self) -> None:
        title = "Concurrent sessions are independent"
        declared = self.hints.max_sessions
        if declared is not None and declared < 2:
            self.report.add(
                "ws.concurrent_sessions",
                title,
                Status.SKIPPED,
                f"the app serves one session at a time (max_concurrent_envs={declared})",
            )
            return
        assert self.action is not None
        try:
            first = await self._session()
            async with _Connection(self.url, self.timeout_s, self.headers) as second:
                reply = await second.ask({"type": "reset", "data": {"seed": SEED}})
                if reply.get("type") == "error" and (reply.get("data") or {}).get("code") == "CAPACITY_REACHED":
                    message = (reply.get("data") or {}).get("message", "")
                    if declared is None:
                        self.report.add(
                            "ws.concurrent_sessions",
                            title,
                            Status.SKIPPED,
                            f"the server serves one session at a time (a second one was refused: {message})",
                        )
                    else:
                        self.report.add(
                            "ws.concurrent_sessions",
                            title,
                            Status.FAILED,
                            f"the app declares max_concurrent_envs={declared}, but a second session was refused: "
                            f"{message}",
                        )
                    return
                _observation(reply, "reset of a second session")
                _observation(await first.ask({"type": "reset", "data": {"seed": SEED}}), "reset")
                before = await second.ask({"type": "state"})
                _observation(await first.ask({"type": "step", "data": self.action}), "step")
                after = await second.ask({"type": "state"})
                stepped = await first.ask({"type": "state"})
                if before != after:
                    self.report.add(
                        "ws.concurrent_sessions",
                        title,
                        Status.FAILED,
                        "stepping one session changed the state of another "
                        f"({first_difference(before.get('data'), after.get('data'))}): sessions must not share "
                        "an environment instance or module-level state",
                    )
                    return
                both = await asyncio.gather(
                    first.ask({"type": "step", "data": self.action}), second.ask({"type": "step", "data": self.action})
                )
                for reply in both:
                    _observation(reply, "a step run in parallel with another session's")
        except (_Broken, _Refused, ValueError) as exc:
            self.report.add("ws.concurrent_sessions", title, Status.FAILED, f"with two sessions open: {exc}")
            return
        limit = f" (max_concurrent_envs={declared})" if declared else ""
        note = "" if stepped != before else "; the state does not change on step, so this says little"
        self.report.add(
            "ws.concurrent_sessions",
            title,
            Status.PASSED,
            f"two sessions at once{limit}: a step in one left the other's state unchanged, and parallel steps "
            f"were both answered{note}",
        )


def _tools_of(rpc: Any, where: str) -> Tuple[List[Dict[str, Any]], str]:
    if not isinstance(rpc, dict):
        return [], f"{where} answered {short(rpc, 200)}"
    if rpc.get("error"):
        return [], f"{where} answered a JSON-RPC error: {(rpc['error'] or {}).get('message')}"
    tools = (rpc.get("result") or {}).get("tools")
    if not isinstance(tools, list) or not all(isinstance(t, dict) and t.get("name") for t in tools):
        return [], f"{where} did not answer a list of named tools: {short(rpc, 200)}"
    return tools, ""


def _is_object_schema(schema: Any) -> bool:
    return isinstance(schema, dict) and (schema.get("type") == "object" or isinstance(schema.get("properties"), dict))
