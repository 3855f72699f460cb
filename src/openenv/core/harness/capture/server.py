"""The capture proxy's app: an agent's model calls in, the engine's exact tokens recorded.

An agent (Codex CLI, Claude Code, mini-SWE-agent, an SDK) is pointed at this server with a base
URL and an API key; the key is the rollout's session id. Each call, in any of four wire dialects,
is translated to one OpenAI chat completion for the engine, which is asked for its own token ids
and logprobs; the answer becomes a turn of the session's rollout graph, is journalled, and is
only then replayed to the agent in its own dialect (JSON, or SSE when it asked for a stream).

Admin routes (``/sessions*``) need the admin key; an agent's key reaches only its own session's
model calls. Every bound is a :class:`~openenv.core.harness.capture.settings.CaptureLimits`
setting, refused with an error in the agent's dialect. ``python -m
openenv.core.harness.capture.server`` serves it (on 127.0.0.1 unless told otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import secrets
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Tuple

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from openenv.core.harness.capture import _json
from openenv.core.harness.capture import upstream as policy
from openenv.core.harness.capture.dialects import APIType, DialectError, detect, dialect_for
from openenv.core.harness.capture.dialects import count_tokens_reply as _count_tokens_reply
from openenv.core.harness.capture.export import export_session, to_trace_entries, to_training_trace
from openenv.core.harness.capture.inference import (
    InferenceClient,
    UpstreamError,
    UpstreamHTTPError,
    UpstreamTimeoutError,
    is_context_length_error,
)
from openenv.core.harness.capture.ingest import node_from_exchange
from openenv.core.harness.capture.listen import ADMIN_KEY_FILE, listen_socket, loopback, resolve_admin_key
from openenv.core.harness.capture.sessions import (
    RESERVED_METADATA,
    SESSION_ID,
    CaptureSession,
    EngineRef,
    Journal,
    SessionError,
    SessionRegistry,
)
from openenv.core.harness.capture.settings import CaptureLimits, admin_key_from_env, default_journal_dir
from openenv.core.harness.capture.validate import Finding
from openenv.core.utils import CollectBetweenCalls, timeout_after

log = logging.getLogger("openenv.capture")

BUDGET_STOP_TEXT = "Step budget exhausted; stopping."
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
                   "repetition_penalty", "seed", "max_tokens", "max_completion_tokens")  # fmt: skip
# Headers by which harnesses name their own session (recorded on each turn).
HARNESS_SESSION_HEADERS = ("x-openenv-harness-session", "x-claude-code-session-id", "session_id", "x-session-id")
ADMIN_REQUIRED = "this route requires the capture admin key"
# What the proxy itself notes in a session's metadata (as upstream does): not part of what was asked.
PROXY_METADATA = ("api_type", "sampling_overridden")


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


def _key_of(request: Request) -> Optional[str]:
    header = request.headers.get("authorization", "")
    if header[:7].lower() == "bearer ":
        return header[7:].strip() or None
    for name in ("x-api-key", "x-goog-api-key"):
        value = request.headers.get(name)
        if value:
            return value.strip()
    return request.query_params.get("key") or None


def _digest(value: Optional[str]) -> str:
    return hashlib.sha256((value or "").encode()).hexdigest()[:16]


@dataclass
class _Proxy:
    """What every route reads: the sessions, the engines, the bounds."""

    registry: SessionRegistry
    limits: CaptureLimits
    admin_key: str
    model: Optional[str]
    capture_level: str
    max_output_tokens: int
    max_model_calls: int
    require_registered: bool
    default_engine: Optional[InferenceClient]
    instance_id: str = field(default_factory=lambda: secrets.token_hex(8))
    engines: Dict[Tuple[str, ...], InferenceClient] = field(default_factory=dict)
    upstream_slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(64))
    after_call: Optional[Callable[[], Any]] = None  # run once a model call's answer is sent

    def is_admin(self, request: Request) -> bool:
        key = _key_of(request)
        return key is not None and hmac.compare_digest(key.encode(), self.admin_key.encode())

    def engine_for(self, session: CaptureSession) -> Optional[InferenceClient]:
        ref = session.engine
        if ref.llm_url is None:
            return self.default_engine
        key = (ref.llm_url, ref.model or "", ref.auth_header, _digest(ref.api_key), ref.provider)
        engine = self.engines.get(key)
        if engine is None:
            if session.engine_key_lost:
                return None  # its key was never written down; the session's owner registers it again
            engine = InferenceClient(
                ref.llm_url, served_model=ref.model, api_key=ref.api_key, auth_header=ref.auth_header,
                provider=ref.provider, capture_level=session.capture_level,
                timeout_s=self.limits.upstream_timeout_s,
            )  # fmt: skip
            self.engines[key] = engine
        return engine

    def served_model(self, session: CaptureSession, asked: Optional[str]) -> Optional[str]:
        return session.engine.model or self.model or asked

    async def aclose(self) -> None:
        for engine in [self.default_engine, *self.engines.values()]:
            if engine is not None:
                await engine.aclose()


# --- creating sessions ---------------------------------------------------------------------------


def _new_session(proxy: _Proxy, body: Dict[str, Any]) -> Tuple[CaptureSession, bool]:
    """The session ``POST /sessions`` asks for; (session, made now). ``SessionError`` if not."""
    unknown = set(body) - {"session_id", "metadata", "max_model_calls", "sampling", "llm_url", "model", "api_key",
                           "auth_header", "provider", "purpose", "eval_sampling"}  # fmt: skip
    if unknown:
        raise SessionError(f"unknown fields: {', '.join(sorted(unknown))}")
    session_id = body.get("session_id")
    if session_id is None:
        session_id = SessionRegistry.new_id()
    elif not isinstance(session_id, str) or not SESSION_ID.match(session_id):
        raise SessionError(f"session_id must match {SESSION_ID.pattern} (letters, digits, '_', '.', '-'; at most 128)")
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise SessionError("metadata must be an object")
    reserved = RESERVED_METADATA & set(metadata)
    if reserved:
        raise SessionError(f"metadata may not set {', '.join(sorted(reserved))}: they are fields of their own")
    max_calls = body.get("max_model_calls", proxy.max_model_calls)
    if isinstance(max_calls, bool) or not isinstance(max_calls, int) or max_calls < 0:
        raise SessionError("max_model_calls must be an integer >= 0 (0: no limit)")
    purpose = body.get("purpose") or "auto"
    if purpose not in ("auto", "eval", "train"):
        raise SessionError("purpose must be auto, eval or train")
    engine = EngineRef()
    if body.get("llm_url") is not None:
        if not isinstance(body["llm_url"], str):
            raise SessionError("llm_url must be a string")
        engine = EngineRef(
            llm_url=body["llm_url"], model=body.get("model"), provider=body.get("provider") or "openai",
            auth_header=body.get("auth_header") or "Authorization", api_key=body.get("api_key"),
        )  # fmt: skip
    elif body.get("model") is not None:
        engine = EngineRef(model=body["model"])
    level = proxy.capture_level
    try:
        rollout_type = policy.rollout_type_for(purpose, level)
        sampling = policy.training_sampling(body["sampling"]) if body.get("sampling") is not None else None
        eval_sampling = body.get("eval_sampling")
        if eval_sampling is not None:
            if purpose != "eval":
                raise ValueError("eval_sampling is for purpose 'eval' sessions")
            if sampling is not None:
                raise ValueError("an eval session takes eval_sampling, not sampling")
            eval_sampling = policy.evaluation_sampling(eval_sampling)
        if sampling is not None and purpose == "eval":
            raise ValueError("an eval session takes eval_sampling, not sampling")
    except ValueError as exc:
        raise SessionError(str(exc)) from None
    existing = proxy.registry.get(session_id)
    session = CaptureSession(
        session_id=session_id, capture_level=level, rollout_type=rollout_type, purpose=purpose,
        metadata=dict(metadata), max_model_calls=max_calls, sampling=sampling or None,
        eval_sampling=eval_sampling, engine=engine,
    )  # fmt: skip
    if existing is not None:
        same = _settings(existing) == _settings(session)
        if not same:
            raise SessionError(
                f"session {session_id!r} exists with other settings; pick another id or DELETE it first", status=409
            )
        if existing.engine_key_lost and engine.api_key is not None:  # made again after a restart
            existing.engine, existing.engine_key_lost = engine, False
        return existing, False
    return proxy.registry.add(session), True


def _settings(session: CaptureSession) -> Dict[str, Any]:
    """What makes two requests for a session the same (not when it was made, nor whether the
    engine's key survived a restart: the key itself is never kept)."""
    config = {k: v for k, v in session.config().items() if k != "created"}
    config["metadata"] = {k: v for k, v in config["metadata"].items() if k not in PROXY_METADATA}
    config["engine"] = {k: v for k, v in config["engine"].items() if k != "has_api_key"}
    return config


def _session_reply(session: CaptureSession) -> Dict[str, Any]:
    return {
        "session_id": session.session_id,
        "api_key": session.session_id,
        "capture_level": session.capture_level,
        "rollout_type": session.rollout_type,
        "max_model_calls": session.max_model_calls,
        "llm_url": session.engine.llm_url,
        "model": session.engine.model,
    }


# --- the model call ------------------------------------------------------------------------------


class _Refusal(Exception):
    """A call answered with an error in the agent's dialect."""

    def __init__(self, status: int, message: str, code: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def _apply_cap(session: CaptureSession, chat: Dict[str, Any], cap: int) -> Dict[str, Any]:
    """The output cap (the session's ``max_output_tokens`` metadata or the server's); returns the
    sampling the agent asked for, as it asked, for the turn's record."""
    requested = {name: chat[name] for name in SAMPLING_FIELDS if name in chat}
    limit = cap
    wanted = session.metadata.get("max_output_tokens")
    if isinstance(wanted, int) and not isinstance(wanted, bool) and wanted > 0:
        limit = min(limit, wanted)
    for name in ("max_tokens", "max_completion_tokens"):
        value = chat.get(name)
        if isinstance(value, int) and value > limit:
            chat[name] = limit
    if "max_tokens" not in chat and "max_completion_tokens" not in chat:
        chat["max_tokens"] = limit
    return requested


def _budget_reply(asked_model: Optional[str]) -> Dict[str, Any]:
    return {
        "id": f"chatcmpl-budget-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": asked_model or "openenv-capture",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": BUDGET_STOP_TEXT}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


def _zero_fill_usage(answer: Dict[str, Any]) -> None:
    usage = answer.get("usage")
    if not isinstance(usage, dict):
        answer["usage"] = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        return
    for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
        if usage.get(name) is None:
            usage[name] = 0
    for name in ("prompt_tokens_details", "completion_tokens_details"):
        if name in usage and usage[name] is None:
            usage.pop(name)


class _Call:
    """One agent call through the pipeline."""

    def __init__(self, proxy: _Proxy, request: Request, path: str, body: Dict[str, Any], api_type: APIType) -> None:
        self.proxy = proxy
        self.request = request
        self.path = path
        self.body = body
        self.api_type = api_type
        self.dialect = dialect_for(api_type)
        query = request.url.query
        self.stream = self.dialect.stream_requested(path + ("?" + query if query else ""), body)

    def refuse(self, status: int, message: str, code: str = "invalid_request_error") -> Response:
        return JSONResponse(self.dialect.error_body(status, message, code=code), status_code=status)

    def _frames(self, reply: Dict[str, Any]) -> Any:
        if self.api_type is APIType.OPENAI_CHAT:  # its usage chunk, when stream_options asks for one
            return self.dialect.sse(reply, request=self.body)
        return self.dialect.sse(reply)

    def reply(self, chat_answer: Dict[str, Any]) -> Response:
        reply = self.dialect.from_chat(chat_answer, request=self.body, path=self.path)
        if self.stream:
            return StreamingResponse(
                iter(list(self._frames(reply))),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        return Response(_json.dumps(reply), media_type="application/json")

    async def run(self, session: CaptureSession) -> Response:
        proxy = self.proxy
        if not session.budget_left():
            proxy.registry.record_budget_stop(session, "max_model_calls")
            return self.reply(_budget_reply(self.body.get("model")))
        try:
            chat = self.dialect.to_chat(self.body, path=self.path, served_model=proxy.served_model(session, None) or "")
        except DialectError as exc:
            return self.refuse(400, str(exc))
        if chat.get("n", 1) not in (1, None):
            return self.refuse(400, "n must be 1: each call is one turn of one rollout")
        asked_model = self.body.get("model") if isinstance(self.body.get("model"), str) else None
        served = proxy.served_model(session, chat.get("model") or asked_model)
        if served:
            chat["model"] = served
        chat["stream"] = False
        chat.pop("stream_options", None)
        if not chat.get("tools"):
            chat.pop("tools", None)
            chat.pop("tool_choice", None)
            chat.pop("parallel_tool_calls", None)
        requested = _apply_cap(session, chat, proxy.max_output_tokens)
        try:
            engine_request, overridden = policy.prepare_request(
                chat, capture_level=session.capture_level, policy=session.sampling, eval_sampling=session.eval_sampling
            )
        except ValueError as exc:  # a constraining field under a training policy, say
            return self.refuse(400, str(exc))
        if overridden and "sampling_overridden" not in session.metadata:
            proxy.registry.record_metadata(session, {"sampling_overridden": overridden})
            session.findings.append(Finding(level="WARN", code="sampling_neutralised", detail=json.dumps(overridden)))
        engine = proxy.engine_for(session)
        if engine is None:
            why = (
                "its engine's key is never written to the journal, so it did not survive the proxy's restart:"
                " make the session again with llm_url and api_key"
                if session.engine_key_lost
                else "start the proxy with llm_url=..."
            )
            return self.refuse(503, f"no engine serves this session ({why})", "server_error")
        if session.in_flight >= proxy.limits.max_session_calls:
            return self.refuse(
                429,
                f"this session already has {session.in_flight} calls in flight, its limit"
                " (OPENENV_CAPTURE_MAX_SESSION_CALLS); wait for one to finish",
                "rate_limit_error",
            )
        session.in_flight += 1
        try:
            return await self._forward(session, engine, engine_request, requested, asked_model)
        finally:
            session.in_flight -= 1
            session.touch()

    async def _forward(
        self,
        session: CaptureSession,
        engine: InferenceClient,
        engine_request: Dict[str, Any],
        requested: Dict[str, Any],
        asked_model: Optional[str],
    ) -> Response:
        proxy = self.proxy
        if not self.stream:
            try:
                answer = await self._engine_answer(session, engine, engine_request, requested, asked_model)
            except _Refusal as exc:
                return self.refuse(exc.status, str(exc), exc.code)
            return self.reply(answer)
        task = asyncio.ensure_future(self._engine_answer(session, engine, engine_request, requested, asked_model))
        # A stream: wait for the answer for a while so that fast failures keep their status ...
        done, _ = await asyncio.wait({task}, timeout=proxy.limits.keepalive_s)
        if done:
            try:
                answer = task.result()
            except _Refusal as exc:
                return self.refuse(exc.status, str(exc), exc.code)
            return self.reply(answer)
        # ... then commit the headers and keep the connection alive until it comes.
        return StreamingResponse(
            self._slow_stream(task),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def _slow_stream(self, task: asyncio.Future[Dict[str, Any]]) -> AsyncIterator[bytes]:
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self.proxy.limits.keepalive_s)
                if done:
                    break
                yield self.dialect.sse_keepalive()
            try:
                answer = task.result()
            except _Refusal as exc:
                yield self.dialect.sse_error(str(exc), code=exc.code, status=exc.status)
                return
            reply = self.dialect.from_chat(answer, request=self.body, path=self.path)
            for frame in self._frames(reply):
                yield frame
        finally:
            if not task.done():
                task.cancel()

    async def _engine_answer(
        self,
        session: CaptureSession,
        engine: InferenceClient,
        engine_request: Dict[str, Any],
        requested: Dict[str, Any],
        asked_model: Optional[str],
    ) -> Dict[str, Any]:
        """The engine's answer, recorded as a turn; raises :class:`_Refusal` for an error to send."""
        proxy = self.proxy
        limits = proxy.limits
        try:
            if proxy.upstream_slots.locked():
                async with timeout_after(limits.queue_timeout_s):
                    await proxy.upstream_slots.acquire()
            else:
                await proxy.upstream_slots.acquire()
        except TimeoutError:
            raise _Refusal(
                503,
                f"the engine has {limits.max_upstream_calls} calls in flight (OPENENV_CAPTURE_MAX_UPSTREAM_CALLS)"
                f" and this one waited {limits.queue_timeout_s:g} s; try again",
                "server_error",
            ) from None
        try:
            if not session.budget_left():  # re-checked: calls that waited may have used the budget up
                proxy.registry.record_budget_stop(session, "max_model_calls")
                return _budget_reply(asked_model)
            try:
                async with timeout_after(limits.upstream_timeout_s):
                    answer = await engine.completion(engine_request)
            except (TimeoutError, UpstreamTimeoutError) as exc:
                proxy.registry.record_unrecorded_call(session, "timeout", str(exc))
                raise _Refusal(
                    504,
                    f"the engine did not answer within {limits.upstream_timeout_s:g} s"
                    " (OPENENV_CAPTURE_UPSTREAM_TIMEOUT_S)",
                    "timeout_error",
                ) from None
            except UpstreamHTTPError as exc:
                if is_context_length_error(exc):
                    session.findings.append(Finding(level="WARN", code="context_budget_exhausted", detail=str(exc)))
                    proxy.registry.record_budget_stop(session, "context_length")
                    return _budget_reply(asked_model)
                proxy.registry.record_unrecorded_call(session, f"http_{exc.status_code}", str(exc))
                status = exc.status_code if exc.status_code in (400, 413, 422) else 502
                raise _Refusal(status, str(exc), "invalid_request_error" if status < 500 else "api_error") from None
            except UpstreamError as exc:
                proxy.registry.record_unrecorded_call(session, "unreachable", str(exc))
                raise _Refusal(502, str(exc), "api_error") from None
        finally:
            proxy.upstream_slots.release()
        _zero_fill_usage(answer)
        answer = policy.normalize_response(answer, copy=False)  # the proxy's own parse
        harness_session = next(
            (self.request.headers[h] for h in HARNESS_SESSION_HEADERS if h in self.request.headers), None
        )
        node, findings = node_from_exchange(
            engine_request,
            answer,
            node_id=f"n{session.next_index:05d}-{uuid.uuid4().hex[:8]}",
            capture_level=session.capture_level,
            harness_session_id=harness_session,
            requested_sampling=requested,
            graph=session.graph,
            sampling={k: engine_request[k] for k in ("temperature", "top_p", "top_k", "min_p", "seed",
                      "frequency_penalty", "presence_penalty", "repetition_penalty", "max_tokens") if k in engine_request},
        )  # fmt: skip
        if node is None:
            proxy.registry.record_unrecorded_call(session, "no_choices", "; ".join(str(f) for f in findings))
            session.findings.extend(findings)
            raise _Refusal(502, "the engine's answer has no choices", "api_error")
        node.index = session.next_index
        session.next_index += 1
        if "api_type" not in session.metadata:
            proxy.registry.record_metadata(session, {"api_type": self.api_type.value})
        proxy.registry.record_turn(session, node, findings)  # on disk before the agent sees it
        if asked_model:
            answer = {**answer, "model": asked_model}
        return answer


# --- the app -------------------------------------------------------------------------------------


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _Refusal(
            413, f"the request body is {int(declared)} bytes, over the proxy's {limit} (OPENENV_CAPTURE_MAX_BODY_MB)"
        )
    chunks: List[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _Refusal(413, f"the request body is over the proxy's {limit} bytes (OPENENV_CAPTURE_MAX_BODY_MB)")
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(
    *,
    llm_url: str = "",
    model: Optional[str] = None,
    engine: str = "",
    require_registered: bool = True,
    max_output_tokens: int = 8192,
    api_key: Optional[str] = None,
    auth_header: str = "Authorization",
    provider: str = "openai",
    capture_level: str = "tokens",
    admin_key: Optional[str] = None,
    max_model_calls: int = 0,
    journal_dir: Optional[str] = None,
    limits: Optional[CaptureLimits] = None,
    engine_uds: Optional[str] = None,
) -> FastAPI:
    """The capture proxy as an ASGI app (upstream's signature, plus ``journal_dir``, ``limits`` and
    ``engine_uds``). ``admin_key`` None: one is made (``app.state.admin_key``). ``journal_dir``
    None: a fresh temporary directory (no durability across restarts — :class:`CaptureServer`
    and the command line pick a lasting one)."""
    if capture_level not in policy.CAPTURE_LEVELS:
        raise ValueError(f"capture_level must be one of {', '.join(policy.CAPTURE_LEVELS)}, got {capture_level!r}")
    if provider == "anthropic":
        capture_level = "text"
    limits = limits or CaptureLimits.from_env()
    if journal_dir is None:
        import tempfile

        journal_dir = tempfile.mkdtemp(prefix="openenv-capture-")
    journal = Journal(Path(journal_dir), fsync=limits.fsync)
    registry = SessionRegistry(journal, max_sessions=limits.max_sessions, ttl_s=limits.session_ttl_s)
    restored = registry.load()
    url = llm_url or engine
    default_engine = (
        InferenceClient(
            url,
            served_model=model,
            api_key=api_key,
            auth_header=auth_header,
            provider=provider,
            capture_level=capture_level,
            timeout_s=limits.upstream_timeout_s,
            uds=engine_uds,
            max_connections=max(limits.max_upstream_calls, 1),
        )
        if url
        else None
    )
    proxy = _Proxy(
        registry=registry, limits=limits, admin_key=admin_key or secrets.token_urlsafe(24), model=model,
        capture_level=capture_level, max_output_tokens=max_output_tokens, max_model_calls=max_model_calls,
        require_registered=require_registered, default_engine=default_engine,
        upstream_slots=asyncio.Semaphore(limits.max_upstream_calls),
    )  # fmt: skip
    if restored:
        log.info("capture proxy: %d sessions restored from %s", restored, journal_dir)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        reaper = asyncio.ensure_future(_reap(proxy))
        try:
            yield
        finally:
            reaper.cancel()
            await proxy.aclose()

    app = FastAPI(title="OpenEnv capture proxy", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.proxy = proxy
    app.state.instance_id = proxy.instance_id
    app.state.admin_key = proxy.admin_key
    app.state.journal_dir = str(journal_dir)

    def admin(request: Request) -> Optional[JSONResponse]:
        return None if proxy.is_admin(request) else _error(401, ADMIN_REQUIRED)

    def unknown() -> JSONResponse:
        return JSONResponse({"error": "unknown session"}, status_code=404)

    @app.get("/health")
    async def health(request: Request) -> Dict[str, Any]:
        answer: Dict[str, Any] = {
            "status": "ok",
            "instance": proxy.instance_id,
            "upstream": bool(default_engine),
            "engine": "openai-compatible" if default_engine else None,
            "model": model,
            "sessions": len(registry),
            "require_registered": require_registered,
            "capture_level": capture_level,
            "rollout_type": "train" if capture_level == "tokens" else "eval",
            "upstream_auth": bool(api_key),
            "param_fixes": dict(default_engine.param_fixes) if default_engine else {},
        }
        if proxy.is_admin(request):
            answer["upstream"] = default_engine.base_url if default_engine else None
            answer["upstreams"] = sorted({key[0] for key in proxy.engines})
            answer["journal_dir"] = str(journal_dir)
        return answer

    @app.post("/sessions")
    async def create_session(request: Request) -> Response:
        refused = admin(request)
        if refused:
            return refused
        try:
            raw = await _read_body(request, 1 << 20)
            body = json.loads(raw) if raw.strip() else {}
            if not isinstance(body, dict):
                raise SessionError("the body must be a JSON object")
            session, _ = _new_session(proxy, body)
        except ValueError as exc:  # SessionError, bad JSON
            status = getattr(exc, "status", 400)
            return _error(status, str(exc) if isinstance(exc, SessionError) else f"the body is not JSON: {exc}")
        except _Refusal as exc:
            return _error(exc.status, str(exc))
        return JSONResponse(_session_reply(session))

    @app.get("/sessions")
    async def list_sessions(request: Request) -> Response:
        refused = admin(request)
        return refused or JSONResponse({"sessions": [s.summary() for s in registry.all()]})

    def admin_session(request: Request, session_id: str) -> Any:
        """The session an admin route names, or the response that refuses the request."""
        refused = admin(request)
        if refused:
            return refused
        session = registry.get(session_id)
        return session if session is not None else unknown()

    def exported(session: CaptureSession, convert: Any) -> Response:
        """``convert(graph, document)`` of the session's rollout; 409 when it cannot be converted."""
        try:
            document = export_session(session, capture_level=session.capture_level)
            return JSONResponse(convert(session.graph, document))
        except (ValueError, TypeError, KeyError) as exc:
            error = {"error": f"{type(exc).__name__}: {exc}", "session_id": session.session_id}
            return JSONResponse(error, status_code=409)

    @app.get("/sessions/{session_id}")
    async def session_details(session_id: str, request: Request) -> Response:
        found = admin_session(request, session_id)
        return found if isinstance(found, Response) else JSONResponse(found.details())

    @app.get("/sessions/{session_id}/rollout")
    async def session_rollout(
        session_id: str, request: Request, include_discarded: bool = False, include_messages: bool = False
    ) -> Response:
        found = admin_session(request, session_id)
        if isinstance(found, Response):
            return found
        return JSONResponse(
            export_session(
                found,
                include_discarded=include_discarded,
                include_messages=include_messages,
                capture_level=found.capture_level,
            )
        )

    @app.get("/sessions/{session_id}/trace_entries")
    async def session_trace_entries(session_id: str, request: Request) -> Response:
        found = admin_session(request, session_id)
        if isinstance(found, Response):
            return found
        return exported(found, lambda graph, doc: {"session_id": session_id, "entries": to_trace_entries(graph, doc)})

    @app.get("/sessions/{session_id}/training_trace")
    async def session_training_trace(session_id: str, request: Request) -> Response:
        found = admin_session(request, session_id)
        if isinstance(found, Response):
            return found
        return exported(found, lambda graph, doc: to_training_trace(graph, doc).model_dump(mode="json"))

    @app.delete("/sessions/{session_id}")
    async def delete_session(session_id: str, request: Request) -> Response:
        refused = admin(request)
        return refused or JSONResponse({"deleted": registry.delete(session_id)})

    @app.get("/v1/models")
    async def models() -> Response:
        if model:
            return JSONResponse(
                {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "openenv"}]}
            )
        if default_engine is None:
            return JSONResponse({"object": "list", "data": []})
        try:
            return JSONResponse(await default_engine.list_models())
        except UpstreamError as exc:
            return _error(502, str(exc), "api_error")

    async def model_call(path: str, request: Request) -> Response:
        api_type = detect(path, request.headers, {})
        dialect = dialect_for(api_type)
        try:
            raw = await _read_body(request, limits.max_body_bytes)
        except _Refusal as exc:
            return JSONResponse(dialect.error_body(exc.status, str(exc), code=exc.code), status_code=exc.status)
        try:
            body = _json.loads(raw)
        except ValueError as exc:
            return JSONResponse(
                dialect.error_body(400, f"the body is not JSON: {exc}", code="invalid_request_error"), 400
            )
        if not isinstance(body, dict):
            return JSONResponse(
                dialect.error_body(400, "the body must be a JSON object", code="invalid_request_error"), 400
            )
        api_type = detect(path, request.headers, body)
        counted = _count_tokens_reply(api_type, body, path=path)
        if counted is not None:
            return JSONResponse(counted)
        call = _Call(proxy, request, path, body, api_type)
        key = _key_of(request)
        session = registry.get(key) if key else None
        if session is None:
            if key and not require_registered and SESSION_ID.match(key):
                try:
                    session, _ = _new_session(proxy, {"session_id": key})
                except SessionError as exc:
                    return call.refuse(exc.status, str(exc))
            else:
                return call.refuse(
                    401, "unknown API key; register a session via POST /sessions", "authentication_error"
                )
        session.touch()
        try:
            return await call.run(session)
        except Exception as exc:  # the proxy keeps serving; the agent hears what broke
            log.exception("capture proxy: a call of session %s failed", session.session_id)
            return call.refuse(500, f"the capture proxy failed on this call: {type(exc).__name__}: {exc}", "api_error")

    app.add_middleware(_ModelCalls, handler=model_call, proxy=proxy)
    return app


class _ModelCalls:
    """Every POST but ``/sessions`` is an agent's model call: it goes straight to the pipeline,
    past FastAPI's routing and parameter solving: in a pass-through proxy on this stack they cost
    0.1 ms of CPU a call and 0.1 to 0.35 ms of latency (see docs/performance.md)."""

    def __init__(self, app: Any, handler: Any, proxy: _Proxy) -> None:
        self.app = app
        self.handler = handler
        self.proxy = proxy

    async def __call__(self, scope: Dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] != "/sessions":
            response = await self.handler(scope["path"], Request(scope, receive))
            await response(scope, receive, send)
            if self.proxy.after_call is not None:
                self.proxy.after_call()  # the answer is on the wire: the collector's turn
            return
        await self.app(scope, receive, send)


async def _reap(proxy: _Proxy) -> None:
    while True:
        await asyncio.sleep(min(max(proxy.limits.session_ttl_s / 10, 1.0), 300.0))
        expired = proxy.registry.expire()
        if expired:
            log.info("capture proxy: %d idle sessions expired", expired)


# --- the command line ----------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m openenv.core.harness.capture.server",
        description="The capture proxy: agents' model calls in, the engine's exact tokens journalled.",
    )
    parser.add_argument("--llm-url", default="", help="the engine's OpenAI-compatible base URL (vLLM, SGLang)")
    parser.add_argument("--model", default=None, help="the engine's served model name")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--uds", default=None, help="listen on this Unix socket instead of TCP")
    parser.add_argument("--admin-key", default=None, help="(or OPENENV_CAPTURE_ADMIN_KEY; else one is made and kept)")
    parser.add_argument("--api-key", default=None, help="the engine's key")
    parser.add_argument("--auth-header", default="Authorization")
    parser.add_argument("--provider", default="openai", choices=["openai", "vllm", "hf"])
    parser.add_argument("--capture-level", default="tokens", choices=["tokens", "logprobs", "text"])
    parser.add_argument("--max-output-tokens", type=int, default=8192)
    parser.add_argument("--max-model-calls", type=int, default=0)
    parser.add_argument("--journal-dir", default=None)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    import uvicorn

    args = _parser().parse_args(argv)
    if not args.uds and not loopback(args.host) and not (args.admin_key or admin_key_from_env()):
        print(
            f"error: --host {args.host} reaches beyond this machine: choose the admin key"
            " (--admin-key or OPENENV_CAPTURE_ADMIN_KEY)",
            file=sys.stderr,
        )
        return 2
    try:
        sock = listen_socket(args.host, args.port, args.uds)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    port = 0 if args.uds else sock.getsockname()[1]
    listen = f"unix-{args.uds}" if args.uds else f"{args.host}-{port}"
    journal_dir = (
        Path(args.journal_dir)
        if args.journal_dir
        else default_journal_dir(listen, secrets.token_hex(4), args.port == 0)
    )
    admin_key = resolve_admin_key(args.admin_key, journal_dir)
    app = create_app(
        llm_url=args.llm_url, model=args.model, api_key=args.api_key, auth_header=args.auth_header,
        provider=args.provider, capture_level=args.capture_level, admin_key=admin_key,
        max_output_tokens=args.max_output_tokens, max_model_calls=args.max_model_calls,
        journal_dir=str(journal_dir),
    )  # fmt: skip
    where = args.uds or f"http://{args.host}:{port}"
    key_note = (
        "the key you gave" if (args.admin_key or admin_key_from_env()) else f"kept in {journal_dir / ADMIN_KEY_FILE}"
    )
    print(f"capture proxy on {where}; journal {journal_dir}; admin key {key_note}", file=sys.stderr, flush=True)
    config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False)
    with CollectBetweenCalls() as collector:  # this process is the proxy's own: its passes between calls
        app.state.proxy.after_call = collector.after_call
        uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
