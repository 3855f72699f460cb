"""The sandbox broker (openenv.core.tools.broker): a server that runs an agent's code in sandboxes
needs no namespaces of its own, and cannot get privilege through the broker.

As root, a sandboxed server is denied new user namespaces and mounts like any other; its code runs
are started by its broker (root, outside the server's pid and mount namespaces, no package code),
each with a uid and, under the server's cgroup, a memory/pids cgroup of its own. The hostile
package here (escape_env, with ``nested_sandboxes: true``) forges what it sends the broker.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from openenv.core.containers.runtime import SandboxProvider
from openenv.core.containers.runtime.isolation import cgroup_roots, find_bwrap
from openenv.core.generic_client import GenericEnvClient

ESCAPE_ENV = Path(__file__).resolve().parent / "escape_env"
ROOT = os.geteuid() == 0
SERVER_MEMORY_MB = 2048  # SandboxProvider's default
pytestmark = [
    pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)"),
    pytest.mark.skipif(not ROOT, reason="the broker serves servers that SandboxProvider starts as root"),
]


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    """escape_env, declaring that it runs code in sandboxes of its own (as coding_env does)."""
    path = tmp_path_factory.mktemp("nesting") / "escape_env"
    shutil.copytree(ESCAPE_ENV, path, ignore=shutil.ignore_patterns("__pycache__"))
    with open(path / "openenv.yaml", "a") as f:
        f.write("nested_sandboxes: true\n")
    return path


class Served:
    def __init__(self, package: Path, profile: str = "", **kwargs) -> None:
        self.provider = SandboxProvider(str(package), **kwargs)
        if profile:
            self.provider.seccomp_profile = profile
        self.url = self.provider.start()
        self.provider.wait_for_ready(30)
        self.client = GenericEnvClient(base_url=self.url, message_timeout_s=90).sync()
        self.client.reset()

    def value(self, code: str):
        observation = self.client.step({"code": code}).observation
        assert not observation["error"], observation["error"]
        return eval(observation["result"])

    def brokered(self, code: str, **overrides) -> dict:
        return self.value(f"result = probes.brokered({code!r}, **{overrides!r})")

    def close(self) -> None:
        try:
            self.client.close()
        finally:
            self.provider.stop()


@pytest.fixture(scope="module")
def warm(package):
    served = Served(package)
    yield served
    served.close()


@pytest.mark.parametrize("warm_start", [True, False], ids=["warm", "cold"])
def test_a_server_that_runs_code_in_sandboxes_cannot_make_user_namespaces(package, warm_start):
    served = Served(package, warm=warm_start)
    try:
        for probes in (served.value("result = IMPORT_PROBES"), served.value("result = probes.all_probes()")):
            assert probes["userns"] == "EPERM" and probes["Seccomp"] == "2" and probes["CapEff"] == "0" * 16
        # ... and its code runs still work, through the broker: as another uid, never root.
        run = served.value(
            "from openenv.core.tools import run_python\n"
            "import os\n"
            "r = run_python('import os; print(os.getuid())')\n"
            "result = (r.exit_code, r.stdout, r.stderr, os.getuid())"
        )
        exit_code, stdout, stderr, server_uid = run
        assert exit_code == 0, stderr
        assert int(stdout) not in (0, server_uid)
    finally:
        served.close()


def test_without_the_broker_such_a_server_could_make_user_namespaces(package):
    """What the mitigation replaces: the seccomp profile a server needed to run bubblewrap itself."""
    served = Served(package, profile="nesting")
    try:
        assert served.value("result = probes.all_probes()")["userns"].startswith("ok")
    finally:
        served.close()


_CGROUP = "result = open('/proc/self/cgroup').read()"


@pytest.mark.skipif(cgroup_roots() is None or cgroup_roots().version != 1, reason="needs writable cgroup v1")
def test_each_code_run_gets_a_cgroup_of_its_own_under_the_servers(warm):
    cgroups = []
    for _ in range(2):
        run = warm.brokered("print([l for l in open('/proc/self/cgroup').read().splitlines() if ':memory:' in l][0])")
        assert run["exit_code"] == 0, run
        cgroups.append(run["stdout"].strip().split(":")[2])
    server = next(line for line in warm.value(_CGROUP).splitlines() if ":memory:" in line).split(":")[2]
    assert cgroups[0] != cgroups[1] and all("/openenv-tools-" in c and c != server for c in cgroups)
    # On the host, a run's cgroup lives under its server's while the run does, and goes with it.
    roots = cgroup_roots()
    assert roots is not None

    def runs_cgroups() -> list:  # under this process's sandboxes (openenv-<pid>-...): not another test run's
        return [p for root in roots.dirs for p in Path(root).glob(f"openenv-{os.getpid()}-*/*/openenv-tools-*")]

    assert not runs_cgroups()
    warm.value(
        "from openenv.core.tools import PythonREPL\nprobes.REPL = PythonREPL()\nresult = probes.REPL.execute('1').exit_code"
    )
    try:
        assert len(runs_cgroups()) == len(roots.dirs)  # the REPL's worker: one per controller
    finally:
        warm.value("probes.REPL.close()")
    # gone at once, or (a killed worker still exiting on a loaded machine) as soon as it has
    deadline = time.monotonic() + 30
    while runs_cgroups() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not runs_cgroups()


_HOG = """
import os
children = []
for _ in range(4):  # 4 x 300 MiB: each under the per-process limit, together over the run's memory
    pid = os.fork()
    if pid == 0:
        block = b"x" * (300 * 1024 * 1024)
        os._exit(0)
    children.append(pid)
print(sorted(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children))
"""


@pytest.mark.skipif(cgroup_roots() is None or cgroup_roots().version != 1, reason="needs writable cgroup v1")
def test_a_runs_memory_is_bounded_by_its_own_cgroup_and_the_server_lives(warm):
    bounded = warm.brokered(_HOG)  # CODE_LIMITS: 512 MiB for the run
    assert bounded["exit_code"] in (0, 137), bounded
    if bounded["exit_code"] == 0:
        assert -9 in json.loads(bounded["stdout"]), bounded  # the kernel killed a child, in the run's cgroup
    # The same code with room for it: every child finishes (so the kill above was the run's limit).
    roomy = warm.value(
        "from dataclasses import replace\nfrom openenv.core.tools import CODE_LIMITS\n"
        f"result = probes.brokered({_HOG!r}, spec_limits=replace(CODE_LIMITS, memory_mb=1800, max_processes=16))"
    )
    assert roomy["exit_code"] == 0 and json.loads(roomy["stdout"]) == [0, 0, 0, 0], roomy
    assert warm.value("result = 'alive'") == "alive"


def test_what_gives_privilege_is_the_brokers_choice(warm):
    code = (
        "import os, resource\n"
        "print(os.getuid(), os.getgid(), resource.getrlimit(resource.RLIMIT_AS)[0], resource.getrlimit(resource.RLIMIT_NPROC)[0])"
    )
    forged = warm.brokered(
        code,
        uid=0,
        cgroup_fds=[],
        rlimits=[],
        kill_all=False,
        limits={
            "memory_mb": 10**7,
            "max_processes": 10**6,
            "max_open_files": 10**6,
            "cpu_seconds": None,
            "max_file_size_mb": 10**6,
            "tmp_size_mb": 10**6,
        },
    )
    assert forged.get("exit_code") == 0, forged
    uid, gid, address_space, processes = (int(x) for x in forged["stdout"].split())
    assert uid != 0 and gid != 0
    assert address_space <= SERVER_MEMORY_MB * 1024 * 1024 and processes <= 256  # never above the server's


@pytest.mark.parametrize(
    ("overrides", "refusal"),
    [
        ({"isolation": "none"}, "sandboxed runs only"),
        ({"python": "/bin/sh"}, "not an interpreter the sandbox broker runs code on"),
        ({"python": "/tmp/python3"}, "not an interpreter"),
        ({"import_paths": ["/root"]}, "needs its open directory"),
        ({"packages": ["os.path"]}, "not a top-level module name"),
        ({"script_name": "../../etc/cron.d/x"}, "not a plain file name"),
        ({"files": {"../escape": "x"}}, "must be a relative path"),
        ({"argv": []}, "argv must hold"),
        ({"env": {"A": 1}}, "map strings to strings"),
        ({"limits": {"memory_mb": -1}}, "non-negative"),
    ],
)
def test_the_broker_refuses_what_it_cannot_check(warm, overrides, refusal):
    refused = warm.brokered("print('ran')", **overrides)
    assert "refused" in refused and refusal in refused["refused"], refused
    assert warm.brokered("print('ran')")["stdout"] == "ran\n"  # and serves the next run as ever


_PRELOAD = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    if (getuid() != 0) return;
    const char *dir = getenv("MARK_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/preloaded-as-root", dir ? dir : "/tmp");
    FILE *f = fopen(path, "w");
    if (f) fclose(f);
}
"""


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build the preloaded library")
def test_the_runs_environment_never_reaches_the_root_processes_that_start_it(package, tmp_path):
    source = tmp_path / "mark.c"
    source.write_text(_PRELOAD)
    library = package / "mark.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    # The attack is real: a root process started with this environment runs the library's code.
    subprocess.run([find_bwrap(), "--version"], env={"LD_PRELOAD": str(library), "MARK_DIR": str(tmp_path)}, check=True)
    assert (tmp_path / "preloaded-as-root").exists()
    served = Served(package)
    try:
        project = served.value("import os, sys; result = [p for p in sys.path if os.path.exists(p + '/mark.so')]")
        assert project, "the library should be visible in the server"
        run = served.brokered("print('ran')", env={"LD_PRELOAD": project[0] + "/mark.so", "MARK_DIR": "/tmp"})
        assert run.get("stdout") == "ran\n", run
        # The broker's bubblewrap would have left its mark in /tmp, the server's, which the broker shares.
        assert served.value("import os; result = os.path.exists('/tmp/preloaded-as-root')") is False
    finally:
        served.close()
        library.unlink()


# --- issue 36.3: a package name must not show the broker's own directories --------------------

# Run in the nested sandbox: what the directory a package name showed holds; for a /proc, the
# processes in it and the programs they run.
_PEEK = """
import json, os
shown = "/run/openenv/site/" + NAME
try:
    entries = os.listdir(shown)
except OSError:  # a file, or a directory this uid may not list: shown all the same
    entries = []
pids = [e for e in entries if e.isdigit()]
programs = []
for pid in pids:
    try:
        programs.append(open(f"{shown}/{pid}/cmdline", "rb").read().split(b"\\0")[0].decode())
    except OSError:
        pass
print(json.dumps({"entries": len(entries), "pids": len(pids), "programs": sorted(set(programs))}))
"""

# Run in the server: the hostile package asks for the directory as a package, honestly.
_ASK = """
from openenv.core.tools import run_python
try:
    run = run_python("NAME = {name!r}\\n" + {peek!r}, packages=[{name!r}])
    result = {{"ran": run.stdout, "stderr": run.stderr[-500:]}}
except ValueError as exc:
    result = {{"refused": str(exc)}}
"""


@pytest.mark.parametrize("name", ["proc", "etc", "dev", "root", "tmp"])
def test_a_servers_package_name_cannot_show_the_brokers_directories(warm, name):
    outcome = warm.value(_ASK.format(name=name, peek=_PEEK))
    own = warm.value("import os; result = len([p for p in os.listdir('/proc') if p.isdigit()])")
    assert "ran" not in outcome, (
        f"packages=[{name!r}] showed the broker's /{name} (the server sees {own} pids): {outcome}"
    )
    assert f"'{name}'" in outcome["refused"] and "not importable" in outcome["refused"], outcome


@pytest.mark.parametrize("name", [".", "..", "/proc", "proc.self", "proc/self", "", "class", "pröc"])
def test_a_forged_package_name_is_refused_before_the_broker_resolves_it(warm, name):
    refused = warm.brokered("print('ran')", packages=[name])
    assert "refused" in refused and "not a top-level module name" in refused["refused"], refused


def test_an_installed_package_is_still_shown_to_a_servers_runs(warm):
    pytest.importorskip("numpy")
    run = warm.value(
        "from openenv.core.tools import run_python\n"
        "r = run_python('import numpy; print(numpy.arange(4).sum())', packages=['numpy'])\n"
        "result = (r.exit_code, r.stdout, r.stderr[-500:])"
    )
    assert run[:2] == (0, "6\n"), run
