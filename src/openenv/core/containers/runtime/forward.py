"""A TCP front for a server that listens on a Unix socket.

Sandboxed servers listen on a Unix socket in their own directory (no network namespace to
reach). :class:`UnixForwarder` accepts TCP connections and relays each one, byte for byte, to
that socket: HTTP, WebSocket upgrades and everything after them pass through untouched, so
``http://127.0.0.1:8000`` reaches the sandbox with any client. :class:`TCPRelay` is what it shares
with the front of several servers (:mod:`.front`). The target may change while it
runs (``openenv serve --reload`` swaps in a restarted server): connections open at the time
stay on the old server, new ones go to the new one.

Behind the forwarder every client reaches the server from the same Unix socket, so the server
cannot tell them apart: the forwarder applies the per-client connection cap itself
(``max_per_client``, by default ``OPENENV_MAX_CONNECTIONS_PER_CLIENT``: 256) to each remote
address; clients on this machine are not capped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Dict, Optional, Set, Tuple

from ...utils import is_loopback_ip, within

logger = logging.getLogger(__name__)

_CHUNK = 256 * 1024
_UNAVAILABLE = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b'content-length: 62\r\n\r\n{"detail":"the environment server is not available right now."}'
)


def _too_many(address: str, cap: int) -> bytes:
    body = (
        f'{{"detail":"too many connections from {address} (the server allows {cap} per client address, '
        f'OPENENV_MAX_CONNECTIONS_PER_CLIENT); close some and retry","code":"TOO_MANY_CONNECTIONS"}}'
    ).encode()
    head = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
    return head + b"content-length: %d\r\n\r\n" % len(body) + body


def _strip_unix(target: str) -> str:
    return target[len("unix://") :] if target.startswith("unix://") else target


class TCPRelay:
    """What every TCP front of Unix-socket servers shares: the listener on ``host:port``, the
    per-client connection cap, and cutting every relayed connection on :meth:`close`. A subclass
    says what to do with each accepted connection (:meth:`relay`)."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 8000, max_per_client: Optional[int] = None, cap_local: bool = False
    ) -> None:
        self.host = host
        self.port = port
        if max_per_client is None:
            from ...env_server.limits import ServerLimits

            max_per_client = ServerLimits.from_env().max_connections_per_client
        self.max_per_client = max_per_client
        self.cap_local = cap_local  # count this machine's clients too (tests)
        self.open: Dict[str, int] = {}  # remote address -> connections open
        self._server: Optional[asyncio.AbstractServer] = None
        self._tasks: Set[asyncio.Task] = set()

    @property
    def address(self) -> Tuple[str, int]:
        """The bound ``(host, port)`` (the real port when 0 was asked for)."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("start() the forwarder first")
        return self._server.sockets[0].getsockname()[:2]

    async def start(self) -> Tuple[str, int]:
        """Bind and start accepting; ``OSError`` (e.g. the port is taken) propagates."""
        self._server = await asyncio.start_server(self._accept, self.host, self.port, limit=_CHUNK, backlog=4096)
        return self.address

    async def close(self) -> None:
        """Stop accepting and cut every relayed connection."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await within(self._server.wait_closed(), 2.0)
            self._server = None

    async def relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        """Serve one accepted connection (the caller closes ``client_writer`` afterwards)."""
        raise NotImplementedError

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        peer = client_writer.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if not self.cap_local and (is_loopback_ip(address) or not address):
            address = ""  # this machine: not capped
        elif self.max_per_client and self.open.get(address, 0) >= self.max_per_client:
            with contextlib.suppress(OSError):
                client_writer.write(_too_many(address, self.max_per_client))
                await client_writer.drain()
                client_writer.write_eof()
                await linger(client_reader)
            client_writer.close()
            return
        if address:
            self.open[address] = self.open.get(address, 0) + 1
        self._tasks.add(task)
        try:
            await self.relay(client_reader, client_writer)
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass  # either side went away, or close() cut it: the connection's task ends here
        finally:
            client_writer.close()
            self._tasks.discard(task)
            if address:
                left = self.open.get(address, 0) - 1
                if left > 0:
                    self.open[address] = left
                else:
                    self.open.pop(address, None)


class UnixForwarder(TCPRelay):
    """Relay TCP connections on ``host:port`` to the Unix socket ``target`` (a path or ``unix://``)."""

    def __init__(
        self,
        target: str,
        host: str = "127.0.0.1",
        port: int = 8000,
        max_per_client: Optional[int] = None,
        cap_local: bool = False,
    ) -> None:
        super().__init__(host, port, max_per_client, cap_local)
        self.target = _strip_unix(target)

    def retarget(self, target: str) -> None:
        """Send new connections to ``target`` from now on."""
        self.target = _strip_unix(target)

    async def relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_unix_connection(self.target, limit=_CHUNK)
        except OSError as exc:
            logger.warning("cannot reach the environment server at %s: %s", self.target, exc)
            client_writer.write(_UNAVAILABLE)
            await client_writer.drain()
            return
        await splice(client_reader, client_writer, server_reader, server_writer)


async def linger(reader: asyncio.StreamReader, seconds: float = 1.0) -> None:
    """Read what the client still sends, for a moment: closing with unread data would reset the
    connection, and the client might lose the answer."""
    deadline = time.monotonic() + seconds
    with contextlib.suppress(Exception):
        while time.monotonic() < deadline:
            if not await within(reader.read(_CHUNK), max(deadline - time.monotonic(), 0.0)):
                return


async def splice(
    client_reader: asyncio.StreamReader,
    client_writer: asyncio.StreamWriter,
    server_reader: asyncio.StreamReader,
    server_writer: asyncio.StreamWriter,
) -> None:
    """Copy both ways until the server's side ends, then close the server's side."""
    upstream = asyncio.ensure_future(_pipe(client_reader, server_writer))
    try:
        # The server's side decides: once it has closed, the connection is over (a client that
        # half-closed first still gets the whole answer before that).
        await _pipe(server_reader, client_writer)
    finally:
        upstream.cancel()
        with contextlib.suppress(BaseException):
            await upstream
        server_writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until EOF, then pass the half-close on (HTTP clients may shut down their side first)."""
    try:
        while True:
            data = await reader.read(_CHUNK)
            if not data:
                break
            writer.write(data)
            if writer.transport.get_write_buffer_size() > _CHUNK:
                await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()
