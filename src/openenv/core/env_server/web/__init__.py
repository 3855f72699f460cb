"""The web playground: a page at ``/web/`` where a person plays an environment by hand.

Served when asked for: ``ENABLE_WEB_INTERFACE=1`` (upstream's variable, read by :mod:`..settings`),
``create_app(..., web=True)`` or ``openenv serve --web``; ``/`` and ``/web`` redirect to ``/web/``.
The page is three files shipped in this package (``static/``: HTML, CSS, JavaScript; no build
step, nothing loaded from elsewhere, so it works offline) talking to the routes below.

**One session per visitor.** Each tab gets a session of its own from the server's one
:class:`~..sessions.SessionManager`, as ``openenv/session/create`` makes them: counted against
``max_concurrent_envs``, closed when the tab goes away (the page sends ``DELETE /web/session`` on
``pagehide``) or once idle for ``session_timeout`` seconds. The page names its session in the
``X-OpenEnv-Session`` header (never in a URL); two visitors never share an environment.

**The token.** With an access token (:mod:`..edges.auth`), only the page's own three files are served
without it (a browser cannot add a header to a page it navigates to; they hold no data): the page
asks for the token once, keeps it in the tab's ``sessionStorage`` and sends it as
``Authorization: Bearer`` with every call. Every route below is behind the token and the limits
like any other.

===========================  ===================================================================
``GET /web/metadata``        the environment: metadata, README, JSON schemas, its reset keywords,
                             whether it takes MCP tool calls, the package's Gradio UI (``custom``)
``POST /web/session``        a new session: ``{"session_id", "tools", "idle_timeout_s"}``
``DELETE /web/session``      close it
``POST /web/reset``          body: reset keywords (``seed``, ``episode_id``, the environment's own)
``POST /web/step``           body: ``{"action": {...}}``
``GET /web/state``           the session's state
===========================  ===================================================================

Reset and step answer a *view*: the observation payload (as HTTP ``/step`` has it) plus ``html``
(the environment's :meth:`~..interfaces.Environment.render_web`), ``actions`` (its
:meth:`~..interfaces.Environment.web_actions`, as ``{"label", "action"}``) and ``state``.

**Hostile HTML.** ``render_web``'s HTML is drawn in an iframe that the page sandboxes (no scripts,
no forms, no navigation, an origin of its own) under a Content-Security-Policy that lets it load
nothing but ``data:`` images: it can neither run code in the page nor send anything anywhere.
Everything else the page shows (observations, errors, the README) is inserted as text, never as HTML.

**A package's Gradio UI** (``create_app(..., gradio_builder=...)`` with Gradio installed) is
mounted beside the page at ``/web/custom/`` (:mod:`.custom`) and linked from it; it plays one
environment shared by its visitors (:class:`.shared.WebInterfaceManager`, OpenEnv 0.10's).
"""

from __future__ import annotations

import inspect
import logging
import os
import re
import sys
from importlib import resources
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response

from .. import error_details
from ..dispatch import Call, Op
from ..edges.middleware import http_error
from ..exceptions import EnvironmentResultError, InvalidJsonError, SessionNotFoundError
from ..roles import Principal, principal_of
from ..serialization import deserialize_action, parse_json, serialize_observation, to_json_bytes, to_jsonable
from ..sessions import Session
from ..transports.mcp import rpc_error
from ..types import ResetRequest, StepRequest
from .shared import WebInterfaceManager

logger = logging.getLogger("openenv.server")

SESSION_HEADER = "x-openenv-session"
"""The header naming a visitor's session on the page's calls."""

_FILES = {
    "/web/": ("index.html", "text/html; charset=utf-8"),
    "/web/playground.css": ("playground.css", "text/css; charset=utf-8"),
    "/web/playground.js": ("playground.js", "text/javascript; charset=utf-8"),
}
PAGE_PATHS = frozenset({"/", "/web", *_FILES})
"""What is served without the token where there is one: the redirects and the page's own files."""

_PAGE_HEADERS = {
    # The page's own files only; 'unsafe-inline' styles for render_web's HTML, whose srcdoc frame
    # inherits this policy (it adds a stricter one of its own, see playground.js).
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
        "connect-src 'self'; frame-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",  # (no other site may frame the page and lure clicks on it)
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}
_RESET_OWN = ("seed", "episode_id")
_JSON_TYPES = {"int": "integer", "float": "number", "bool": "boolean", "str": "string"}
_SIMPLE_ANNOTATION = re.compile(r"(?:Optional\[)?(int|float|bool|str)\]?(?:\s*\|\s*None)?")
"""``int``, ``Optional[int]``, ``int | None`` (and so for float, bool, str); anything else is JSON."""


def _json(content: Any, status: int = 200) -> Response:
    return Response(to_json_bytes(content), status_code=status, media_type="application/json")


def _hook(cls: type, name: str) -> bool:
    """``cls`` has the web hook ``name`` of its own (not the contract's default)."""
    from ..interfaces import Environment

    method = getattr(cls, name, None)
    return callable(method) and method is not getattr(Environment, name)


def reset_arguments(cls: type) -> Dict[str, Any]:
    """The keywords ``cls.reset`` takes besides seed and episode_id, for the page's reset form:
    ``{"fields": [{"name", "type", "default"}], "any": takes **kwargs}``."""
    method = getattr(cls, "reset_async" if _hook(cls, "reset_async") else "reset", None)
    try:
        params = list(inspect.signature(method).parameters.values())[1:]  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return {"fields": [], "any": True}
    fields = []
    for p in params:
        if p.name in _RESET_OWN or p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            continue
        annotation = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", "")
        simple = _SIMPLE_ANNOTATION.fullmatch(str(annotation).replace("typing.", "").strip())
        default = None if p.default is p.empty else p.default
        fields.append(
            {
                "name": p.name,
                "type": _JSON_TYPES[simple.group(1)] if simple else "json",
                "default": to_jsonable(default),
            }
        )
    return {"fields": fields, "any": any(p.kind is p.VAR_KEYWORD for p in params)}


def find_readme(cls: Optional[type]) -> Optional[str]:
    """The environment's README: ``$ENV_README_PATH`` (upstream's variable), else ``README.md``
    beside the module defining ``cls`` or one directory up (a package's ``server/``)."""
    candidates = []
    if os.environ.get("ENV_README_PATH"):
        candidates.append(Path(os.environ["ENV_README_PATH"]))
    module = sys.modules.get(getattr(cls, "__module__", ""), None)
    source = getattr(module, "__file__", None)
    if source:
        here = Path(source).resolve().parent
        candidates += [here / "README.md", here.parent / "README.md"]
    for path in candidates:
        try:
            return path.read_text(encoding="utf-8", errors="replace")[:200_000]
        except OSError:
            continue
    return None


class Playground:
    """The web playground of one :class:`~..http_server.HTTPEnvServer`: its page and routes (see
    the module docstring). It keeps no environment of its own: every call goes to the visitor's
    session in the server's :class:`~..sessions.SessionManager`."""

    def __init__(self, server: Any) -> None:  # an HTTPEnvServer (a layer above this module)
        self.server = server
        self.dispatcher = server.dispatcher
        self.manager = server.manager
        self._about: Optional[Dict[str, Any]] = None
        self.custom: Optional[Dict[str, Any]] = None
        """The package's own Gradio UI where one is mounted (:mod:`.custom`): ``{"name", "path",
        "primary"}``, which the page links to (and ``/``, ``/web`` lead to when primary)."""

    def register(self, app: FastAPI) -> None:
        """Add the page and its routes to ``app`` (and itself as ``app.state.openenv_playground``)."""
        app.state.openenv_playground = self

        async def to_page() -> Response:
            landing = "web/" + (self.custom["path"] if self.custom and self.custom["primary"] else "")
            return RedirectResponse(landing, status_code=307)  # relative: right under any base path

        app.add_api_route("/", to_page, methods=["GET"], include_in_schema=False)
        app.add_api_route("/web", to_page, methods=["GET"], include_in_schema=False)
        for path in _FILES:
            app.add_api_route(path, self.page_file, methods=["GET"], include_in_schema=False)
        app.add_api_route("/web/metadata", self.about, methods=["GET"], include_in_schema=False)
        app.add_api_route("/web/session", self.open_session, methods=["POST"], include_in_schema=False)
        app.add_api_route("/web/session", self.close_session, methods=["DELETE"], include_in_schema=False)
        app.add_api_route("/web/reset", self.reset, methods=["POST"], include_in_schema=False)
        app.add_api_route("/web/step", self.step, methods=["POST"], include_in_schema=False)
        app.add_api_route("/web/state", self.state, methods=["GET"], include_in_schema=False)

    # --- the page ------------------------------------------------------------------------------

    async def page_file(self, request: Request) -> Response:
        name, media_type = _FILES[request.scope["route"].path]
        body = resources.files(__package__).joinpath("static", name).read_bytes()
        return Response(body, media_type=media_type, headers=_PAGE_HEADERS)

    async def about(self, request: Request) -> Response:
        try:
            await self.dispatcher.run(Call(Op.METADATA, principal=principal_of(request.scope)))  # (the role's check)
            if self._about is None:
                self._about = await self._describe()
            return _json({**self._about, "custom": self.custom})
        except Exception as exc:
            return http_error(exc)

    async def _describe(self) -> Dict[str, Any]:
        dispatcher = self.dispatcher
        metadata = await dispatcher.metadata()
        cls = await dispatcher.env_class()
        return {
            "env_name": dispatcher.env_name,
            "metadata": metadata.model_dump(),
            "readme": metadata.readme_content or find_readme(cls),
            "schema": dispatcher.schema(),
            "mcp": bool(getattr(cls, "ANSWERS_MCP", False)) or dispatcher.takes_mcp_actions,
            "reset": reset_arguments(cls),
            "max_sessions": self.manager.max_sessions,
        }

    # --- a visitor's session -------------------------------------------------------------------

    def _session_id(self, request: Request) -> str:
        session_id = request.headers.get(SESSION_HEADER)
        if not session_id:
            raise SessionNotFoundError("", "no session: the page sends X-OpenEnv-Session (reload the page)")
        return session_id

    async def open_session(self, request: Request) -> Response:
        # A JSON body only: a form or a plain-text post from another site's page (which needs no
        # permission from this server) cannot take a slot; a JSON one needs CORS, which is not offered.
        if not request.headers.get("content-type", "").startswith("application/json"):
            detail = "send the request as JSON (Content-Type: application/json)"
            return _json({"detail": detail, "code": "VALIDATION_ERROR"}, status=415)
        dispatcher = self.dispatcher
        try:
            session: Session = await dispatcher.run(Call(Op.CREATE, principal=principal_of(request.scope)))
        except Exception as exc:
            return http_error(exc)
        reply: Dict[str, Any] = {"session_id": session.id, "idle_timeout_s": self.manager.session_timeout_s}
        if dispatcher.takes_tools(session):
            try:
                call = Call(Op.LIST_TOOLS, None, session.id, principal=principal_of(request.scope))
                reply["tools"] = to_jsonable(await dispatcher.run(call))
            except Exception as exc:  # worded as the JSON-RPC error of tools/list would be
                reply["tools_error"] = rpc_error(exc, None, "MCP request tools/list failed").error.message
        return _json(reply)

    async def close_session(self, request: Request) -> Response:
        try:
            call = Call(Op.CLOSE, self._session_id(request), principal=principal_of(request.scope))
            return _json(await self.dispatcher.run(call))
        except Exception as exc:
            return http_error(exc)

    async def reset(self, request: Request) -> Response:
        try:
            session_id = self._session_id(request)
            kwargs = await _body(request)
            ResetRequest.model_validate(kwargs)  # the bounds of HTTP /reset on seed and episode_id
            principal = principal_of(request.scope)
            observation = await self.dispatcher.run(Call(Op.RESET, kwargs, session_id, principal=principal))
            return _json(await self._view(session_id, observation, principal))
        except Exception as exc:
            return http_error(exc)

    async def step(self, request: Request) -> Response:
        try:
            session_id = self._session_id(request)
            body = StepRequest.model_validate(await _body(request))  # as HTTP /step: {"action": {...}}
            action = deserialize_action(body.action, self.dispatcher.action_cls)
            principal = principal_of(request.scope)
            observation = await self.dispatcher.run(Call(Op.STEP, (action, None), session_id, principal=principal))
            return _json(await self._view(session_id, observation, principal))
        except Exception as exc:
            return http_error(exc)

    async def state(self, request: Request) -> Response:
        try:
            call = Call(Op.STATE, None, self._session_id(request), principal=principal_of(request.scope))
            return _json(to_jsonable(await self.dispatcher.run(call)))
        except Exception as exc:
            return http_error(exc)

    async def _view(self, session_id: str, observation: Any, principal: Principal) -> Dict[str, Any]:
        """The observation's payload, the environment's web hooks on it, and the state."""
        payload = to_jsonable(serialize_observation(observation))
        seen = {**payload["observation"], "reward": payload["reward"], "done": payload["done"]}

        def extras(env: Any) -> Tuple[Any, Any, Any]:
            cls = type(env)
            html = actions = None
            if _hook(cls, "render_web"):
                html = _guarded(lambda: env.render_web(seen))
            if _hook(cls, "web_actions"):
                actions = _guarded(lambda: env.web_actions(seen))
            return html, actions, env.state

        html, actions, state = await self.dispatcher.run(Call(Op.VIEW, extras, session_id, principal=principal))
        payload["state"] = to_jsonable(state)
        payload["html"] = _checked(html, "render_web", _html)
        payload["actions"] = _checked(actions, "web_actions", _actions)
        return payload


async def _body(request: Request) -> Dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = parse_json(raw)
    except ValueError as exc:
        raise InvalidJsonError(str(exc)) from None
    if not isinstance(body, dict):
        raise InvalidJsonError("the body must be a JSON object")
    return body


def _guarded(hook: Any) -> Any:
    """A hook's result, or the exception it raised (worded later, on the loop, for this client)."""
    try:
        return hook()
    except Exception as exc:
        return exc


def _checked(result: Any, name: str, shape: Any) -> Any:
    """A hook's result in the view's shape, or ``{"error": ...}`` saying why there is none."""
    if isinstance(result, Exception):
        return {"error": error_details.describe(result, logger, f"{name} failed")}
    try:
        return shape(result)
    except EnvironmentResultError as exc:
        return {"error": f"{name}: {exc}"}


def _html(result: Any) -> Optional[str]:
    if result is None or isinstance(result, str):
        return result
    raise EnvironmentResultError(f"returned {type(result).__name__}, not an HTML string or None")


def _actions(result: Any) -> Optional[List[Dict[str, Any]]]:
    if result is None:
        return None
    offered = []
    for item in result:
        try:
            label, action = item
        except (TypeError, ValueError):
            raise EnvironmentResultError("must return (label, action dict) pairs") from None
        if not isinstance(action, dict):
            raise EnvironmentResultError(f"action of {label!r} is {type(action).__name__}, not a dict")
        offered.append({"label": str(label), "action": to_jsonable(action)})
    return offered


__all__ = ["PAGE_PATHS", "SESSION_HEADER", "Playground", "WebInterfaceManager", "find_readme", "reset_arguments"]
