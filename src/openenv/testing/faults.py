"""A fault-injecting TCP proxy, for testing what a client and a server do when the network fails.

:class:`FaultProxy` listens on 127.0.0.1 and relays each connection to a target server, on a
thread of its own (so sync and async tests alike can use it). Its faults act on one live
connection (a random one unless named) at a time, or keep coming (:meth:`FaultProxy.chaos`):

* ``reset``: both sides get a TCP reset, at once;
* ``cut``: the next chunk from the client is relayed in part (the server gets a frame cut
  mid-way), then the connection is reset;
* ``after_request``: the next chunk from the client reaches the server whole, then the connection
  is reset before any answer gets back (a call that runs while its client is cut off);
* ``half_close``: the server sees the client's side end (EOF); what the server sends still flows;
* ``stall``: nothing flows either way for ``stall_s``, then the connection is reset (a dead link
  that neither side is told about).

Set ``latency_s`` to hold every chunk that long before it is relayed, either way (a far-away
server: a round trip then takes twice that).

::

    with BackgroundServer(app) as server, FaultProxy(server.port) as proxy:
        client = MyEnv(base_url=proxy.base_url)
        ...
        proxy.fault("reset")
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
from typing import Any, List, Optional, Sequence, Set

FAULTS = ("reset", "cut", "after_request", "half_close", "stall")


class _Link:
    """One relayed connection: the client's side and the server's."""

    def __init__(self, client: asyncio.StreamWriter, server: asyncio.StreamWriter) -> None:
        self.client = client
        self.server = server
        self.pending: Optional[str] = None  # a fault waiting for the client's next chunk
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.dead = False
        self.half_closed = False  # the server was told the client's side ended
        self.muted = False  # what the server sends is dropped

    def reset(self) -> None:
        if self.dead:
            return
        self.dead = True
        for writer in (self.client, self.server):
            sock = writer.get_extra_info("socket")
            try:  # linger 0: close() sends a reset, not a FIN
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
            writer.transport.abort()
        self.flowing.set()


class FaultProxy:
    """See the module docstring. ``port`` (or ``base_url``) is where clients connect."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1", seed: Optional[int] = None) -> None:
        self.target = (target_host, target_port)
        self.random = random.Random(seed)
        self.port = 0
        self.links: Set[_Link] = set()
        self.injected = {name: 0 for name in FAULTS}
        self.accepted = 0
        self.stall_s = 1.0
        self.latency_s = 0.0
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._server: Optional[asyncio.AbstractServer] = None
        self._thread: Optional[threading.Thread] = None
        self._chaos: Optional[asyncio.Task] = None
        self._relays: Set[asyncio.Task] = set()
        self._ready = threading.Event()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        self._thread = threading.Thread(target=self._run, name="openenv-fault-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fault proxy did not start within 10 s")
        return self

    def _run(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        try:
            self._server = loop.run_until_complete(asyncio.start_server(self._accept, "127.0.0.1", 0))
            self.port = self._server.sockets[0].getsockname()[1]
            self._ready.set()
            loop.run_forever()
        finally:
            loop.close()

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return

        async def shut() -> None:
            if self._chaos is not None:
                self._chaos.cancel()
            assert self._server is not None
            self._server.close()
            for link in list(self.links):
                link.reset()
            if self._relays:  # each ends once its connection is reset
                await asyncio.wait(set(self._relays), timeout=5)

        asyncio.run_coroutine_threadsafe(shut(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # --- faults -----------------------------------------------------------------------------

    def fault(self, kind: str = "reset") -> bool:
        """Inject ``kind`` on a random live connection now; False when none is live."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(self._inject(kind), self._loop).result(10)

    def chaos(self, period_s: float, kinds: Sequence[str] = ("reset",)) -> None:
        """Inject one of ``kinds`` on a random live connection every ~``period_s`` (jittered),
        until :meth:`calm` or :meth:`stop`."""
        assert self._loop is not None

        async def run() -> None:
            while True:
                await asyncio.sleep(period_s * self.random.uniform(0.5, 1.5))
                await self._inject(self.random.choice(list(kinds)))

        def begin() -> None:
            self._chaos = self._loop.create_task(run())  # type: ignore[union-attr]

        self._loop.call_soon_threadsafe(begin)

    def calm(self) -> None:
        """Stop :meth:`chaos`."""
        assert self._loop is not None

        def end() -> None:
            if self._chaos is not None:
                self._chaos.cancel()
                self._chaos = None

        self._loop.call_soon_threadsafe(end)

    async def _inject(self, kind: str) -> bool:
        if kind not in FAULTS:
            raise ValueError(f"unknown fault {kind!r}: one of {', '.join(FAULTS)}")
        live: List[_Link] = [link for link in self.links if not link.dead]
        if not live:
            return False
        link = self.random.choice(live)
        self.injected[kind] += 1
        if kind == "reset":
            link.reset()
        elif kind in ("cut", "after_request"):
            link.pending = kind
        elif kind == "half_close":
            link.pending = None
            if link.server.can_write_eof():
                link.server.write_eof()
            link.half_closed = True
        else:  # stall
            link.flowing.clear()
            self._loop.call_later(self.stall_s, link.reset)  # type: ignore[union-attr]
        return True

    # --- relaying ---------------------------------------------------------------------------

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        task = asyncio.current_task()
        assert task is not None
        self._relays.add(task)
        task.add_done_callback(self._relays.discard)
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.transport.abort()
            return
        link = _Link(client_writer, server_writer)
        self.links.add(link)
        try:
            await asyncio.gather(
                self._pump(link, client_reader, server_writer, upstream=True),
                self._pump(link, server_reader, client_writer, upstream=False),
            )
        finally:
            self.links.discard(link)
            link.reset()

    async def _pump(
        self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upstream: bool
    ) -> None:
        try:
            while not link.dead:
                data = await reader.read(65536)
                if self.latency_s:
                    await asyncio.sleep(self.latency_s)
                await link.flowing.wait()
                if link.dead:
                    return
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                if (upstream and link.half_closed) or (not upstream and link.muted):
                    continue
                fault, link.pending = (link.pending, None) if upstream else (None, link.pending)
                if fault == "cut":
                    writer.write(data[: self.random.randrange(len(data))] if len(data) > 1 else b"")
                    await writer.drain()
                    link.reset()
                    return
                if fault == "after_request":
                    link.muted = True  # it reaches the server; its answer does not come back
                writer.write(data)
                await writer.drain()
                if fault == "after_request":
                    await asyncio.sleep(0.02)
                    link.reset()
                    return
        except (ConnectionError, OSError):
            link.reset()
