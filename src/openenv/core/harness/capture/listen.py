"""Where the capture proxy listens, and the admin key it keeps: shared by :class:`CaptureServer`
and the command line."""

from __future__ import annotations

import ipaddress
import os
import secrets
import socket
from pathlib import Path
from typing import Optional

from openenv.core.harness.capture.settings import admin_key_from_env

ADMIN_KEY_FILE = "admin_key"


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_admin_key(admin_key: Optional[str], journal_dir: Path) -> str:
    """The key the admin routes need: given, else ``OPENENV_CAPTURE_ADMIN_KEY``, else the one this
    journal directory keeps (``admin_key``, mode 0600), made on first use — so a restarted proxy
    keeps honouring the trainer's key."""
    chosen = admin_key or admin_key_from_env()
    if chosen:
        return chosen
    path = journal_dir / ADMIN_KEY_FILE
    try:
        kept = path.read_text().strip()
        if kept:
            return kept
    except FileNotFoundError:
        pass
    journal_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    made = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(made + "\n")
    return made


def listen_socket(host: str, port: int, uds: Optional[str]) -> socket.socket:
    if uds:
        path = Path(uds)
        if path.exists() or path.is_symlink():
            try:
                probe = socket.socket(socket.AF_UNIX)
                probe.settimeout(0.5)
                probe.connect(str(path))
            except OSError:
                path.unlink()  # a socket left by a process that is gone
            else:
                probe.close()
                raise RuntimeError(f"a server already listens on {uds}")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
        os.chmod(path, 0o600)
    else:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            raise RuntimeError(f"cannot listen on {host}:{port}: {exc.strerror} (is another proxy there?)") from None
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock
