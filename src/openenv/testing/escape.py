"""What an escape from a sandbox would reach on the host, planted by a test."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional, Union

from openenv.core.containers.runtime._linux import descendants


@dataclasses.dataclass(frozen=True)
class PlantedSecret:
    """A planted secret file: ``path`` (also what ``str()`` and ``os.fspath()`` give) and ``text``."""

    path: Path
    text: str

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)


@contextlib.contextmanager
def planted_secret(
    directory: Optional[Union[str, Path]] = None, text: str = "the trainer's secret"
) -> Iterator[PlantedSecret]:
    """A file only its owner may read (mode 0600), in ``directory`` (default: the host user's
    home), holding ``text``; removed on exit."""
    where = Path(directory) if directory is not None else Path.home()
    path = where / f".openenv-secret-{uuid.uuid4().hex}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    try:
        yield PlantedSecret(path, text)
    finally:
        path.unlink(missing_ok=True)


class HostListener:
    """A TCP listener on the host's 127.0.0.1 that answers ``reply`` to whoever connects."""

    def __init__(self, reply: bytes = b"pong", timeout_s: float = 5.0) -> None:
        self.reply = reply
        self.accepted = False
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(1)
        self._socket.settimeout(timeout_s)
        self.port: int = self._socket.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, name="openenv-host-listener", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        try:
            connection, _ = self._socket.accept()
        except OSError:  # timed out, or closed
            return
        with connection:
            self.accepted = True
            with contextlib.suppress(OSError):
                connection.sendall(self.reply)

    def client_code(self, timeout_s: float = 2.0) -> str:
        """Python that connects to this listener and prints what it answers."""
        return (
            "import socket\n"
            f"s = socket.create_connection(('127.0.0.1', {self.port}), timeout={timeout_s})\n"
            "print(s.recv(64))\n"
        )

    def shell_command(self, timeout_s: float = 2.0) -> str:
        """A shell command (bash's /dev/tcp) that connects to this listener and prints its answer."""
        return f"timeout {timeout_s} bash -c 'exec 3<>/dev/tcp/127.0.0.1/{self.port}; head -c {len(self.reply)} <&3'"

    def close(self, wait_s: float = 6.0) -> None:
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)  # wake accept() up
        self._socket.close()
        self._thread.join(wait_s)


@contextlib.contextmanager
def host_listener(reply: bytes = b"pong", timeout_s: float = 5.0) -> Iterator[HostListener]:
    """A :class:`HostListener` for the duration of the block; ``accepted`` is final on exit."""
    listener = HostListener(reply, timeout_s)
    try:
        yield listener
    finally:
        listener.close()


def processes_per_uid(below: Optional[int] = None) -> collections.Counter[int]:
    """How many of this machine's processes run as each uid (as this process's ``/proc`` shows them).

    A sandboxed run has a uid of its own when OpenEnv runs as root (and the server's, in a user
    namespace, otherwise): compare two counts with :func:`processes_added` to see what a run
    started and what it left behind, whichever uid it had. ``below``: count only the processes
    that descend from that pid. Every process of a sandbox descends from the process that started
    it, so ``below=os.getpid()`` leaves out sandboxes that other programs (another test run, say)
    start and stop meanwhile."""
    if below is None:
        pids = filter(str.isdigit, os.listdir("/proc"))
    else:
        pids = map(str, descendants(below))
    counts: collections.Counter = collections.Counter()
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("Uid:"):
                counts[int(line.split()[1])] += 1
                break
    return counts


def processes_added(
    before: collections.Counter[int], now: Optional[collections.Counter[int]] = None, below: Optional[int] = None
) -> Dict[int, int]:
    """uid -> processes more than in ``before``, for unprivileged uids (1000 and up) that grew;
    ``below``: as for :func:`processes_per_uid` (give the one ``before`` was counted with)."""
    now = processes_per_uid(below) if now is None else now
    return {uid: now[uid] - before[uid] for uid in now if uid >= 1000 and now[uid] > before[uid]}


def wait_for(condition: Callable[[], object], timeout_s: float = 10.0, interval_s: float = 0.05) -> bool:
    """Whether ``condition()`` holds within ``timeout_s`` (checked every ``interval_s``, and once at the end)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval_s)
    return bool(condition())
