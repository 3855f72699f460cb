"""A TCP front for a server that listens on a Unix socket.

Sandboxed servers listen on a Unix socket in their own directory (no network namespace to
reach). :class:`UnixForwarder` accepts TCP connections and relays each one, byte for byte, to
that socket: HTTP, WebSocket upgrades and everything after them pass through untouched, so
``http://127.0.0.1:8000`` reaches the sandbox with any client. :class:`TCPRelay` is what it shares
with the front of several servers (:mod:`.front`). The target may change while it
runs (``openenv serve --reload`` swaps in a restarted server): connections open at the time
stay on the old server, new ones go to the new one.

Behind the forwarder every client reaches the server from the same Unix socket, so the server
cannot tell them apart: the forwarder applies the per-client connection caps itself, as a server
does: ``max_per_client`` (by default ``OPENENV_MAX_CONNECTIONS_PER_CLIENT``: 256) to each remote
address, ``max_local`` (``OPENENV_MAX_LOCAL_CONNECTIONS``: 0, none) to this machine's clients
together.

Every relayed connection holds two descriptors (the client's and the server's), so at start-up
the forwarder raises its process's soft limit of open descriptors to the hard one (the usual soft
limit, 1,024, would run out at about 500 connections) and holds at most
``(soft limit - DESCRIPTORS_KEPT) / 2`` connections at once: one more is answered 503 and closed at
once, and the connections it holds can always reach their server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import time
from typing import Dict, Optional, Set, Tuple

from ...env_server.limits import ConnectionTable, ServerLimits, address_of, unavailable
from ...utils import within

logger = logging.getLogger(__name__)

_CHUNK = 256 * 1024
DESCRIPTORS_KEPT = 128
"""Descriptors a forwarder leaves to the rest of its process (log files, pipes to the servers, its
own queries to them); the others, two per connection, bound the connections it holds at once."""


def _full(limit: int) -> bytes:
    return unavailable(
        f"the server holds as many connections as its descriptors allow ({limit}; raise the hard limit of "
        "open files, ulimit -Hn, to hold more); retry shortly",
        "SERVER_BUSY",
    )


_STARTING = unavailable("the environment server is starting; retry in a moment", "SERVER_BUSY", 1)
_UNREACHABLE = unavailable("the environment server is not available right now; retry shortly", "SERVER_BUSY", 1)


async def _refuse(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter, answer: bytes) -> None:
    """Send ``answer`` and end the connection so that the client reads all of it: the request it
    sent is read and dropped for a moment, as closing with unread data would reset the connection."""
    with contextlib.suppress(OSError):
        client_writer.write(answer)
        await client_writer.drain()
        client_writer.write_eof()
        await linger(client_reader)


def raise_descriptor_limit() -> int:
    """Raise this process's soft limit of open descriptors (``RLIMIT_NOFILE``) to its hard limit,
    and return the soft limit in force: what a front of many connections may use. The soft limit
    exists for programs that pass descriptors to ``select()``, which takes none above 1,023; the
    event loop uses ``epoll``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError) as exc:  # a kernel that caps it lower (nr_open): keep what we have
            logger.warning("could not raise the limit of open files from %d to %d: %s", soft, wanted, exc)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def _strip_unix(target: str) -> str:
    return target[len("unix://") :] if target.startswith("unix://") else target


class TCPRelay:
    """What every TCP front of Unix-socket servers shares: the listener on ``host:port``, the
    per-client connection caps, the cap on all connections its descriptors allow, and cutting
    every relayed connection on :meth:`close`. A subclass says what to do with each accepted
    connection (:meth:`relay`); it opens at most one connection to a server at a time for each.

    ``max_per_client`` caps each remote address, ``max_local`` this machine's clients together (0:
    no cap; None: ``OPENENV_MAX_CONNECTIONS_PER_CLIENT``, ``OPENENV_MAX_LOCAL_CONNECTIONS``);
    ``cap_local`` counts each loopback address as a remote one (tests)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 8000,
        max_per_client: Optional[int] = None,
        cap_local: bool = False,
        max_local: Optional[int] = None,
    ) -> None:
        self.host = host
        self.port = port
        if max_per_client is None or max_local is None:
            limits = ServerLimits.from_env()
            max_per_client = limits.max_connections_per_client if max_per_client is None else max_per_client
            max_local = limits.max_local_connections if max_local is None else max_local
        self.table = ConnectionTable(max_per_client, max_local)
        """Open connections per client address (the same table and refusal as a server's)."""
        self.cap_local = cap_local
        self.connections = 0  # connections open, refused ones until they are closed too
        self.max_connections: Optional[int] = None  # set by start(), from the descriptors allowed
        self._server: Optional[asyncio.AbstractServer] = None
        self._tasks: Set[asyncio.Task] = set()

    @property
    def open(self) -> Dict[str, int]:
        """Connections open per client address (or LOCAL): its :attr:`table`'s count."""
        return self.table.open

    @property
    def address(self) -> Tuple[str, int]:
        """The bound ``(host, port)`` (the real port when 0 was asked for)."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("start() the forwarder first")
        return self._server.sockets[0].getsockname()[:2]

    async def start(self) -> Tuple[str, int]:
        """Bind and start accepting; ``OSError`` (e.g. the port is taken) propagates. Raises the
        process's soft limit of open descriptors first (:func:`raise_descriptor_limit`)."""
        self.max_connections = max(1, (raise_descriptor_limit() - DESCRIPTORS_KEPT) // 2)
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
        self.connections += 1
        try:
            if self.max_connections is not None and self.connections > self.max_connections:
                # Closed at once, unread: a lingering refusal would hold the descriptor it protects.
                with contextlib.suppress(OSError):
                    client_writer.write(_full(self.max_connections))
                client_writer.close()
                return
            address = address_of(client_writer.get_extra_info("peername"), self.cap_local)
            if not self.table.admit(address):
                await _refuse(client_reader, client_writer, self.table.refusal(address))
                client_writer.close()
                return
            self._tasks.add(task)
            try:
                await self.relay(client_reader, client_writer)
            except (ConnectionError, OSError, asyncio.CancelledError):
                pass  # either side went away, or close() cut it: the connection's task ends here
            finally:
                client_writer.close()
                self._tasks.discard(task)
                self.table.leave(address)
        finally:
            self.connections -= 1


class UnixForwarder(TCPRelay):
    """Relay TCP connections on ``host:port`` to the Unix socket ``target`` (a path or ``unix://``).

    ``target`` may be None while the server is still starting (the forwarder listens first, so
    that a taken port fails before anything starts): a client is then answered 503
    (``SERVER_BUSY``, "the environment server is starting", ``Retry-After: 1``) until
    :meth:`retarget` names the server."""

    def __init__(
        self,
        target: Optional[str],
        host: str = "127.0.0.1",
        port: int = 8000,
        max_per_client: Optional[int] = None,
        cap_local: bool = False,
        max_local: Optional[int] = None,
    ) -> None:
        super().__init__(host, port, max_per_client, cap_local, max_local)
        self.target = _strip_unix(target) if target else None

    def retarget(self, target: str) -> None:
        """Send new connections to ``target`` from now on."""
        self.target = _strip_unix(target)

    async def relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        target = self.target
        if target is None:
            await _refuse(client_reader, client_writer, _STARTING)
            return
        try:
            server_reader, server_writer = await asyncio.open_unix_connection(target, limit=_CHUNK)
        except OSError as exc:
            logger.warning("cannot reach the environment server at %s: %s", target, exc)
            await _refuse(client_reader, client_writer, _UNREACHABLE)
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
