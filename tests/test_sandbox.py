"""SandboxProvider, from_env and AutoEnv: real bubblewrap sandboxes, real servers on Unix sockets."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from openenv import AutoAction, AutoEnv
from openenv.core.containers.runtime import IsolationError, LocalProcessProvider, SandboxProvider, shutdown_sandboxes
from openenv.core.containers.runtime import sandbox as sandbox_module
from openenv.core.containers.runtime.isolation import find_bwrap, require_bwrap
from openenv.core.generic_client import GenericEnvClient

ROOT = Path(__file__).resolve().parents[1]
ECHO = ROOT / "envs" / "echo_env"
ESCAPE = ROOT / "tests" / "security" / "escape_env"
BROKEN = ROOT / "tests" / "fixtures" / "broken_env"

pytestmark = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")

from echo_env import CallToolAction, EchoEnv  # noqa: E402


def _echo_round_trip(url: str) -> tuple:
    with EchoEnv(base_url=url).sync() as env:
        greeting = env.reset().observation.echoed_message
        result = env.step(CallToolAction(tool_name="echo_message", arguments={"message": "Hello, World!"}))
        return greeting, result.observation.result, result.reward


@pytest.mark.parametrize("mode", ["warm", "cold", "none"])
def test_the_echo_quickstart_runs_through_a_sandbox(mode):
    provider = SandboxProvider(str(ECHO), warm=mode == "warm", isolation="none" if mode == "none" else "sandbox")
    url = provider.start()
    assert url.startswith("unix:///") and url.endswith("/env.sock")
    try:
        provider.wait_for_ready(30)
        assert _echo_round_trip(url) == ("Echo environment ready!", "Hello, World!", pytest.approx(1.3))
    finally:
        provider.stop()
    assert not Path(url[len("unix://") :]).parent.exists()


async def test_from_env_by_package_name_starts_and_stops_its_own_server():
    client = EchoEnv.from_env("echo_env")
    async with client:
        assert (await client.reset()).observation.echoed_message == "Echo environment ready!"
        result = await client.step(CallToolAction(tool_name="echo_message", arguments={"message": "Hello, World!"}))
        assert result.observation.result == "Hello, World!"
        socket_dir = Path(client.base_url[len("unix://") :]).parent
        assert socket_dir.exists()
    assert not socket_dir.exists()  # closing the client stopped the sandboxed server


async def test_from_env_is_awaitable_and_accepts_a_path():
    client = await EchoEnv.from_env(str(ECHO), message_timeout_s=20)
    try:
        assert (await client.reset()).observation.echoed_message == "Echo environment ready!"
    finally:
        await client.close()


def test_auto_env_and_auto_action_find_the_installed_echo_env():
    assert AutoAction.from_env("echo") is CallToolAction
    assert AutoEnv.get_env_class("echo-env") is EchoEnv
    info = AutoEnv.get_env_info("openenv-echo-env")
    assert info["path"] == str(ECHO)
    with AutoEnv.from_env("echo").sync() as env:
        assert env.reset().observation.echoed_message == "Echo environment ready!"
        assert env.call_tool("echo_with_length", message="abc") == {"message": "abc", "length": 3}


def test_unknown_environment_names_list_what_is_installed():
    with pytest.raises(ValueError, match=r"Installed: .*echo"):
        AutoEnv.from_env("no_such_env")


def test_env_vars_reach_the_server_but_never_a_command_line():
    secret = "s3cr3t-" + os.urandom(6).hex()
    provider = SandboxProvider(str(ESCAPE), env_vars={"API_TOKEN": secret})
    url = provider.start()
    try:
        provider.wait_for_ready(30)
        with GenericEnvClient(base_url=url).sync() as env:
            env.reset()
            result = env.step({"code": "import os; result = os.environ.get('API_TOKEN')"})
            assert result.observation["result"] == repr(secret)
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            assert secret.encode() not in cmdline
    finally:
        provider.stop()


@pytest.mark.parametrize("warm", [True, False])
def test_an_app_that_fails_to_import_is_reported_with_its_log(warm):
    provider = SandboxProvider(str(BROKEN), warm=warm)
    with pytest.raises((RuntimeError, IsolationError), match="broken on purpose"):
        provider.start()
        provider.wait_for_ready(30)
    provider.stop()


def test_a_package_without_manifest_is_refused():
    with pytest.raises(ValueError, match=r"openenv\.yaml"):
        SandboxProvider(str(ROOT / "tests"))


def test_missing_bubblewrap_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(IsolationError, match=r"apt-get install bubblewrap.*isolation='none'"):
        require_bwrap()
    with pytest.raises(IsolationError, match="bubblewrap"):
        SandboxProvider(str(ECHO))
    SandboxProvider(str(ECHO), isolation="none")  # still possible, without isolation


def test_a_port_is_refused_with_advice():
    with pytest.raises(ValueError, match=r"listen=\(host, port\)"):
        SandboxProvider(str(ECHO)).start(port=8000)


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_listen_serves_the_sandbox_on_a_tcp_port_the_host_bound(warm):
    provider = SandboxProvider(str(ECHO), listen=("127.0.0.1", 0), warm=warm)
    url = provider.start()
    try:
        provider.wait_for_ready(60)
        assert url.startswith("http://127.0.0.1:") and int(url.rsplit(":", 1)[1]) > 0
        assert _echo_round_trip(url) == ("Echo environment ready!", "Hello, World!", pytest.approx(1.3))
    finally:
        provider.stop()


def _ours(marker: str) -> list:
    """Host pids whose command line or environment mentions ``marker``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            data = Path(f"/proc/{pid}/cmdline").read_bytes() + Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in data and int(pid) != os.getpid():
            found.append(int(pid))
    return found


def _our_host_dirs() -> set:
    """This process's sandbox directories in /tmp (other test runs may have theirs there too)."""
    mine = set()
    for path in Path("/tmp").glob("openenv-s*"):
        try:
            if int((path / "owner").read_text()) == os.getpid():
                mine.add(path)
        except (OSError, ValueError):
            continue
    return mine


def test_a_hundred_start_stop_cycles_leave_nothing_behind():
    shutdown_sandboxes()
    assert _our_host_dirs() == set()
    first = SandboxProvider(str(ECHO))  # boots the warden, which stays
    first.start()
    first.wait_for_ready(30)
    first.stop()
    fds, threads = len(os.listdir("/proc/self/fd")), threading.active_count()
    for _ in range(100):
        provider = SandboxProvider(str(ECHO))
        provider.start()
        provider.wait_for_ready(30)
        provider.stop()
    zygote_dirs = _our_host_dirs()
    assert len(zygote_dirs) == 1  # only the warden's, with no server directory left in it
    assert sorted(p.name for p in next(iter(zygote_dirs)).iterdir()) == ["owner", "zygote.log"]
    assert len(os.listdir("/proc/self/fd")) <= fds  # no socket, pipe or log left open here
    assert threading.active_count() <= threads  # every log copier has finished
    shutdown_sandboxes()
    assert _our_host_dirs() == set()
    # No server of this process's (other test runs, or the suite's other workers, may be serving
    # theirs): a sandbox left running would still descend from here, through its bwrap.
    servers = set(_ours("openenv.core.containers.runtime._serve")) & set(_ours(f'"project_dir": "{ECHO}"'))
    assert not [p for p in servers if _parent_chain(p, os.getpid())]


def test_no_sandbox_outlives_a_killed_client_process(tmp_path):
    script = tmp_path / "client.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import time
            from openenv.core.containers.runtime import SandboxProvider
            for warm in (True, False):
                p = SandboxProvider({str(ECHO)!r}, warm=warm)
                p.start(); p.wait_for_ready(30)
            print("ready", flush=True)
            time.sleep(60)
            """
        )
    )
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 5
        servers = []
        while time.monotonic() < deadline and len(servers) < 2:
            servers = [p for p in _ours("openenv.core.containers.runtime._serve") if _parent_chain(p, child.pid)]
            time.sleep(0.05)
        assert servers, "the client's sandboxes should be running"
    finally:
        child.send_signal(signal.SIGKILL)  # no atexit, no cleanup: only die-with-parent can help
        child.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in servers):
        time.sleep(0.05)
    assert not [p for p in servers if Path(f"/proc/{p}").exists()]


def _parent_chain(pid: int, ancestor: int) -> bool:
    for _ in range(10):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False
        pid = int(next(line for line in status.splitlines() if line.startswith("PPid:")).split()[1])
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
    return False


def test_local_process_provider_serves_on_a_tcp_port(caplog):
    provider = LocalProcessProvider(str(ECHO))
    url = provider.start()
    assert url.startswith("http://127.0.0.1:")
    try:
        provider.wait_for_ready(30)
        assert _echo_round_trip(url)[0] == "Echo environment ready!"
    finally:
        provider.stop()
    assert any("without isolation" in r.getMessage().lower() for r in caplog.records)


def test_sandboxes_of_one_package_do_not_share_a_uid_or_a_tmp():
    providers = [SandboxProvider(str(ESCAPE)) for _ in range(2)]
    seen = []
    try:
        for provider in providers:
            url = provider.start()
            provider.wait_for_ready(30)
            with GenericEnvClient(base_url=url).sync() as env:
                env.reset()
                code = "import os; open('/tmp/mark', 'a').write('x'); result = (os.getuid(), os.listdir('/tmp'), os.getpid())"
                seen.append(env.step({"code": code}).observation["result"])
    finally:
        for provider in providers:
            provider.stop()
    (uid_a, tmp_a, pid_a), (uid_b, tmp_b, pid_b) = (eval(s) for s in seen)
    assert uid_a != uid_b and uid_a != 0 and uid_b != 0
    # Each sees only its own /tmp: its mark, plus (read-only) the code when the checkout or the
    # venv lives under /tmp, as in a fresh clone there.
    code = {Path(p).parts[2] for p in (str(ROOT), os.path.realpath(sys.prefix)) if p.startswith("/tmp/")}
    assert set(tmp_a) - code == set(tmp_b) - code == {"mark"}
    assert pid_a == pid_b == 1  # each is pid 1 of its own pid namespace


def test_many_sessions_through_the_unix_socket():
    async def run() -> list:
        client = EchoEnv.from_env("echo_env")
        async with client:
            children = [await client.new_session() for _ in range(5)]
            values = []
            for i, child in enumerate(children):
                await child.reset()
                values.append(await child.call_tool("echo_message", message=str(i)))
            return values

    assert asyncio.run(run()) == ["0", "1", "2", "3", "4"]


def test_zygote_errors_are_clear_when_the_zygote_dies():
    provider = SandboxProvider(str(ECHO))
    provider.start()
    provider.wait_for_ready(30)
    zygote = provider._zygote
    zygote.process.kill()
    zygote.process.wait()
    provider.stop()  # nothing to ask any more: stops without raising
    again = SandboxProvider(str(ECHO))
    again.start()  # a fresh zygote replaces the dead one
    again.wait_for_ready(30)
    assert _echo_round_trip(again.base_url)[0] == "Echo environment ready!"
    again.stop()
    assert sandbox_module._ZYGOTES  # the replacement is kept for the next start


def test_a_package_under_tmp_stays_visible_to_warm_sandbox_servers(tmp_path):
    # Servers forked by the zygote get a fresh /tmp; code that lived there (a checkout, a venv)
    # must stay visible, read-only, on top of it.
    project = tmp_path / "escape_copy"
    shutil.copytree(ESCAPE, project, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    provider = SandboxProvider(str(project))
    try:
        url = provider.start()
        provider.wait_for_ready(30)
        with GenericEnvClient(base_url=url).sync() as env:
            env.reset()
            code = (
                f"p = {str(project / 'openenv.yaml')!r}\n"
                "seen = open(p).read()\n"
                "try:\n    open(p, 'a').write('x'); wrote = True\nexcept OSError:\n    wrote = False\n"
                "result = (len(seen), wrote)"
            )
            size, wrote = eval(env.step({"code": code}).observation["result"])
    finally:
        provider.stop()
    assert size == (project / "openenv.yaml").stat().st_size
    assert wrote is False


@pytest.mark.parametrize("warm", [True, False], ids=["warden", "cold"])
def test_a_sandbox_started_from_a_thread_that_ends_lives_on(warm):
    """bwrap's --die-with-parent fires when the *thread* that forked it exits: a server (or, for
    warm starts, the package's warden, shared by every later start) started from a short-lived
    thread (asyncio.to_thread, a pool's worker, a sync client's loop) died with that thread. They
    are forked from one long-lived thread instead; before, a loaded CI saw wardens die mid-start."""
    shutdown_sandboxes()  # (a warden made by an earlier test would hide it: this one makes its own)
    provider = SandboxProvider(str(ECHO), warm=warm)
    started = threading.Thread(target=lambda: (provider.start(), provider.wait_for_ready(30)))
    started.start()
    started.join(60)
    try:
        time.sleep(0.5)  # the parent-death signal, had it been sent, has been by now
        assert provider.poll() is None, "the server died with the thread that started it"
        assert _echo_round_trip(provider.base_url)[0] == "Echo environment ready!"
        if warm:  # the warden serves the next start, from this thread
            again = SandboxProvider(str(ECHO))
            again.start()
            try:
                again.wait_for_ready(30)
                assert again._zygote is provider._zygote
            finally:
                again.stop()
    finally:
        provider.stop()
