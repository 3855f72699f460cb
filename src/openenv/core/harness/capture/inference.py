"""The engine side of the capture proxy: an OpenAI-compatible chat-completions client with the
retries and errors the proxy needs, and :func:`validate_llm`, which finds out what an engine
can give a trainer (token ids and logprobs, logprobs alone, or text).

The proxy never tokenises: it asks the engine (vLLM, SGLang) for its own token ids
(``return_token_ids``) and the logprobs of what it sampled.
"""

from __future__ import annotations

import asyncio
import os
import random
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import urlsplit, urlunsplit

import httpx

from openenv.core.harness.capture import _json

PROVIDERS = ("openai", "vllm", "hf", "anthropic")
RETRIED_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})
# Never dropped or renamed to make an engine accept a request: they are what was asked.
PROTECTED_PARAMS = frozenset(
    {"model", "messages", "input", "stream", "tools", "tool_choice", "temperature", "top_p", "top_k", "min_p",
     "seed", "logprobs", "top_logprobs", "return_token_ids", "presence_penalty", "frequency_penalty",
     "repetition_penalty"}
)  # fmt: skip
MAX_PARAM_FIXES = 6


class UpstreamError(RuntimeError):
    """The engine could not give an answer."""


class UpstreamRequestError(UpstreamError):
    """The request could not be made into one the engine takes."""


class ProviderConversionError(UpstreamRequestError):
    """The request cannot be expressed for this provider."""


class UpstreamHTTPError(UpstreamError):
    """The engine answered with an HTTP error."""

    def __init__(self, status_code: int, body: Any, message: Optional[str] = None) -> None:
        self.status_code = status_code
        self.body = body
        super().__init__(message or f"the engine answered {status_code}: {_error_text(body)}")


class UpstreamTimeoutError(UpstreamError):
    """The engine did not answer in time."""


class UpstreamTransportError(UpstreamError):
    """The engine could not be reached."""


def _error_text(body: Any) -> str:
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict):
            return str(error.get("message") or error)[:500]
        return str(error)[:500]
    return str(body)[:500]


def is_context_length_error(error: UpstreamHTTPError) -> bool:
    """vLLM, SGLang and OpenAI all say so in these words when the prompt does not fit."""
    text = _error_text(error.body).lower()
    return error.status_code == 400 and ("context length" in text or "context_length" in text or "too long" in text)


def _api_base(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"an engine URL must be http(s)://host[:port][/v1], got {url!r}")
    path = parts.path.rstrip("/")
    if not path:
        path = "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


class InferenceClient:
    """An engine's chat-completions endpoint.

    ``base_url`` without a path gets ``/v1``. ``api_key`` is sent in ``auth_header`` (``Bearer``
    added for ``Authorization``). 408/409/429/5xx answers and dropped connections are retried
    three times (``Retry-After`` up to 60 s, else exponential back-off). A 400 that names an
    unsupported parameter which does not change what is sampled gets that parameter dropped,
    remembered in :attr:`param_fixes`; sampling parameters are never changed this way.
    ``uds`` reaches an engine on a Unix socket."""

    def __init__(
        self,
        base_url: str,
        *,
        served_model: Optional[str] = None,
        api_key: Optional[str] = None,
        auth_header: str = "Authorization",
        capture_level: str = "tokens",
        provider: str = "openai",
        timeout_s: float = 600.0,
        max_connections: int = 256,
        uds: Optional[str] = None,
        attempts: int = 3,
    ) -> None:
        if provider not in PROVIDERS:
            raise ValueError(f"provider must be one of {', '.join(PROVIDERS)}, got {provider!r}")
        if provider == "anthropic":
            raise ValueError(
                "an Anthropic engine upstream is not supported by this proxy (it captures token ids, which"
                " Anthropic's API does not give); serve the model with vLLM or SGLang and use provider='openai'"
            )
        self.base_url = _api_base(base_url)
        self.served_model = served_model
        self.capture_level = capture_level
        self.provider = provider
        self.auth_header = auth_header
        self.attempts = max(1, attempts)
        self.param_fixes: Dict[str, str] = {}
        headers = {}
        if api_key:
            headers[auth_header] = f"Bearer {api_key}" if auth_header.lower() == "authorization" else api_key
        self._http = _transport(headers, timeout_s, max_connections, uds)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def list_models(self) -> Dict[str, Any]:
        response = await self._request("GET", "/models", None)
        return response

    async def completion(self, request: Dict[str, Any]) -> Dict[str, Any]:
        """One chat completion (never streamed); the engine's JSON answer."""
        body = dict(request)
        for name in self.param_fixes:
            body.pop(name, None)
        while True:
            try:
                return await self._request("POST", "/chat/completions", body)
            except UpstreamHTTPError as exc:
                fix = self._param_fix(exc, body)
                if fix is None:
                    raise
                self.param_fixes[fix] = "drop"
                body.pop(fix, None)

    def _param_fix(self, error: UpstreamHTTPError, body: Dict[str, Any]) -> Optional[str]:
        if error.status_code != 400 or len(self.param_fixes) >= MAX_PARAM_FIXES:
            return None
        text = _error_text(error.body).lower()
        if not any(word in text for word in ("unrecognized", "unsupported", "not permitted", "unknown", "extra")):
            return None
        for name in body:
            if name not in PROTECTED_PARAMS and name.lower() in text:
                return name
        return None

    async def _request(self, method: str, path: str, body: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        url = self.base_url + path
        data = None if body is None else _json.dumps(body)
        last: Optional[Exception] = None
        for attempt in range(self.attempts):
            try:
                status, headers, raw = await self._http.request(method, url, data)
            except asyncio.TimeoutError as exc:
                raise UpstreamTimeoutError(f"the engine at {self.base_url} did not answer in time") from exc
            except OSError as exc:  # refused, reset, unreachable (each library's errors are wrapped so)
                last = UpstreamTransportError(f"no engine answers at {self.base_url} ({exc})")
                await asyncio.sleep(min(2**attempt * 0.25, 4.0) * (0.5 + random.random()))
                continue
            try:
                payload: Any = _json.loads(raw)
            except ValueError:
                payload = raw.decode("utf-8", "replace")
            if status < 400:
                if not isinstance(payload, dict):
                    raise UpstreamHTTPError(
                        502, payload, f"the engine answered something that is not a JSON object: {str(payload)[:200]}"
                    )
                return payload
            error = UpstreamHTTPError(status, payload)
            if status not in RETRIED_STATUSES or attempt + 1 == self.attempts:
                raise error
            last = error
            await asyncio.sleep(_retry_after(headers.get("retry-after", ""), attempt))
        assert last is not None
        raise last


class _Httpx:
    """Engine calls through httpx (always installed)."""

    def __init__(self, headers: Dict[str, str], timeout_s: float, max_connections: int, uds: Optional[str]) -> None:
        self._client = httpx.AsyncClient(
            headers={**headers, "content-type": "application/json"},
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            transport=httpx.AsyncHTTPTransport(uds=uds) if uds else None,
        )

    async def request(self, method: str, url: str, data: Optional[bytes]) -> Tuple[int, Dict[str, str], bytes]:
        try:
            response = await self._client.request(method, url, content=data)
        except httpx.TimeoutException as exc:
            raise asyncio.TimeoutError(str(exc)) from exc
        except httpx.TransportError as exc:
            raise OSError(f"{type(exc).__name__}: {exc}") from exc
        return response.status_code, {k.lower(): v for k, v in response.headers.items()}, response.content

    async def aclose(self) -> None:
        await self._client.aclose()


class _Aiohttp:
    """Engine calls through aiohttp when it is installed (``pip install 'openenv[capture]'``): about
    half the client-side cost of httpx per call, which is most of what the proxy adds."""

    def __init__(self, headers: Dict[str, str], timeout_s: float, max_connections: int, uds: Optional[str]) -> None:
        self._headers = {**headers, "content-type": "application/json"}
        self._timeout_s = timeout_s
        self._max_connections = max_connections
        self._uds = uds
        self._session: Any = None  # made on the loop that uses it

    def _open(self) -> Any:
        import aiohttp

        if self._session is None or self._session.closed:
            connector = (
                aiohttp.UnixConnector(path=self._uds, limit=self._max_connections)
                if self._uds
                else aiohttp.TCPConnector(limit=self._max_connections, ttl_dns_cache=300)
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=self._timeout_s, connect=min(self._timeout_s, 10.0)),
            )
        return self._session

    async def request(self, method: str, url: str, data: Optional[bytes]) -> Tuple[int, Dict[str, str], bytes]:
        import aiohttp

        try:
            async with self._open().request(method, url, data=data) as response:
                return response.status, {k.lower(): v for k, v in response.headers.items()}, await response.read()
        except aiohttp.ClientConnectionError as exc:
            raise OSError(f"{type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


def _transport(headers: Dict[str, str], timeout_s: float, max_connections: int, uds: Optional[str]) -> Any:
    choice = os.environ.get("OPENENV_CAPTURE_HTTP_CLIENT", "").strip().lower()
    if choice != "httpx":
        try:
            import aiohttp  # noqa: F401
        except ImportError:
            if choice == "aiohttp":
                raise ImportError("OPENENV_CAPTURE_HTTP_CLIENT=aiohttp: pip install 'openenv[capture]'") from None
        else:
            return _Aiohttp(headers, timeout_s, max_connections, uds)
    return _Httpx(headers, timeout_s, max_connections, uds)


def _retry_after(raw: str, attempt: int) -> float:
    try:
        return min(max(float(raw), 0.0), 60.0)
    except ValueError:
        return min(2**attempt * 0.5, 8.0) * (0.5 + random.random())


# --- what an engine can give ---------------------------------------------------------------------


@dataclass
class LLMReport:
    """What :func:`validate_llm` found: whether the engine answers and at which capture level."""

    ok: bool
    llm_url: str
    model: Optional[str]
    findings: List[str] = field(default_factory=list)
    n_prompt_ids: int = 0
    n_completion_ids: int = 0
    served_models: List[str] = field(default_factory=list)
    capture_level: str = "text"
    reachable: bool = False
    param_fixes: Dict[str, str] = field(default_factory=dict)
    tool_support: Optional[bool] = None
    logprobs_mode: Optional[str] = None

    @property
    def trainable(self) -> bool:
        return self.ok and self.capture_level == "tokens"

    @property
    def rollout_type(self) -> str:
        return "train" if self.trainable else "eval"

    def summary(self) -> str:
        state = "ok" if self.ok else "NOT OK"
        lines = [
            f"{self.llm_url} model={self.model!r}: {state}, capture level {self.capture_level}"
            f" ({'trainable' if self.trainable else 'evaluation only'})"
        ]
        lines += [f"  {finding}" for finding in self.findings]
        return "\n".join(lines)


def _probe_body(model: Optional[str]) -> Dict[str, Any]:
    body: Dict[str, Any] = {
        "messages": [{"role": "user", "content": "Say OK."}],
        "max_tokens": 4,
        "temperature": 1.0,
        "logprobs": True,
        "top_logprobs": 0,
        "return_token_ids": True,
    }
    if model:
        body["model"] = model
    return body


def validate_llm(
    llm_url: str,
    model: Optional[str],
    *,
    provider: str = "openai",
    timeout: float = 120.0,
    api_key: Optional[str] = None,
    auth_header: str = "Authorization",
    check_logprobs_mode: bool = True,
    check_tools: bool = True,
) -> LLMReport:
    """Ask the engine one short question and report what it gives back (blocking)."""

    async def probe(model: Optional[str]) -> LLMReport:
        report = LLMReport(ok=False, llm_url=llm_url, model=model)
        try:
            client = InferenceClient(llm_url, served_model=model, api_key=api_key, auth_header=auth_header,
                                     provider=provider, timeout_s=timeout, attempts=1)  # fmt: skip
        except ValueError as exc:
            report.findings.append(f"[FATAL] bad_engine: {exc}")
            return report
        try:
            try:
                models = await client.list_models()
                report.served_models = [m.get("id") for m in models.get("data", []) if isinstance(m, dict)]
                report.reachable = True
            except UpstreamHTTPError as exc:
                report.reachable = True
                report.findings.append(f"[WARN] no_model_list: {exc}")
            except UpstreamError as exc:
                report.findings.append(f"[FATAL] unreachable: {exc}")
                return report
            if model is None and report.served_models:
                report.model = model = report.served_models[0]
            try:
                answer = await client.completion(_probe_body(model))
            except UpstreamError as exc:
                report.findings.append(f"[FATAL] completion_failed: {exc}")
                return report
            report.reachable = True
            report.param_fixes = dict(client.param_fixes)
            choice = (answer.get("choices") or [{}])[0]
            prompt_ids = answer.get("prompt_token_ids") or choice.get("prompt_token_ids") or []
            completion_ids = choice.get("token_ids") or []
            logprobs = ((choice.get("logprobs") or {}).get("content")) or []
            report.n_prompt_ids, report.n_completion_ids = len(prompt_ids), len(completion_ids)
            if prompt_ids and completion_ids and len(logprobs) == len(completion_ids):
                report.capture_level = "tokens"
            elif logprobs:
                report.capture_level = "logprobs"
                report.findings.append("[WARN] no_token_ids: the engine gives no token ids (vLLM >= 0.10.2 does)")
            else:
                report.capture_level = "text"
                report.findings.append("[WARN] no_logprobs: the engine gives neither token ids nor logprobs")
            if check_tools:
                report.tool_support = await _tools_accepted(client, model)
            report.ok = True
            return report
        finally:
            await client.aclose()

    return _run_blocking(probe(model))


async def _tools_accepted(client: InferenceClient, model: Optional[str]) -> bool:
    body = {
        "messages": [{"role": "user", "content": "Call the tool."}],
        "max_tokens": 4,
        "tools": [
            {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}}
        ],
    }
    if model:
        body["model"] = model
    try:
        await client.completion(body)
        return True
    except UpstreamError:
        return False


def require_llm(
    llm_url: str,
    model: Optional[str],
    *,
    timeout: float = 120.0,
    api_key: Optional[str] = None,
    auth_header: str = "Authorization",
    require_tokens: bool = False,
) -> LLMReport:
    """:func:`validate_llm`, raising ``RuntimeError`` when the engine is unusable (or, with
    ``require_tokens``, cannot give token ids and logprobs for training)."""
    report = validate_llm(llm_url, model, timeout=timeout, api_key=api_key, auth_header=auth_header)
    if not report.ok:
        raise RuntimeError(f"the engine cannot be used:\n{report.summary()}")
    if require_tokens and not report.trainable:
        raise RuntimeError(f"the engine cannot give token ids and logprobs for training:\n{report.summary()}")
    return report


def _run_blocking(coroutine: Any) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    # Called from a running loop (a notebook, an async trainer): run it on a loop of its own.
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()
