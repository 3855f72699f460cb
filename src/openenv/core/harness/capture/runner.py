"""Running the capture proxy: :class:`CaptureServer` (in a thread of this process) and the command
line ``python -m openenv.core.harness.capture.server`` (a process of its own).

Both listen on 127.0.0.1 (or a Unix socket) unless told otherwise, always guard the admin routes
with a key, and journal every session under a directory that a restart on the same address finds
again (see :mod:`openenv.core.harness.capture.settings`).
"""

from __future__ import annotations

import secrets
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import httpx

from openenv.core.harness.capture.listen import listen_socket, loopback, resolve_admin_key
from openenv.core.harness.capture.settings import CaptureLimits, admin_key_from_env, default_journal_dir


class CaptureServer:
    """The capture proxy in a background thread of this process.

    ``CaptureServer(llm_url="http://127.0.0.1:8000", model="my-model").start()`` then point an
    agent at :attr:`url` with a session's key from :meth:`create_session`. Upstream's keywords,
    plus ``host`` (127.0.0.1), ``uds`` (a Unix socket instead of TCP), ``journal_dir`` and
    ``limits``. ``port=0`` picks a free port."""

    def __init__(
        self,
        *,
        llm_url: str,
        model: Optional[str] = None,
        port: int = 8100,
        max_output_tokens: int = 8192,
        api_key: Optional[str] = None,
        auth_header: str = "Authorization",
        capture_level: str = "tokens",
        provider: str = "openai",
        admin_key: Optional[str] = None,
        max_model_calls: int = 0,
        host: str = "127.0.0.1",
        uds: Optional[str] = None,
        journal_dir: Optional[str] = None,
        limits: Optional[CaptureLimits] = None,
        engine_uds: Optional[str] = None,
    ) -> None:
        from openenv.core.harness.capture.server import create_app

        if not uds and not loopback(host) and not (admin_key or admin_key_from_env()):
            raise ValueError(
                f"listening on {host} (beyond this machine) needs an admin key you chose:"
                " pass admin_key=... or set OPENENV_CAPTURE_ADMIN_KEY"
            )
        self.host = host
        self.uds = uds
        self._sock = listen_socket(host, port, uds)
        self.port = 0 if uds else self._sock.getsockname()[1]
        listen = f"unix-{uds}" if uds else f"{host}-{self.port}"
        instance = secrets.token_hex(4)
        self.journal_dir = (
            Path(journal_dir) if journal_dir else default_journal_dir(listen, instance, port == 0 and not uds)
        )
        self.admin_key = resolve_admin_key(admin_key, self.journal_dir)
        self.capture_level = "text" if provider == "anthropic" else capture_level
        self.app = create_app(
            llm_url=llm_url, model=model, max_output_tokens=max_output_tokens, api_key=api_key,
            auth_header=auth_header, provider=provider, capture_level=capture_level, admin_key=self.admin_key,
            max_model_calls=max_model_calls, journal_dir=str(self.journal_dir), limits=limits,
            engine_uds=engine_uds,
        )  # fmt: skip
        self._server: Any = None
        self._thread: Optional[threading.Thread] = None
        self._admin: Optional[httpx.Client] = None

    # --- where it is ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The base URL agents use (``http://127.0.0.1:PORT``; on a Unix socket, ``http://capture``)."""
        if self.uds:
            return "http://capture"
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    @property
    def registry(self) -> Any:
        """The live sessions (a :class:`~openenv.core.harness.capture.sessions.SessionRegistry`)."""
        return self.app.state.proxy.registry

    @property
    def inference(self) -> Any:
        return self.app.state.proxy.default_engine

    # --- lifecycle --------------------------------------------------------------------------

    def start(self, timeout_s: float = 30.0) -> CaptureServer:
        import uvicorn

        if self._thread is not None:
            raise RuntimeError("this CaptureServer is already started")
        config = uvicorn.Config(self.app, log_level="warning", lifespan="on", access_log=False)
        self._server = uvicorn.Server(config)
        self._server.install_signal_handlers = lambda: None  # type: ignore[method-assign]  # (a thread)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name="openenv-capture", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self._thread.is_alive():
                raise RuntimeError("the capture proxy's server thread ended while starting (see the log above)")
            try:
                health = self._client().get("/health", timeout=2.0).json()
            except (httpx.HTTPError, ValueError):
                time.sleep(0.02)
                continue
            if health.get("instance") != self.app.state.instance_id:
                raise RuntimeError(f"another server answers at {self.url}")
            return self
        raise RuntimeError(f"the capture proxy did not answer at {self.url} within {timeout_s:g} s")

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        try:
            self._sock.close()
        except OSError:
            pass
        if self.uds:
            try:
                Path(self.uds).unlink()
            except FileNotFoundError:
                pass

    def __enter__(self) -> CaptureServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # --- the admin routes, from Python ------------------------------------------------------

    def _client(self) -> httpx.Client:
        if self._admin is None:
            transport = httpx.HTTPTransport(uds=self.uds) if self.uds else None
            self._admin = httpx.Client(
                base_url=self.url, headers={"Authorization": f"Bearer {self.admin_key}"}, transport=transport
            )
        return self._admin

    def _admin_call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._client().request(method, path, **kwargs)
        if response.status_code >= 400:
            raise RuntimeError(f"{method} {path}: {response.status_code} {response.text[:500]}")
        return response.json()

    def create_session(self, **fields: Any) -> Dict[str, Any]:
        """``POST /sessions``; the reply's ``api_key`` (= ``session_id``) is the agent's key."""
        return self._admin_call("POST", "/sessions", json=fields)

    def rollout(
        self, session_id: str, *, include_discarded: bool = False, include_messages: bool = False
    ) -> Dict[str, Any]:
        params = {"include_discarded": include_discarded, "include_messages": include_messages}
        return self._admin_call("GET", f"/sessions/{session_id}/rollout", params=params)

    def trace_entries(self, session_id: str) -> List[Dict[str, Any]]:
        return self._admin_call("GET", f"/sessions/{session_id}/trace_entries")["entries"]

    def training_trace(self, session_id: str) -> Any:
        from openenv.core.harness.training import TrainingTrace

        return TrainingTrace.model_validate(self._admin_call("GET", f"/sessions/{session_id}/training_trace"))

    def delete_session(self, session_id: str) -> bool:
        return bool(self._admin_call("DELETE", f"/sessions/{session_id}")["deleted"])
