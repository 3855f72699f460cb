"""openenv.core.tools: untrusted code in real bubblewrap sandboxes (no mocks)."""

from __future__ import annotations

import contextlib
import gc
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator, List, Optional

import pytest

from openenv.core.containers.runtime.isolation import find_bwrap
from openenv.core.tools import (
    TIMEOUT_EXIT_CODE,
    IsolationError,
    PythonREPL,
    run_python,
    run_python_async,
    run_shell,
    run_shell_in_directory,
)

pytestmark = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")


def processes_with(marker: str, program: Optional[str] = None) -> List[str]:
    """Host processes whose command line contains ``marker`` (zombies have none).

    With ``program``, only those running it (a shell or Python that forks on its way to exec'ing
    ``program`` carries the marker for a moment too).
    """
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                if program is not None and os.path.basename(cmdline.split(b"\0")[0]) != program.encode():
                    continue
                found.append(cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found


def eventually(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


@contextlib.contextmanager
def watching(marker: str, program: Optional[str] = None) -> Iterator[List[int]]:
    """Count, every 10 ms while the block runs, the host processes ``processes_with`` finds."""
    seen: List[int] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.append(len(processes_with(marker, program)))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        yield seen
    finally:
        done.set()
        watcher.join()


def unique_seconds() -> str:
    """A sleep duration no other process on the machine uses: a marker for /proc scans."""
    return str(10_000_000 + uuid.uuid4().int % 10_000_000)


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP listener on the host's 127.0.0.1; yields its port."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


CONNECT = """
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=3).close()
    print("connected")
except OSError as exc:
    print("blocked", type(exc).__name__)
"""


# --- results -----------------------------------------------------------------------------------


def test_stdout_stderr_and_exit_code_come_back_separately():
    result = run_python("import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)")
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 3)


def test_an_uncaught_exception_gives_exit_code_1_and_a_traceback():
    result = run_python("1 / 0")
    assert result.exit_code == 1
    assert "ZeroDivisionError" in result.stderr


def test_a_shell_command_runs_in_the_workspace():
    result = run_shell("echo hello; pwd; exit 7")
    assert (result.stdout, result.exit_code) == ("hello\n/workspace\n", 7)


def test_a_process_killed_by_a_signal_gives_128_plus_the_signal():
    assert run_python("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)").exit_code == 137


def test_stdin_is_fed_to_the_code():
    assert run_python("print(input()[::-1])", stdin="abc\n").stdout == "cba\n"


def test_output_beyond_the_bound_is_cut_with_a_marker():
    result = run_python("import sys\nprint('x' * 100_000)\nsys.stderr.write('y' * 100_000)", max_output_bytes=1000)
    assert result.stdout.startswith("x" * 1000)
    assert "[stdout truncated: 99001 more bytes not shown (limit 1000 bytes)]" in result.stdout
    assert "[stderr truncated: 99000 more bytes not shown" in result.stderr
    assert len(result.stdout) < 1200 and result.exit_code == 0


def test_files_are_written_into_the_working_directory_first():
    files = {"data.txt": "hello", "pkg/helper.py": "def double(x):\n    return 2 * x\n", "raw.bin": b"\x00\xff"}
    code = "from pkg.helper import double\nprint(open('data.txt').read(), double(21), open('raw.bin', 'rb').read())"
    result = run_python(code, files=files)
    assert result.stdout == "hello 42 b'\\x00\\xff'\n", result.stderr


def test_file_names_must_stay_inside_the_working_directory():
    for name in ("/etc/passwd", "../escape.txt", "a/../../b"):
        with pytest.raises(ValueError):
            run_python("pass", files={name: "x"})


def test_each_call_starts_from_a_fresh_workspace():
    assert run_shell("echo kept > note.txt").exit_code == 0
    assert run_shell("ls -A").stdout == ""


def test_the_code_never_appears_on_a_command_line():
    marker = f"marker_{uuid.uuid4().hex}"
    with watching(marker) as seen:
        result = run_python(f"import time\ntime.sleep(0.5)  # {marker}\nprint('{marker}')")
    assert result.stdout == f"{marker}\n" and max(seen) == 0


async def test_the_async_variant_runs_on_a_worker_thread():
    assert (await run_python_async("print(6 * 7)")).stdout == "42\n"


# --- limits ------------------------------------------------------------------------------------


def test_a_timeout_kills_an_infinite_loop():
    started = time.monotonic()
    result = run_python("while True:\n    pass", timeout_s=1)
    assert result.exit_code == TIMEOUT_EXIT_CODE
    assert "timed out after 1 s" in result.stderr
    assert time.monotonic() - started < 4


def test_a_timeout_kills_every_process_the_code_started():
    seconds = unique_seconds()
    script = f"""
sleep {seconds} &
(setsid sleep {seconds} &)
nohup sleep {seconds} > /dev/null 2>&1 &
python3 -c 'import os
if os.fork() == 0:
    os.setsid()
    os.execvp("sleep", ["sleep", "{seconds}"])'
echo started
while true; do :; done
"""
    with watching(seconds, program="sleep") as seen:
        result = run_shell(script, timeout_s=1.5)
    assert result.exit_code == TIMEOUT_EXIT_CODE and result.stdout == "started\n"
    assert max(seen) == 4  # all four were running
    assert processes_with(seconds) == []


def test_background_processes_die_when_the_code_ends():
    seconds = unique_seconds()
    result = run_shell(f"(setsid sleep {seconds} > /dev/null 2>&1 &); echo done", timeout_s=5)
    assert (result.stdout, result.exit_code) == ("done\n", 0)
    assert processes_with(seconds) == []


def test_allocating_2_gb_fails():
    result = run_python("block = bytearray(2 * 1024**3)\nprint('allocated')")
    assert result.stdout == ""
    assert result.exit_code == 137 or "MemoryError" in result.stderr


def test_processes_are_bounded():
    code = """
import os, time
count = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
        count += 1
except OSError:
    print(count)
"""
    result = run_python(code, timeout_s=5)
    assert result.exit_code == 0 and int(result.stdout) < 64


def test_a_fork_bomb_is_bounded_and_the_call_returns():
    started = time.monotonic()
    result = run_shell(":(){ :|:& };:\nsleep 1", timeout_s=2)
    assert result.exit_code in (0, TIMEOUT_EXIT_CODE)
    assert time.monotonic() - started < 6
    assert run_shell("echo still fine").stdout == "still fine\n"


# --- isolation ---------------------------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="only root drops to a fresh uid")
def test_the_code_runs_as_an_unprivileged_uid():
    result = run_python("import os\nprint(os.getuid(), os.geteuid(), os.getgid())")
    uid, euid, gid = map(int, result.stdout.split())
    assert uid == euid == gid and uid >= 1_000_000


def test_the_code_cannot_reach_the_network(listener):
    assert run_python(CONNECT.format(port=listener)).stdout.startswith("blocked")


def test_the_network_is_shared_when_asked(listener):
    assert run_python(CONNECT.format(port=listener), network=True).stdout == "connected\n"


def test_host_files_in_home_and_tmp_are_invisible(tmp_path):
    secret_home = Path.home() / f"openenv-test-secret-{uuid.uuid4().hex}.txt"
    secret_tmp = tmp_path / "secret.txt"
    code = f"for path in ({str(secret_home)!r}, {str(secret_tmp)!r}):\n    print(open(path).read())"
    try:
        secret_home.write_text("home secret")
        secret_tmp.write_text("tmp secret")
        result = run_python(code)
        assert result.exit_code == 1 and "FileNotFoundError" in result.stderr and result.stdout == ""
    finally:
        secret_home.unlink(missing_ok=True)


def test_the_system_is_read_only():
    name = f"openenv-probe-{uuid.uuid4().hex}"
    probes = [Path("/usr") / name, Path("/etc") / name, Path("/") / name]
    try:
        result = run_shell("; ".join(f"touch {p} 2>/dev/null || echo refused" for p in probes))
        assert result.stdout == "refused\n" * 3
    finally:
        for probe in probes:
            probe.unlink(missing_ok=True)


# --- what the code sees of Python ---------------------------------------------------------------

STDLIB_ONLY = """
import json, sqlite3, ctypes, decimal  # the standard library, with its compiled modules
for name in ("openenv", "pytest", "pydantic"):
    try:
        __import__(name)
        print("imported", name)
    except ImportError:
        print("missing", name)
"""


def test_the_code_sees_the_standard_library_only():
    result = run_python(STDLIB_ONLY)
    assert result.stdout.split() == ["missing", "openenv", "missing", "pytest", "missing", "pydantic"], result


def test_without_a_sandbox_the_installed_packages_are_importable():
    assert run_python(STDLIB_ONLY, isolation="none").stdout.split()[:2] == ["imported", "openenv"]


def test_named_packages_are_importable_and_read_only():
    numpy = pytest.importorskip("numpy")
    code = (
        "import numpy, os\nprint(numpy.arange(4).sum())\n"
        "try:\n    open(os.path.join(os.path.dirname(numpy.__file__), 'x'), 'w')\n"
        "except OSError as exc:\n    print(exc.strerror)\nimport pytest"
    )
    result = run_python(code, packages=("numpy",))
    assert result.stdout == "6\nRead-only file system\n" and "No module named 'pytest'" in result.stderr, result
    assert numpy.__file__  # the host's copy is the one shown


def test_an_unknown_package_is_refused_with_advice():
    with pytest.raises(ValueError, match="not importable"):
        run_python("pass", packages=("openenv_no_such_package",))


def test_import_paths_are_importable_and_read_only(tmp_path):
    (tmp_path / "helper.py").write_text("VALUE = 42\n")
    tmp_path.chmod(0o755)  # readable by the sandbox's own uid
    code = f"import helper\nprint(helper.VALUE)\nopen({str(tmp_path / 'x')!r}, 'w')"
    result = run_python(code, import_paths=[str(tmp_path)])
    assert result.stdout == "42\n" and "Read-only file system" in result.stderr


# --- a command on a directory that persists --------------------------------------------------


def test_a_command_on_a_directory_keeps_files_modes_and_inner_links(tmp_path):
    (tmp_path / "in.txt").write_text("hello")
    result = run_shell_in_directory(
        "cat in.txt; mkdir -p a/b && echo one > a/b/f && chmod +x a/b/f && ln -s b/f a/link", tmp_path
    )
    assert result.stdout == "hello" and result.exit_code == 0 and result.kept_changes
    assert (tmp_path / "a/b/f").read_text() == "one\n" and os.access(tmp_path / "a/b/f", os.X_OK)
    assert os.readlink(tmp_path / "a/link") == "b/f"


def test_a_command_on_a_directory_is_timed_out_with_every_process_it_started(tmp_path):
    seconds = unique_seconds()
    result = run_shell_in_directory(f"sleep {seconds} & echo started > f; sleep {seconds}", tmp_path, timeout_s=1)
    assert result.timed_out and result.exit_code == TIMEOUT_EXIT_CODE and result.kept_changes
    assert (tmp_path / "f").read_text() == "started\n"
    assert processes_with(seconds) == []


def test_changes_are_dropped_when_not_kept(tmp_path):
    result = run_shell_in_directory("echo x > new", tmp_path, keep_changes=False)
    assert result.exit_code == 0 and not result.kept_changes and result.error is None
    assert os.listdir(tmp_path) == []


# --- without a sandbox: the same attacks work ---------------------------------------------------


def test_without_a_sandbox_the_network_and_host_files_are_reachable(listener, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("tmp secret")
    assert run_python(CONNECT.format(port=listener), isolation="none").stdout == "connected\n"
    assert run_python(f"print(open({str(secret)!r}).read())", isolation="none").stdout == "tmp secret\n"


def test_without_a_sandbox_the_timeout_still_kills_the_process_group():
    seconds = unique_seconds()
    result = run_shell(f"sleep {seconds} &\nwhile true; do :; done", timeout_s=1, isolation="none")
    assert result.exit_code == TIMEOUT_EXIT_CODE
    assert processes_with(seconds) == []


def test_a_missing_bwrap_raises_isolation_error_with_advice(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(IsolationError, match="apt-get install bubblewrap"):
        run_python("pass")


# --- the persistent REPL -----------------------------------------------------------------------


@pytest.fixture
def repl() -> Iterator[PythonREPL]:
    with PythonREPL() as repl:
        yield repl


def test_the_repl_keeps_globals_and_echoes_the_last_expression(repl):
    assert repl.execute("import math\nx = 41").stdout == ""
    assert repl.execute("x + 1").stdout == "42\n"
    assert repl.execute("print(math.pi > 3); None").stdout == "True\n"


def test_an_exception_in_the_repl_keeps_its_state(repl):
    repl.execute("x = 1")
    failed = repl.execute("y = x / 0")
    assert failed.exit_code == 1 and "ZeroDivisionError" in failed.stderr and "<cell 2>" in failed.stderr
    assert repl.execute("x").stdout == "1\n"


def test_running_out_of_memory_in_the_repl_keeps_its_state(repl):
    repl.execute("x = 1")
    failed = repl.execute("block = bytearray(2 * 1024**3)")
    assert failed.exit_code == 1 and "MemoryError" in failed.stderr
    assert repl.execute("x").stdout == "1\n"


def test_the_repl_restarts_fresh_after_a_timeout(repl):
    repl.execute("x = 1")
    timed_out = repl.execute("while True:\n    pass", timeout_s=1)
    assert timed_out.exit_code == TIMEOUT_EXIT_CODE and "state is lost" in timed_out.stderr
    after = repl.execute("print('alive'); 'x' in globals()")
    assert after.stdout == "alive\nFalse\n"
    assert "fresh REPL worker" in after.stderr and after.exit_code == 0


def test_the_repl_restarts_after_its_worker_dies(repl):
    died = repl.execute("import os\nos._exit(9)")
    assert died.exit_code == 9 and "died" in died.stderr
    assert repl.execute("1 + 1").stdout == "2\n"


def test_the_repl_restarts_after_its_worker_dies_between_calls(repl):
    repl.execute("import os, threading\nthreading.Timer(0.1, os._exit, [5]).start()")
    time.sleep(0.5)
    result = repl.execute("1 + 1")
    assert result.stdout == "2\n" and "previous worker died (exit code 5)" in result.stderr


@pytest.mark.parametrize("isolation", ["sandbox", "none"])
def test_the_repl_says_what_runs_in_the_background_and_only_looks(isolation):
    with PythonREPL(isolation=isolation) as repl:
        assert repl.background() is None  # no worker yet
        repl.execute("x = 1")
        assert repl.background() is None
        repl.execute(
            "import threading, time\nt = threading.Thread(target=time.sleep, args=(30,), daemon=True)\nt.start()"
        )
        assert (
            repl.background()
            == "the cells left work running: 0 process(es) and 1 thread(s) more than the idle worker's"
        )
        repl.execute("import subprocess\np = subprocess.Popen(['sleep', '30'])")
        assert "1 process(es) and 1 thread(s) more" in (repl.background() or "")
        repl.execute("p.kill(); p.wait()")
        repl.execute("q = subprocess.Popen(['sh', '-c', 'sleep 0.3; echo late'])")
        eventually(lambda: repl.background() == "output of work running in the background is waiting to be read")
        # looking read nothing and ran no cell: the output goes to the next call, as without it
        assert repl.execute("q.wait()").stdout == "late\n0\n"
        assert "<cell 7>" in repl.execute("1/0").stderr
        repl.execute("import os, threading\nthreading.Timer(0.1, os._exit, [5]).start()")
        eventually(
            lambda: repl.background() == "the worker has exited since the last call (the next call starts a fresh one)"
        )


def test_the_repl_runs_sandboxed_and_reset_clears_it(repl, listener):
    repl.execute("x = 1")
    assert repl.execute(CONNECT.format(port=listener)).stdout.startswith("blocked")
    repl.reset()
    result = repl.execute("'x' in globals()")
    assert (result.stdout, result.stderr) == ("False\n", "")


def test_an_unclosed_repl_is_killed_when_collected():
    seconds = unique_seconds()
    repl = PythonREPL()
    repl.execute(f"import subprocess\nsleeper = subprocess.Popen(['sleep', '{seconds}'])")
    eventually(lambda: processes_with(seconds) != [])  # a fresh process's cmdline shows up a moment after exec
    del repl
    gc.collect()
    assert processes_with(seconds) == []


ZOMBIE_PROBE = """
import os
from openenv.core.tools import PythonREPL, run_python, run_shell

def zombies():
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        count += fields[0] == "Z" and int(fields[1]) == os.getpid()
    return count

assert os.getpid() == 1, os.getpid()
for i in range(3):
    run_python("import time; time.sleep(30)", timeout_s=0.3)   # killed at the timeout
    run_python("print(1)")
    run_shell("sleep 30 &", timeout_s=2)                         # leaves a background process
    with PythonREPL() as repl:
        repl.execute("x = 1")
print("zombies", zombies())
"""


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/unshare").exists(), reason="needs root and unshare(1)")
def test_a_namespace_init_running_code_keeps_no_zombies(tmp_path: Path) -> None:
    """A sandboxed server is pid 1 of its pid namespace: killed code sandboxes are re-parented to it,
    and unless it reaps them each one stays a zombie that counts against its process limit."""
    import subprocess
    import sys

    probe = tmp_path / "probe.py"
    probe.write_text(ZOMBIE_PROBE)
    result = subprocess.run(
        ["/usr/bin/unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(probe)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["zombies", "0"]
