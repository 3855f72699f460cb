"""Small helpers shared by clients and providers."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import ipaddress
import json
import os
import re
import stat
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Iterator, List, Optional, Tuple, TypeVar, Union
from urllib.parse import urlsplit, urlunsplit

T = TypeVar("T")


@dataclass(frozen=True)
class Endpoint:
    """Where a server listens: an HTTP(S) base URL, or a Unix socket path.

    ``http_url`` is the base for HTTP requests and ``ws_url`` the one for WebSockets (both use the
    host ``localhost`` when the server is on a Unix socket, whose path is ``uds``).
    """

    http_url: str
    ws_url: str
    uds: Optional[str] = None

    @property
    def host(self) -> str:
        """The URL's host name (``localhost`` for a Unix socket)."""
        return urlsplit(self.http_url).hostname or ""

    @property
    def is_loopback(self) -> bool:
        """Whether the server is reached without leaving this host (for the proxy choice):
        also ``*.localhost`` names and the "all interfaces" addresses often pasted as a URL."""
        if self.uds:
            return True
        host = self.host
        if host == "localhost" or host.endswith(".localhost"):
            return True
        address = _ip_address(host)
        return address is not None and (address.is_loopback or address.is_unspecified)  # 0.0.0.0, ::

    @property
    def is_certainly_local(self) -> bool:
        """Whether the server is on this machine beyond doubt: a Unix socket, ``localhost`` or a
        loopback address (what may receive a secret meant for this machine's servers)."""
        return bool(self.uds) or is_local_host(self.host)


def _ip_address(host: str) -> Optional[Union[ipaddress.IPv4Address, ipaddress.IPv6Address]]:
    """``host`` as an IP address (an IPv4-mapped IPv6 one as its IPv4 address), or None for a name."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # ::ffff:127.0.0.1
    return address


def is_loopback_ip(host: str) -> bool:
    """Whether ``host`` is a loopback IP address (IPv4-mapped ones too); a name is not."""
    address = _ip_address(host)
    return address is not None and address.is_loopback


def is_local_host(host: str) -> bool:
    """Whether ``host`` names this machine beyond doubt: ``localhost`` or a loopback IP address
    (other names, ``*.localhost`` ones too, may be looked up in DNS)."""
    return host == "localhost" or is_loopback_ip(host)


def number_from_env(name: str, unit: str) -> Optional[float]:
    """``$name`` as a number (None when unset or blank); a ValueError that names the variable
    and its ``unit`` when it is not one."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number of {unit}, got {raw!r}") from None


def check_unix_socket(path: str) -> None:
    """Refuse to connect to ``path`` unless it is a Unix socket that this user (or root) made.

    A sandboxed server cannot reach the directory of the socket SandboxProvider made, but a
    ``unix://`` URL may come from anywhere: a link, a file or another user's socket at that path
    would get the client's handshake (its headers, an access token included). Raises
    :class:`ConnectionError` naming what is there instead; a missing path is left to ``connect``.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConnectionError(f"cannot inspect the server's socket {path}: {exc}") from None
    if stat.S_ISLNK(info.st_mode):
        raise ConnectionError(f"{path} is a symbolic link, not a server's socket: refusing to follow it")
    if not stat.S_ISSOCK(info.st_mode):
        raise ConnectionError(f"{path} is not a Unix socket: refusing to connect")
    if info.st_uid not in (os.geteuid(), 0):
        raise ConnectionError(
            f"the socket {path} belongs to uid {info.st_uid}, neither you nor root: refusing to send it the handshake"
        )


def parse_endpoint(base_url: str) -> Endpoint:
    """Accepts ``http(s)://host[:port][/prefix]``, ``ws(s)://...``, ``host:port`` and ``unix:///path/to.sock``."""
    url = base_url.strip()
    if not url:
        raise ValueError("base_url is empty")
    if url.startswith("unix:"):
        path = url[len("unix://") :] if url.startswith("unix://") else url[len("unix:") :]
        if not path.startswith("/"):
            raise ValueError(f"unix socket URL must name an absolute path, like unix:///tmp/env.sock; got {base_url!r}")
        return Endpoint("http://localhost", "ws://localhost", uds=path)
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    http_scheme = {"http": "http", "https": "https", "ws": "http", "wss": "https"}.get(scheme)
    if http_scheme is None:
        raise ValueError(f"unsupported URL scheme {scheme!r} in {base_url!r}: use http, https, ws, wss or unix")
    if not parts.netloc:
        raise ValueError(f"no host in {base_url!r}")
    if parts.query or parts.fragment:
        raise ValueError(
            f"base_url {base_url!r} has a query string or fragment, which the client would not send: "
            "pass credentials as headers (headers={...}) instead"
        )
    path = parts.path.rstrip("/")
    http_url = urlunsplit((http_scheme, parts.netloc, path, "", ""))
    ws_url = urlunsplit(("wss" if http_scheme == "https" else "ws", parts.netloc, path, "", ""))
    return Endpoint(http_url, ws_url)


def convert_to_ws_url(url: str) -> str:
    """``http://h:p/x/`` -> ``ws://h:p/x`` (https -> wss; a bare host gets ``ws://``)."""
    return parse_endpoint(url).ws_url


def hf_space_subdomain(repo_id: str) -> str:
    """The subdomain of a Hugging Face Space: ``Org/My_Env`` -> ``org-my-env``."""
    return re.sub(r"[^a-z0-9]", "-", repo_id.lower())


if sys.version_info >= (3, 11):
    timeout_after = asyncio.timeout
    """``async with timeout_after(s) as scope:`` raises TimeoutError when the block runs past ``s``
    seconds (None: no limit); ``scope.expired()`` tells that timeout from a TimeoutError raised
    inside. Unlike ``asyncio.wait_for`` on Python 3.11, a cancellation that arrives just as the
    awaited call finishes is never lost (on Python 3.10 see the note in its fallback)."""
else:  # pragma: no cover - Python 3.10

    class _Expired(TimeoutError, asyncio.TimeoutError):
        """The block ran out of time (both TimeoutErrors: they differ before Python 3.11)."""

    class _Scope:
        def __init__(self) -> None:
            self._expired = False

        def expired(self) -> bool:
            return self._expired

    @contextlib.asynccontextmanager
    async def timeout_after(delay: Optional[float]) -> AsyncIterator[_Scope]:
        # Python 3.10 has no count of a task's pending cancellations. This scope cancels with a
        # message of its own, and the CancelledError the task receives carries the message of
        # the first cancel() since it last ran: an outside cancel that lands just before ours (in
        # the same loop iteration) still reads as a cancellation. One that lands just after ours
        # reads as the timeout: the one race left open on 3.10.
        scope = _Scope()
        if delay is None:
            yield scope
            return
        task = asyncio.current_task()
        assert task is not None
        mark = f"openenv timeout_after {id(scope):x}"

        def expire() -> None:
            scope._expired = True
            task.cancel(mark)

        handle = asyncio.get_running_loop().call_later(delay, expire)
        try:
            yield scope
        except asyncio.CancelledError as exc:
            if scope._expired and exc.args[:1] == (mark,):  # our own cancel, and only ours
                raise _Expired() from None
            scope._expired = False
            raise
        finally:
            handle.cancel()


async def within(awaitable: Awaitable[T], delay: Optional[float]) -> T:
    """``await awaitable``, raising TimeoutError after ``delay`` seconds (see :func:`timeout_after`)."""
    async with timeout_after(delay):
        return await awaitable


def run_async_safely(coro: Awaitable[T]) -> T:
    """Run a coroutine from sync code, also when the calling thread already runs an event loop
    (it then runs on a helper thread and this thread waits)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)  # type: ignore[arg-type]
    box: dict = {}

    def runner() -> None:
        try:
            box["value"] = asyncio.run(coro)  # type: ignore[arg-type]
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=runner, name="openenv-run-async", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def prompt_seed(prompt: Any) -> int:
    """A seed that depends only on ``prompt`` (a string or a list of chat messages): every
    rollout of a GRPO group gets the same task (used by the TRL adapter and harness rollouts)."""
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") & 0x7FFFFFFF


@contextlib.contextmanager
def tuned_gc(enabled: bool) -> Iterator[None]:
    """Garbage-collector settings for a process that serves environments, while it serves.

    A server holds many long-lived objects (sessions, sockets, environments) and allocates a few
    short-lived ones per step; with CPython's defaults the collector keeps rescanning the former.
    Objects that exist at start-up are frozen out of collection and young collections run every
    10,000 allocations instead of 700. They change the whole process, so an app turns them on only
    when asked (``OPENENV_GC_TUNING=1``), and OpenEnv's runner and the capture proxy's command line,
    which own their process, by default.
    ``make bench``: a sync environment at 512 sessions went from 0.54 to 0.71 of the floor's steps/s.
    """
    if not enabled:
        yield
        return
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


class CollectBetweenCalls:
    """The garbage collector for a process that answers calls (the capture proxy): its passes
    run right after an answer is sent, never inside a call, and never over long-lived objects.

    CPython collects when allocations pass a threshold, which lands the pause inside whichever
    call allocates then. The proxy's sessions keep every turn's token ids, lists of thousands of
    ints the collector walks, so its older passes grew with the sessions held: 5 to 45 ms
    measured, and the p99 of a model call carried them. While this context is entered:

    - objects that exist at start-up are frozen out of collection (``gc.freeze``), and automatic
      collection fires only past ``backstop`` allocations, which it never reaches while answers
      keep going out;
    - :meth:`after_call`, called once an answer is on the wire, collects the young generation
      when ``young`` allocations are due and freezes what survived: an object that outlived a
      call is a session's turn, kept until the session goes, and freed by reference counting
      then (a test checks a deleted session leaves no cycle behind). Every pass is thus as short
      as the young objects of a dozen calls (0.1 to 0.2 ms here, over before the agent's next
      call arrives);
    - the frozen objects would hold on to what later becomes cyclic garbage (measured: 58
      objects in 125,000 after 2,000 calls), so every ``full_every`` passes one full pass over
      everything runs, again right after an answer.

    ``make bench`` (``bench/bench_capture.py``, 2,000 sequential calls, 2,000-token prompts): the
    added p99 went from 1.2 to 2.3 ms (with :func:`tuned_gc`) to 0.75 to 0.96 ms over five runs;
    the p50 is unchanged (0.65 to 0.69 ms) and calls/s on one core rose from 0.81-0.95 to
    0.87-0.97 of the floor's.
    """

    def __init__(self, young: int = 1_000, full_every: int = 2_000, backstop: int = 100_000) -> None:
        self.young = young
        self.full_every = full_every
        self.backstop = backstop
        self.passes = 0
        self._saved: Optional[Tuple[int, int, int]] = None

    def __enter__(self) -> CollectBetweenCalls:
        self._saved = gc.get_threshold()
        gc.freeze()
        gc.set_threshold(self.backstop, 10, 10)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._saved is not None:
            gc.set_threshold(*self._saved)
            gc.unfreeze()
            self._saved = None

    def after_call(self) -> Optional[int]:
        """Run the pass that is due, if any: 0 for a young pass, 2 for a full one, else None."""
        if self._saved is None or gc.get_count()[0] < self.young:
            return None
        self.passes += 1
        if self.passes % self.full_every == 0:
            gc.unfreeze()
            gc.collect()
            gc.freeze()
            return 2
        gc.collect(0)
        gc.freeze()
        return 0


def shown_path(path: Union[str, Path]) -> str:
    """``path`` as a user would type it here: relative to the working directory when inside it."""
    absolute = Path(path).absolute()
    try:
        return os.path.relpath(absolute) if absolute.is_relative_to(Path.cwd()) else str(absolute)
    except (OSError, ValueError):  # no working directory any more
        return str(absolute)


_spawner: Optional[ThreadPoolExecutor] = None
_spawner_lock = threading.Lock()


def popen_lasting(argv: List[str], **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen(argv, **kwargs)``, forked from one long-lived thread of this process.

    A child told to die with its parent (bwrap's ``--die-with-parent``, ``PR_SET_PDEATHSIG``) is
    told when the *thread* that forked it exits, not the process. Forked from a short-lived thread
    (``asyncio.to_thread``, a pool's worker, a client's loop thread), a sandbox meant to outlive
    that thread (a warden shared by later starts, a server, a REPL) would be killed with it."""
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="openenv-spawner")
    return _spawner.submit(subprocess.Popen, argv, **kwargs).result()
