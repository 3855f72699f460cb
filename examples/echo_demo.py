"""Start an echo environment server, run the quick-start against it, stop the server.

python examples/echo_demo.py
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, process: subprocess.Popen, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the echo server exited with code {process.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"the echo server did not answer {url}/health within {timeout_s:g} s")


def main() -> int:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    print(f"starting the echo environment on {url} ...", flush=True)
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "openenv.core.env_server",
            "echo_env.server.app:app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ]
    )
    try:
        wait_healthy(url, server)
        print("running examples/echo_quickstart.py\n", flush=True)
        quickstart = Path(__file__).with_name("echo_quickstart.py")
        return subprocess.call([sys.executable, str(quickstart)], env={**os.environ, "OPENENV_URL": url})
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    raise SystemExit(main())
