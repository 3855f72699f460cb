"""openenv.testing: the planted secret and the host listener work when nothing stands in the way."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from openenv.testing import host_listener, planted_secret


def test_a_planted_secret_is_readable_by_its_owner_only_and_gone_afterwards(tmp_path: Path) -> None:
    with planted_secret(tmp_path, text="s3cr3t") as secret:
        assert Path(os.fspath(secret)).read_text() == "s3cr3t" == secret.text
        assert stat.S_IMODE(secret.path.stat().st_mode) == 0o600
        assert secret.path.parent == tmp_path
    assert not secret.path.exists()


def test_the_host_listener_answers_python_and_bash_clients() -> None:
    with host_listener() as listener:
        out = subprocess.run([sys.executable, "-c", listener.client_code()], capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "b'pong'" and listener.accepted
    with host_listener(reply=b"hello") as listener:
        out = subprocess.run(["bash", "-c", listener.shell_command()], capture_output=True, text=True, timeout=30)
    assert out.stdout == "hello" and listener.accepted


def test_a_listener_nobody_reached_says_so_and_closes_promptly() -> None:
    with host_listener(timeout_s=30) as listener:
        pass
    assert not listener.accepted
