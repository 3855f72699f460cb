"""Attacks from an agent's code on the code sandboxes of openenv.core.tools (issue 18, C, D, F).

Each attack runs in a real sandbox, where it must fail, and, where that is safe and cheap,
without one (``isolation="none"``), where it must succeed: proof that it is a real attack.
The environments (coding_env, repl_env) are used in-process: this test process is their server.
"""

from __future__ import annotations

import base64
import json
import os
import struct
import time
import uuid
from pathlib import Path

import pytest

from openenv.core.containers.runtime.isolation import find_bwrap
from openenv.core.tools import PythonREPL, TreeError, _tree, run_python, run_shell, run_shell_in_directory

pytestmark = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")

CHECKOUT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024


def record(kind: bytes, name: str, payload: bytes = b"", mode: int = 0o644, size: int = -1) -> bytes:
    """One entry of a packed tree, as a forger would write it (``size`` may lie)."""
    encoded = name.encode()
    declared = len(payload) if size < 0 else size
    return struct.pack(">cIqQI", kind, mode, 0, declared, len(encoded)) + encoded + payload


END = struct.pack(">cIqQI", b".", 0, 0, 0, 0)


# --- C: the channel that carries a command's work directory back ------------------------------

FORGE = """
import os, sys, base64
forged = base64.b64decode(sys.argv[2])
try:
    fds = os.listdir(f"/proc/{sys.argv[1]}/fd")
except OSError as exc:
    fds = [str(fd) for fd in range(3, 64)]  # guess them instead
    print("refused listing", exc.strerror)
for fd in fds:
    if int(fd) > 2:
        try:
            with open(f"/proc/{sys.argv[1]}/fd/{fd}", "wb") as f:
                f.write(forged)
            print("wrote", fd)
        except OSError as exc:
            print("refused", fd, exc.strerror)
"""


@pytest.mark.parametrize("isolation", ["sandbox", "none"])
def test_a_command_cannot_forge_the_result_of_its_work_directory(tmp_path, isolation):
    """The command writes a forged result into every descriptor of its parent (the launcher) and
    kills it, so that only the forgery arrives. Without a sandbox (root, same process tree) the
    forgery replaces the work directory; in the sandbox the launcher's descriptors are out of
    reach and its own result arrives."""
    header = json.dumps({"exit_code": 0, "timed_out": False, "refused": []}).encode()
    forged = struct.pack(">I", len(header)) + header + record(b"f", "forged.txt", b"forged") + END
    (tmp_path / "work").mkdir()
    command = (
        f"echo real > real.txt; python3 -c '{FORGE}' $PPID {base64.b64encode(forged).decode()}; kill -9 $PPID; sleep 1"
    )
    result = run_shell_in_directory(command, tmp_path / "work", timeout_s=5, isolation=isolation)
    names = sorted(os.listdir(tmp_path / "work"))
    if isolation == "none":
        assert "wrote" in result.stdout and names == ["forged.txt"]
    else:
        assert "wrote" not in result.stdout and "refused" in result.stdout, result
        assert "Operation not permitted" in result.stderr  # kill -9 of the (root) launcher
        assert result.kept_changes and names == ["real.txt"]


SAME_UID_PROBE = """
import base64, json, os, struct, sys
from openenv.core.tools import run_shell_in_directory
forge, forged, work = sys.argv[1], sys.argv[2], sys.argv[3]
command = f"echo real > real.txt; python3 -c '{forge}' $PPID {forged}"
result = run_shell_in_directory(command, work, timeout_s=5)
print(json.dumps({"uid": os.geteuid(), "stdout": result.stdout, "kept": result.kept_changes, "names": sorted(os.listdir(work))}))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/unshare").exists(), reason="needs root and unshare(1)")
def test_a_same_uid_command_cannot_open_the_launchers_descriptors(tmp_path):
    """Without root, the launcher and the command share a uid (in a user namespace): the
    launcher is not dumpable, so /proc/<launcher>/fd/* stays closed to the command."""
    import subprocess
    import sys

    header = json.dumps({"exit_code": 0, "timed_out": False, "refused": []}).encode()
    forged = struct.pack(">I", len(header)) + header + record(b"f", "forged.txt", b"forged") + END
    work = tmp_path / "work"
    work.mkdir()
    probe = [sys.executable, "-c", SAME_UID_PROBE, FORGE, base64.b64encode(forged).decode(), str(work)]
    done = subprocess.run(
        ["/usr/bin/unshare", "-U", "--map-user=1000", "--map-group=1000", *probe],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["uid"] == 1000  # not root: the sandbox is built in a user namespace
    assert "wrote" not in found["stdout"] and "refused" in found["stdout"], found
    assert found["kept"] and found["names"] == ["real.txt"]


def test_what_a_command_prints_is_only_output(tmp_path):
    """stdout used to carry the packed results: now printing one changes nothing."""
    header = json.dumps({"exit_code": 0, "timed_out": False}).encode()
    forged = struct.pack(">I", len(header)) + header + record(b"f", "forged.txt", b"x") + END
    (tmp_path / "work").mkdir()
    result = run_shell_in_directory(
        f"echo {base64.b64encode(forged).decode()}; echo {base64.b64encode(forged).decode()} | base64 -d",
        tmp_path / "work",
        timeout_s=5,
    )
    assert result.kept_changes and result.exit_code == 0
    assert os.listdir(tmp_path / "work") == []


FORGERIES = {
    "an absolute name": record(b"f", "/tmp/escaped", b"x"),
    "a name climbing out": record(b"f", "../escaped", b"x"),
    "a file under a link to a directory": record(b"d", "d") + record(b"l", "d2", b"d") + record(b"f", "d2/x", b"x"),
    "a link to an absolute path": record(b"l", "etc", b"/etc"),
    "a link climbing out": record(b"d", "a") + record(b"l", "a/out", b"../../escaped"),
    "an entry twice": record(b"f", "x", b"1") + record(b"f", "x", b"2"),
    "a device or hard link": record(b"h", "x", b"/etc/passwd"),
    "a NUL in a name": record(b"f", "x\x00y", b"x"),
    "a size past the limit (a sparse file's)": record(b"f", "big", b"", size=1000 * MIB),
    "data after the end": record(b"f", "x", b"x") + END + record(b"f", "y", b"y"),
}


@pytest.mark.parametrize("forgery", list(FORGERIES))
def test_the_unpacker_refuses_a_malicious_tree(tmp_path, forgery):
    data = FORGERIES[forgery] if forgery == "data after the end" else FORGERIES[forgery] + END
    target = tmp_path / "a" / "b"
    target.mkdir(parents=True)
    with pytest.raises(TreeError):
        _tree.unpack(data, str(target), max_bytes=32 * MIB)
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(["a", "b", *_inside(target)])
    assert not Path("/tmp/escaped").exists()


def _inside(target: Path) -> list:
    return [p.name for p in target.rglob("*")]


def test_a_refused_tree_leaves_the_work_directory_unchanged(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "kept.txt").write_text("before")
    result = run_shell_in_directory("rm kept.txt; mkfifo fifo; ln -s /etc/passwd pw; ln -s kept.txt ok", work)
    assert result.kept_changes and result.skipped == ["fifo", "pw"]
    assert sorted(os.listdir(work)) == ["ok"] and os.readlink(work / "ok") == "kept.txt"


def test_sparse_files_past_the_limit_are_refused_without_being_read(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "kept.txt").write_text("before")
    started = time.monotonic()
    result = run_shell_in_directory(
        "for i in $(seq 20); do truncate -s 50M sparse$i; done; du -sh .", work, max_bytes=32 * MIB
    )
    assert time.monotonic() - started < 10
    assert not result.kept_changes and "grew past 32 MiB" in result.error and "sparse" in result.error
    assert os.listdir(work) == ["kept.txt"]


def test_a_sparse_file_in_the_hosts_copy_is_refused_before_anything_is_read(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    with open(work / "sparse", "wb") as f:
        f.truncate(1000 * MIB)
    started = time.monotonic()
    with pytest.raises(TreeError, match="grew past 32 MiB"):
        run_shell_in_directory("true", work, max_bytes=32 * MIB)
    assert time.monotonic() - started < 1


# --- D: memory the agent's code may take from the server --------------------------------------

FILL_SHM = """
import glob, os
written = 0
try:
    for i in range({mib} // 16):  # files of 16 MiB: each under the per-file size limit
        with open(f"/dev/shm/{marker}-{{i}}", "wb") as f:
            for _ in range(16):
                f.write(b"x" * (1 << 20))
                f.flush()
                written += 1
except OSError as exc:
    print("stopped", exc.strerror)
finally:
    print("wrote", written)
    for path in glob.glob("/dev/shm/{marker}-*"):
        os.unlink(path)
"""


def marker() -> str:
    return f"openenv-test-fill-{uuid.uuid4().hex}"


def test_filling_dev_shm_from_coding_env_is_bounded_and_the_server_lives():
    from coding_env import CodeAction
    from coding_env.server.coding_environment import CodingEnvironment

    env = CodingEnvironment(isolation="sandbox", timeout_s=8)
    env.reset()
    observation = env.step(CodeAction(code=FILL_SHM.format(mib=200, marker=marker())))
    assert "No space left on device" in observation.stdout, observation
    assert int(observation.stdout.split()[-1]) <= 64
    assert env.step(CodeAction(code="print(6 * 7)")).stdout == "42\n"


def test_filling_dev_shm_from_repl_env_is_bounded():
    from repl_env import REPLAction
    from repl_env.server.repl_environment import REPLEnvironment

    env = REPLEnvironment(isolation="sandbox", timeout_s=8)
    try:
        env.reset(task_id="max_number")
        observation = env.step(REPLAction(code=FILL_SHM.format(mib=200, marker=marker())))
        assert "No space left on device" in observation.result.stdout
        assert int(observation.result.stdout.split()[-1]) <= 64
    finally:
        env.close()


def test_without_a_sandbox_dev_shm_takes_more():
    result = run_python(FILL_SHM.format(mib=80, marker=marker()), isolation="none", timeout_s=8)
    assert result.stdout.split()[-1] == "80"


@pytest.mark.parametrize("entry", ["run_python", "run_shell", "repl", "directory"])
def test_the_agents_code_is_the_first_the_kernel_kills_when_memory_runs_out(tmp_path, entry):
    read = "print(open('/proc/self/oom_score_adj').read().strip())"
    if entry == "run_python":
        out = run_python(read).stdout
    elif entry == "run_shell":
        out = run_shell("cat /proc/self/oom_score_adj").stdout
    elif entry == "repl":
        with PythonREPL() as repl:
            out = repl.execute(read).stdout
    else:
        out = run_shell_in_directory("cat /proc/self/oom_score_adj", tmp_path).stdout
    assert out.strip() == "1000"
    assert Path("/proc/self/oom_score_adj").read_text().strip() != "1000"  # the server's own is left alone


# --- F: answer data and the trainer's checkout ------------------------------------------------

READ_TASKS = """
import json
try:
    import repl_env
    print("imported", repl_env.__file__)
except ImportError as exc:
    print("no package:", type(exc).__name__)
try:
    tasks = json.load(open({path!r}))["tasks"]
    print("answers:", [t["answer"] for t in tasks])
except OSError as exc:
    print("no file:", type(exc).__name__)
"""


@pytest.mark.parametrize("isolation", ["sandbox", "none"])
def test_repl_env_code_cannot_read_the_tasks_answers(isolation):
    import repl_env
    from repl_env import REPLAction
    from repl_env.server.repl_environment import REPLEnvironment

    path = str(Path(repl_env.__file__).resolve().parent / "tasks.json")
    env = REPLEnvironment(isolation=isolation)
    try:
        env.reset(task_id="max_number")
        out = env.step(REPLAction(code=READ_TASKS.format(path=path))).result.stdout
    finally:
        env.close()
    if isolation == "none":
        assert "imported" in out and "answers:" in out
    else:
        assert "no package: ModuleNotFoundError" in out and "no file: FileNotFoundError" in out, out
        assert "answers:" not in out


LIST_CHECKOUT = """
import os, sys
for path in ({checkout!r}, {questions!r}, {venv!r}):
    print(path, "visible" if os.path.exists(path) else "absent")
print("site-packages" if any("site-packages" in p and os.listdir(p) for p in sys.path if os.path.isdir(p)) else "no site-packages")
"""


@pytest.mark.parametrize("isolation", ["sandbox", "none"])
def test_coding_env_code_does_not_see_the_trainers_checkout(isolation):
    from coding_env import CodeAction
    from coding_env.server.coding_environment import CodingEnvironment

    questions = CHECKOUT / "envs" / "finqa_env" / "data" / "questions.json"
    code = LIST_CHECKOUT.format(checkout=str(CHECKOUT), questions=str(questions), venv=str(CHECKOUT / ".venv"))
    env = CodingEnvironment(isolation=isolation)
    env.reset()
    out = env.step(CodeAction(code=code)).stdout
    if isolation == "none":
        assert out.count("visible") == 3 and "no site-packages" not in out, out
    else:
        assert out.count("absent") == 3 and "no site-packages" in out, out


# --- the seccomp filter -----------------------------------------------------------------------

KEYCTL = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
# keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0)
ret = libc.syscall({nr}, 0, -3, 0)
print("refused" if ret < 0 and ctypes.get_errno() == 1 else f"keyring {{ret}}")
"""


@pytest.mark.parametrize("isolation", ["sandbox", "none"])
def test_kernel_keyrings_are_refused(isolation):
    from openenv.core.containers.runtime.seccomp import _syscall_number

    out = run_python(KEYCTL.format(nr=_syscall_number("keyctl")), isolation=isolation).stdout
    assert out.startswith("refused" if isolation == "sandbox" else "keyring"), out


def session_keyrings(text: str) -> set:
    return {line.split()[0] for line in text.splitlines() if line.split()[-2:-1] == ["_ses:"] or " _ses" in line}


def test_the_code_has_a_fresh_session_keyring_of_its_own():
    """The trainer's session keyring (and the keys in it) is never the code's."""
    host = session_keyrings(Path("/proc/keys").read_text())
    first = session_keyrings(run_shell("cat /proc/keys").stdout)
    second = session_keyrings(run_shell("cat /proc/keys").stdout)
    assert len(first) == 1 and len(second) == 1 and first != second
    assert not (first | second) & host


@pytest.mark.parametrize("isolation", ["sandbox", "none"])
@pytest.mark.skipif(not Path("/usr/bin/unshare").exists(), reason="needs unshare(1)")
def test_new_user_namespaces_are_refused(isolation):
    result = run_shell("unshare -Urmn id -u", isolation=isolation)
    if isolation == "none":
        assert result.exit_code == 0 and result.stdout == "0\n", result
    else:
        assert result.exit_code != 0 and "Operation not permitted" in result.stderr, result
