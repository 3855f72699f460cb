"""An environment's MCP tools served to an external harness over MCP's streamable HTTP.

:func:`build_bridge_server` gives the view of an environment's FastMCP server that a harness sees:
the same tools, with those whose names collide with the harness's own built-ins renamed. It uses
FastMCP's public ``mount`` (with ``tool_names``), so the view forwards every call to the
environment's server live and nothing is copied. :class:`HarnessMCPBridge` serves a server on
``127.0.0.1`` (an ephemeral port) or on a Unix socket (``uds=``): a sandboxed harness has no route
to the host's loopback, so it reaches the bridge as a service of its
:class:`~.process.HarnessSandbox` (``services={"mcp": bridge.uds}``).

A bridge on a Unix socket is named by an ``http+unix://<percent-encoded socket path><path>`` URL
(:func:`unix_socket_url`; :func:`split_unix_url` reads it back), which adapters translate into the
URL the agent inside its sandbox uses. FastMCP comes with the ``core`` or ``mcp`` extra and is
imported only when a bridge is built.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any, Dict, Mapping, Optional, Tuple, Union
from urllib.parse import quote, unquote, urlsplit

from .errors import HarnessError

BRIDGE_PATH = "/mcp"
"""The URL path the bridge serves MCP at."""


def unix_socket_url(socket_path: Union[str, os.PathLike], path: str = BRIDGE_PATH) -> str:
    """``http+unix://<percent-encoded socket_path><path>``: an HTTP endpoint on a Unix socket."""
    return f"http+unix://{quote(os.fspath(socket_path), safe='')}{path}"


def split_unix_url(url: str) -> Optional[Tuple[str, str]]:
    """``(socket path, URL path)`` of an ``http+unix://`` URL; None for any other URL."""
    parts = urlsplit(url)
    if parts.scheme != "http+unix":
        return None
    return unquote(parts.netloc), parts.path or "/"


async def build_bridge_server(mcp_server: Any, renames: Optional[Mapping[str, str]] = None) -> Any:
    """The server a harness is given: ``mcp_server`` itself, or a view of it with tools renamed.

    ``renames`` maps each injected name to its source tool's name (``{"env_read": "read"}``);
    entries that rename nothing are ignored. A source the server does not have, a source renamed
    twice, or an injected name another tool keeps raise :class:`HarnessError`."""
    renames = {injected: source for injected, source in (renames or {}).items() if injected != source}
    if not renames:
        return mcp_server
    from fastmcp import FastMCP

    try:
        names = {tool.name for tool in await mcp_server.list_tools()}
    except Exception as exc:
        raise HarnessError(f"cannot list the tools of the MCP server to bridge: {exc}") from exc
    unknown = sorted(source for source in renames.values() if source not in names)
    if unknown:
        raise HarnessError(f"cannot rename tools the MCP server does not have: {', '.join(unknown)}")
    by_source: Dict[str, str] = {}
    for injected, source in renames.items():
        if source in by_source:
            raise HarnessError(f"tool {source!r} is renamed twice ({by_source[source]!r} and {injected!r})")
        by_source[source] = injected
    kept = names - set(by_source)
    taken = sorted(injected for injected in by_source.values() if injected in kept)
    if taken:
        raise HarnessError(f"renamed tools would shadow tools of the same name: {', '.join(taken)}")
    view = FastMCP(name=f"{getattr(mcp_server, 'name', None) or 'environment'}-bridge")
    view.mount(mcp_server, tool_names=by_source)
    return view


class HarnessMCPBridge:
    """Serves an MCP server over streamable HTTP at ``<base>/mcp`` on a background thread.

    By default on ``host`` (``127.0.0.1``) at an ephemeral port: :meth:`start` returns
    ``http://127.0.0.1:<port>/mcp``. With ``uds`` it listens on that Unix socket instead (the file
    is made by :meth:`start`, removed by :meth:`stop`) and :attr:`url` is an ``http+unix://`` URL.
    """

    def __init__(
        self,
        mcp_server: Any,
        host: str = "127.0.0.1",
        *,
        uds: Optional[Union[str, os.PathLike]] = None,
        path: str = BRIDGE_PATH,
    ) -> None:
        self.mcp_server = mcp_server
        self.host = host
        self.uds: Optional[str] = os.fspath(uds) if uds is not None else None
        self.path = path
        self._server: Any = None
        self._url: Optional[str] = None
        self._lock = threading.Lock()

    @property
    def url(self) -> Optional[str]:
        """Where the bridge serves, once started (None otherwise)."""
        return self._url

    def start(self, timeout_s: float = 10.0) -> str:
        """Start serving (idempotent) and return :attr:`url`; ``HarnessError`` when it cannot."""
        with self._lock:
            if self._url is not None:
                return self._url
            from openenv.core.env_server.serving.runner import BackgroundServer

            try:
                app = self.mcp_server.http_app(path=self.path)
                if self.uds is not None:
                    if os.path.exists(self.uds) or os.path.islink(self.uds):
                        raise HarnessError(f"{self.uds!r} already exists: is another bridge serving there?")
                    server = BackgroundServer(app, uds=self.uds)
                else:
                    server = BackgroundServer(app, host=self.host, port=0)
                server.start(timeout_s=timeout_s)
            except HarnessError:
                raise
            except Exception as exc:
                raise HarnessError(f"the MCP bridge could not start: {exc}") from exc
            self._server = server
            if self.uds is not None:
                self._url = unix_socket_url(self.uds, self.path)
            else:
                host = f"[{server.host}]" if ":" in server.host else server.host
                self._url = f"http://{host}:{server.port}{self.path}"
            return self._url

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop serving (idempotent); ``HarnessError`` if its thread is still alive after ``timeout_s``."""
        with self._lock:
            server, self._server, self._url = self._server, None, None
            if server is None:
                return
            thread = server._thread  # (BackgroundServer drops it in stop(): checked afterwards)
            server.stop(timeout_s=timeout_s)
            if thread is not None and thread.is_alive():
                raise HarnessError(f"the MCP bridge did not stop within {timeout_s:g} s")

    async def start_async(self, timeout_s: float = 10.0) -> str:
        """:meth:`start` off the event loop."""
        return await asyncio.to_thread(self.start, timeout_s)

    async def stop_async(self, timeout_s: float = 5.0) -> None:
        """:meth:`stop` off the event loop."""
        await asyncio.to_thread(self.stop, timeout_s)

    def __enter__(self) -> HarnessMCPBridge:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"HarnessMCPBridge({self._url or 'stopped'})"


__all__ = ["BRIDGE_PATH", "HarnessMCPBridge", "build_bridge_server", "split_unix_url", "unix_socket_url"]
