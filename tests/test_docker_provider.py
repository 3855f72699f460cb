"""LocalDockerProvider and the Dockerfile template.

Three kinds of tests:

* against a real Docker engine (``real_engine``): they run wherever one is reachable and are
  skipped, with the reason, where none is;
* against the real SDK with no engine behind it (``DOCKER_HOST`` at a socket that does not
  exist): the errors a user sees without Docker;
* against :class:`FakeDockerClient`, a stand-in for the SDK's client, for the calls the provider
  makes (ports, labels, environment, stop/remove). It exists because no Docker engine can run on
  the machines where this suite must pass; the real-engine tests check the same behaviour for real.
"""

from __future__ import annotations

import gc
import http.server
import itertools
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from fnmatch import fnmatch
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

from openenv.core.containers.runtime.docker import (
    MANAGED_LABEL,
    LocalDockerProvider,
    dockerfile_template,
)

try:
    import docker
    from docker.models.containers import _create_container_args
except ImportError:  # the template tests and the missing-SDK test still run
    docker = None

NO_SDK = "the docker SDK is not installed: pip install 'openenv[docker]'"
needs_sdk = pytest.mark.skipif(docker is None, reason=NO_SDK)

ROOT = Path(__file__).resolve().parents[1]
SECRET = "s3cr3t-token-do-not-print"
SECRETS = {"API_KEY": SECRET, "DB_PASSWORD": "hunter2-but-longer"}


# ---------------------------------------------------------------------------------------------
# A stand-in for docker.DockerClient: records what the provider asks of the engine. It stands in
# for a Docker engine that cannot run on this machine; it raises the SDK's own exception classes.
# ---------------------------------------------------------------------------------------------


def _api_error(status: int, explanation: str) -> Exception:
    import requests

    response = requests.Response()
    response.status_code = status
    response.url = "http+docker://localhost/v1.47/containers/create"
    response.reason = "Error"
    cls = docker.errors.NotFound if status == 404 else docker.errors.APIError
    return cls(explanation, response=response, explanation=explanation)


class FakeContainer:
    def __init__(self, engine: FakeDockerClient, name: str, image: str, options: Dict[str, Any]) -> None:
        self.engine = engine
        self.id = f"{next(engine.ids):064x}"
        self.name = name
        self.image = image
        self.options = options
        self.status = "running"
        self.exit_code: Optional[int] = None
        self.removed = False
        self.output: List[bytes] = list(engine.next_output)
        self.attrs: Dict[str, Any] = {}

    def exit(self, code: int) -> None:
        """The server process ends; with auto_remove the engine removes the container."""
        self.status, self.exit_code = "exited", code
        if self.options.get("auto_remove"):
            self.removed = True

    def reload(self) -> None:
        if self.removed:
            raise docker.errors.NotFound(f"No such container: {self.id}")
        ports: Dict[str, Any] = {}
        networks: Dict[str, Any] = {"bridge": {"IPAddress": "172.17.0.5"}}
        if "ports" in self.options:
            host_ip, host_port = self.options["ports"]["8000/tcp"]
            ports["8000/tcp"] = [{"HostIp": host_ip, "HostPort": str(host_port or 49153)}]
        if "network" in self.options:
            networks = {self.options["network"]: {"IPAddress": "172.30.0.7"}}
        self.attrs = {
            "NetworkSettings": {"Ports": ports, "Networks": networks},
            "State": {"Status": self.status, "ExitCode": self.exit_code or 0},
        }

    def logs(self, **kwargs: Any) -> Iterator[bytes]:
        self.engine.calls.append(("logs", self.name, kwargs))
        return iter(self.output)

    def stop(self, timeout: int = 10) -> None:
        self.engine.calls.append(("stop", self.name, {"timeout": timeout}))
        if self.removed:
            raise docker.errors.NotFound(f"No such container: {self.id}")
        self.exit(143)

    def remove(self, force: bool = False) -> None:
        self.engine.calls.append(("remove", self.name, {"force": force}))
        if self.removed:
            raise docker.errors.NotFound(f"No such container: {self.id}")
        self.removed = True


class FakeContainers:
    def __init__(self, engine: FakeDockerClient) -> None:
        self.engine = engine

    def run(self, image: str, **options: Any) -> FakeContainer:
        self.engine.calls.append(("run", image, options))
        # The SDK's own translation of run() arguments into the engine's create request (a private
        # helper of docker.models.containers): it rejects arguments the real run() would reject.
        sdk_args = {key: value for key, value in options.items() if key != "detach"}
        self.engine.create_request = _create_container_args({**sdk_args, "image": image, "version": "1.47"})
        container = FakeContainer(self.engine, options.get("name", "anon"), image, options)
        self.engine.containers_by_name[container.name] = container
        if self.engine.fail_start is not None:  # created, then start failed
            raise self.engine.fail_start
        if self.engine.exit_at_once is not None:
            container.exit(self.engine.exit_at_once)
        return container

    def get(self, key: str) -> FakeContainer:
        for container in self.engine.containers_by_name.values():
            if key in (container.id, container.name) and not container.removed:
                return container
        raise docker.errors.NotFound(f"No such container: {key}")


class FakeNetwork:
    def __init__(self, name: str, options: Dict[str, Any]) -> None:
        self.name, self.options = name, options


class FakeNetworks:
    def __init__(self, engine: FakeDockerClient) -> None:
        self.engine = engine
        self.created: List[FakeNetwork] = []

    def list(self, names: Optional[List[str]] = None) -> List[FakeNetwork]:
        return [net for net in self.created if names is None or net.name in names]

    def create(self, name: str, **options: Any) -> FakeNetwork:
        network = FakeNetwork(name, options)
        self.created.append(network)
        return network


class FakeDockerClient:
    def __init__(self) -> None:
        self.ids = itertools.count(1)
        self.calls: List[Any] = []
        self.create_request: Dict[str, Any] = {}
        self.containers_by_name: Dict[str, FakeContainer] = {}
        self.containers = FakeContainers(self)
        self.networks = FakeNetworks(self)
        self.next_output: List[bytes] = [b"INFO: Started server process\n"]
        self.fail_start: Optional[Exception] = None
        self.exit_at_once: Optional[int] = None
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def run_options(self) -> Dict[str, Any]:
        (options,) = [call[2] for call in self.calls if call[0] == "run"]
        return options

    def only_container(self) -> FakeContainer:
        (container,) = self.containers_by_name.values()
        return container


@pytest.fixture
def fake() -> FakeDockerClient:
    if docker is None:
        pytest.skip(NO_SDK)
    return FakeDockerClient()


@pytest.fixture
def provider(fake: FakeDockerClient) -> Iterator[LocalDockerProvider]:
    with LocalDockerProvider(client=fake, stop_timeout_s=2) as provider:
        yield provider


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# Starting: what the provider asks of the engine
# ---------------------------------------------------------------------------------------------


def test_publishes_port_8000_on_loopback_only_on_a_port_docker_picks(
    provider: LocalDockerProvider, fake: FakeDockerClient
) -> None:
    url = provider.start_container("openenv-echo:latest")
    assert fake.run_options()["ports"] == {"8000/tcp": ("127.0.0.1", None)}
    assert url == "http://127.0.0.1:49153"  # the port the engine reported back


def test_the_engine_is_asked_for_a_loopback_binding_on_a_port_of_its_choosing(
    provider: LocalDockerProvider, fake: FakeDockerClient
) -> None:
    provider.start_container("openenv-echo", mem_limit="1g", cpus=0.5, pids_limit=64)
    host_config = fake.create_request["host_config"]
    assert host_config["PortBindings"] == {"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": ""}]}
    assert host_config["AutoRemove"] is True
    assert (host_config["Memory"], host_config["NanoCpus"], host_config["PidsLimit"]) == (2**30, 500_000_000, 64)


def test_publishes_on_the_port_asked_for(provider: LocalDockerProvider, fake: FakeDockerClient) -> None:
    assert provider.start_container("openenv-echo", port=18123) == "http://127.0.0.1:18123"
    assert fake.run_options()["ports"] == {"8000/tcp": ("127.0.0.1", 18123)}


def test_runs_detached_self_removing_named_and_labelled(provider: LocalDockerProvider, fake: FakeDockerClient) -> None:
    provider.start_container("ghcr.io/acme/coding-env:1.2@sha256:abc")
    options = fake.run_options()
    assert options["detach"] is True and options["auto_remove"] is True
    assert options["name"].startswith("openenv-coding-env-") and options["name"] == provider.container_name
    assert options["labels"][MANAGED_LABEL] == "1"
    assert options["labels"]["openenv.image"] == "ghcr.io/acme/coding-env:1.2@sha256:abc"


def test_env_vars_travel_as_the_environment_mapping(provider: LocalDockerProvider, fake: FakeDockerClient) -> None:
    provider.start_container("openenv-echo", env_vars=SECRETS)
    options = fake.run_options()
    assert options["environment"] == SECRETS
    assert "command" not in options  # never on a command line


def test_resource_options_reach_the_sdk(provider: LocalDockerProvider, fake: FakeDockerClient) -> None:
    provider.start_container("openenv-echo", mem_limit="2g", cpus=1.5, pids_limit=128, command=["python", "-m", "srv"])
    options = fake.run_options()
    assert (options["mem_limit"], options["nano_cpus"], options["pids_limit"]) == ("2g", 1_500_000_000, 128)
    assert options["command"] == ["python", "-m", "srv"]


def test_network_disabled_uses_an_internal_network_and_the_container_address(
    provider: LocalDockerProvider, fake: FakeDockerClient
) -> None:
    url = provider.start_container("openenv-echo", network_disabled=True)
    (network,) = fake.networks.created
    assert network.name == "openenv-isolated" and network.options["internal"] is True
    options = fake.run_options()
    assert options["network"] == "openenv-isolated" and "ports" not in options
    assert fake.create_request["host_config"]["NetworkMode"] == "openenv-isolated"
    assert url == "http://172.30.0.7:8000"


def test_unknown_options_raise_type_error_before_anything_runs(
    provider: LocalDockerProvider, fake: FakeDockerClient
) -> None:
    with pytest.raises(TypeError, match=r"'volumes'.*accepts"):
        provider.start_container("openenv-echo", volumes={"/": {"bind": "/host"}})
    assert fake.calls == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"port": 0},
        {"port": 70000},
        {"cpus": -1},
        {"cpus": 1, "nano_cpus": 10**9},
        {"pids_limit": 0},
        {"mem_limit": True},
        {"command": "python -m srv"},
        {"network_disabled": "yes"},
        {"network_disabled": True, "port": 8080},
        {"env_vars": {"A=B": "x"}},
        {"env_vars": {"N": 3}},
    ],
)
def test_bad_arguments_are_refused(
    provider: LocalDockerProvider, fake: FakeDockerClient, kwargs: Dict[str, Any]
) -> None:
    with pytest.raises((TypeError, ValueError)):
        provider.start_container("openenv-echo", **kwargs)
    assert fake.calls == []


def test_one_container_per_provider(provider: LocalDockerProvider) -> None:
    provider.start_container("openenv-echo")
    with pytest.raises(RuntimeError, match="already runs container"):
        provider.start_container("openenv-echo")


def test_a_container_that_exits_at_once_fails_start_with_its_output(
    provider: LocalDockerProvider, fake: FakeDockerClient
) -> None:
    fake.next_output = [b"Traceback (most recent call last):\n", f"KeyError: {SECRET}\n".encode()]
    fake.exit_at_once = 1
    with pytest.raises(RuntimeError, match="exited before its server became ready") as info:
        provider.start_container("openenv-echo", env_vars=SECRETS)
    assert "KeyError: ***" in str(info.value) and SECRET not in str(info.value)
    assert provider.container_name is None


# ---------------------------------------------------------------------------------------------
# Secrets stay out of errors
# ---------------------------------------------------------------------------------------------


def test_engine_errors_are_redacted(provider: LocalDockerProvider, fake: FakeDockerClient) -> None:
    fake.fail_start = _api_error(500, f"invalid environment API_KEY={SECRET} DB_PASSWORD=hunter2-but-longer")
    with pytest.raises(RuntimeError, match="could not start a container") as info:
        provider.start_container("openenv-echo", env_vars=SECRETS)
    message = str(info.value)
    assert "API_KEY=***" in message
    assert all(value not in message for value in SECRETS.values())


def test_a_container_created_but_not_started_is_removed(provider: LocalDockerProvider, fake: FakeDockerClient) -> None:
    fake.fail_start = _api_error(500, "driver failed programming external connectivity: port is already allocated")
    with pytest.raises(RuntimeError, match="port is already allocated"):
        provider.start_container("openenv-echo", port=18123)
    assert fake.only_container().removed


@needs_sdk
def test_no_engine_is_a_clear_error_without_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent.sock")
    provider = LocalDockerProvider()
    with pytest.raises(RuntimeError, match=r"no Docker engine reachable at unix:///nonexistent\.sock") as info:
        provider.start_container("openenv-echo", env_vars=SECRETS)
    message = str(info.value)
    assert "DOCKER_HOST" in message  # says what to do
    assert all(value not in message for value in SECRETS.values())
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no chained SDK traceback


@needs_sdk
def test_docker_host_credentials_are_not_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "tcp://admin:pa55word-xyz@127.0.0.1:1")
    with pytest.raises(RuntimeError, match="no Docker engine reachable") as info:
        LocalDockerProvider().start_container("openenv-echo")
    assert "pa55word-xyz" not in str(info.value)


def test_missing_sdk_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "docker", None)  # makes `import docker` fail
    with pytest.raises(ImportError, match=r"pip install 'openenv\[docker\]'"):
        LocalDockerProvider()


def test_importing_the_provider_does_not_import_the_sdk() -> None:
    code = (
        "import sys, openenv.core, openenv.core.containers.runtime.docker as d; "
        "assert 'docker' not in sys.modules, 'docker imported'; print(d.LocalDockerProvider.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


# ---------------------------------------------------------------------------------------------
# Waiting for the server
# ---------------------------------------------------------------------------------------------


def test_wait_for_ready_polls_health_until_it_answers_200(provider: LocalDockerProvider) -> None:
    # A plain HTTP server standing in for the container's: 503 twice, then 200.
    hits: List[str] = []

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            self.send_response(200 if len(hits) >= 3 else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        provider.wait_for_ready(f"http://127.0.0.1:{server.server_port}/", timeout_s=10)
    finally:
        server.shutdown()
        server.server_close()
    assert hits == ["/health"] * 3  # it returned at the first 200, and asked no more


def test_wait_for_ready_times_out_with_a_clear_message(provider: LocalDockerProvider) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"did not answer GET /health with 200 within 0\.5 s"):
        provider.wait_for_ready(url, timeout_s=0.5)
    assert time.monotonic() - started < 2


def test_wait_for_ready_fails_fast_when_the_container_exits(
    provider: LocalDockerProvider, fake: FakeDockerClient
) -> None:
    fake.next_output = [b"loading...\n", f"ValueError: bad token {SECRET}".encode()]
    provider.start_container("openenv-echo", env_vars=SECRETS)
    fake.only_container().exit(1)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="exited before its server became ready") as info:
        provider.wait_for_ready(f"http://127.0.0.1:{_closed_port()}", timeout_s=30)
    assert time.monotonic() - started < 5
    assert "ValueError: bad token ***" in str(info.value) and SECRET not in str(info.value)


# ---------------------------------------------------------------------------------------------
# Stopping
# ---------------------------------------------------------------------------------------------


def test_stop_stops_with_a_short_grace_period_then_removes(
    provider: LocalDockerProvider, fake: FakeDockerClient
) -> None:
    provider.start_container("openenv-echo")
    fake.only_container().options["auto_remove"] = False  # as if the engine were slow to remove it
    provider.stop_container()
    assert [call for call in fake.calls if call[0] in ("stop", "remove")] == [
        ("stop", fake.only_container().name, {"timeout": 2}),
        ("remove", fake.only_container().name, {"force": True}),
    ]
    assert fake.only_container().removed and provider.container_name is None


def test_stop_is_idempotent_and_ignores_a_container_already_gone(
    provider: LocalDockerProvider, fake: FakeDockerClient
) -> None:
    provider.start_container("openenv-echo")
    fake.only_container().exit(0)  # exited and removed by itself
    provider.stop_container()  # the (fake) engine answers NotFound: no stop or remove tried, no error
    assert provider.container_name is None
    provider.stop_container()  # nothing left to stop
    assert [call for call in fake.calls if call[0] in ("stop", "remove")] == []


def test_close_stops_the_container_and_leaves_a_passed_client_open(fake: FakeDockerClient) -> None:
    provider = LocalDockerProvider(client=fake)
    provider.start_container("openenv-echo")
    provider.close()
    assert fake.only_container().removed and not fake.closed


def test_a_dropped_provider_stops_its_container(fake: FakeDockerClient) -> None:
    provider = LocalDockerProvider(client=fake)
    provider.start_container("openenv-echo")
    del provider
    gc.collect()
    assert fake.only_container().removed


@needs_sdk
def test_containers_are_stopped_at_interpreter_exit(tmp_path: Path) -> None:
    marker = tmp_path / "stopped"
    code = f"""
import sys
from pathlib import Path
from tests.test_docker_provider import FakeDockerClient, FakeContainer
from openenv.core.containers.runtime.docker import LocalDockerProvider

stop = FakeContainer.stop
def recording_stop(self, timeout=10):
    stop(self, timeout)
    Path({str(marker)!r}).write_text(self.name)
FakeContainer.stop = recording_stop

KEEP = LocalDockerProvider(client=FakeDockerClient())  # alive until the interpreter exits
print(KEEP.start_container("openenv-echo"))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert marker.read_text().startswith("openenv-openenv-echo-")


# ---------------------------------------------------------------------------------------------
# The Dockerfile template
# ---------------------------------------------------------------------------------------------


def test_template_is_declared_as_package_data() -> None:
    tomllib = pytest.importorskip("tomllib", reason="Python < 3.11 has no tomllib")
    package_dir = ROOT / "src/openenv/core/containers/runtime"
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    patterns = config["openenv.core.containers.runtime"]
    assert any(fnmatch("templates/Dockerfile", pattern) for pattern in patterns)
    assert (package_dir / "templates/Dockerfile").read_text() == dockerfile_template()


def test_template_has_the_container_contract() -> None:
    lines = [line.strip() for line in dockerfile_template().splitlines() if line.strip() and not line.startswith("#")]
    assert lines[0] == "FROM python:3.11-slim"
    assert "EXPOSE 8000" in lines
    assert any(line.startswith("RUN ") and "pip install" in line for line in lines)
    user = [line for line in lines if line.startswith("USER ")]
    assert user and user[-1] not in ("USER root", "USER 0")
    health = dockerfile_template().split("HEALTHCHECK", 1)[1].split("\n\n", 1)[0]
    assert "/health" in health and "urllib" in health and "curl" not in health
    (cmd,) = [line for line in dockerfile_template().splitlines() if line.startswith("CMD ")]  # not HEALTHCHECK's
    assert "python -m openenv.core.env_server" in cmd and "--host 0.0.0.0 --port 8000" in cmd


def test_template_serves_the_app_named_in_openenv_yaml(tmp_path: Path) -> None:
    # Run the template's build step that reads openenv.yaml, as `sh -c` would in the build.
    (line,) = [line for line in dockerfile_template().splitlines() if line.startswith("RUN python -c")]
    script = line.removeprefix("RUN ").removesuffix(" \\").replace("/app/openenv-app", str(tmp_path / "app"))
    (tmp_path / "openenv.yaml").write_text('name: x\napp: "my_env.server.app:app"  # the ASGI app\nport: 8000\n')
    subprocess.run(["sh", "-c", script.replace("python", shlex.quote(sys.executable), 1)], cwd=tmp_path, check=True)
    assert (tmp_path / "app").read_text() == "my_env.server.app:app"
    (tmp_path / "openenv.yaml").write_text("name: x\n")
    subprocess.run(["sh", "-c", script.replace("python", shlex.quote(sys.executable), 1)], cwd=tmp_path, check=True)
    assert (tmp_path / "app").read_text() == "server.app:app"


def _exec_form(instruction: str) -> List[str]:
    """The JSON argv of the template's ``CMD`` or ``HEALTHCHECK ... CMD`` (Docker silently runs
    malformed JSON as a shell command, so it must parse)."""
    lines = dockerfile_template().replace("\\\n", " ").splitlines()  # join continued lines
    (line,) = [line for line in lines if line.startswith(instruction + " ")]
    return json.loads(line.split("CMD ", 1)[1])


def test_template_health_check_passes_on_a_healthy_server_only(counter_server: Any) -> None:
    argv = _exec_form("HEALTHCHECK")
    assert argv[:2] == ["python", "-c"]
    port = counter_server.base_url.rsplit(":", 1)[1]
    healthy = subprocess.run([sys.executable, "-c", argv[2].replace("8000", port)], capture_output=True, timeout=30)
    down = subprocess.run(
        [sys.executable, "-c", argv[2].replace("8000", str(_closed_port()))], capture_output=True, timeout=30
    )
    assert (healthy.returncode, down.returncode) == (0, 1), healthy.stderr


def test_template_command_serves_the_environment(tmp_path: Path) -> None:
    # The template's CMD, run here on the echo environment: loopback and a free port instead of 0.0.0.0:8000.
    argv = _exec_form("CMD")
    assert argv[:2] == ["sh", "-c"]
    (tmp_path / "app").write_text("server.app:app")
    port = _closed_port()
    script = (
        argv[2]
        .replace("python ", shlex.quote(sys.executable) + " ")
        .replace("/app/openenv-app", str(tmp_path / "app"))
        .replace("--host 0.0.0.0 --port 8000", f"--host 127.0.0.1 --port {port}")
    )
    server = subprocess.Popen(
        ["sh", "-c", script], cwd=ROOT / "envs/echo_env", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                assert _get_json(f"http://127.0.0.1:{port}/health") == {"status": "healthy"}
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, server.stderr.read().decode()[-2000:]
                time.sleep(0.1)
        # where OpenEnv is installed, its runner serves (sh exec'd it: the same process)
        command_line = Path(f"/proc/{server.pid}/cmdline").read_bytes().split(b"\0")
        assert command_line[1:3] == [b"-m", b"openenv.core.env_server"], command_line
    finally:
        server.terminate()
        server.wait(10)


# ---------------------------------------------------------------------------------------------
# Against a real Docker engine (skipped where none is reachable)
# ---------------------------------------------------------------------------------------------

BASE_IMAGE = "python:3.11-slim"

# A tiny server standing in for an environment: /health, and /env to show what reached it.
HEALTH_SERVER = """
import http.server, json, os
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"status": "healthy", "token": os.environ.get("OPENENV_TEST_TOKEN")}).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json"); self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("0.0.0.0", 8000), H).serve_forever()
"""


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    if docker is None:
        pytest.skip(f"no Docker engine: {NO_SDK}")
    try:
        client = docker.from_env(timeout=10)
        client.ping()
    except Exception as exc:
        pytest.skip(f"no Docker engine: {type(exc).__name__}: {exc}")
    try:
        client.images.get(BASE_IMAGE)
    except docker.errors.ImageNotFound:
        try:
            client.images.pull(BASE_IMAGE)
        except Exception as exc:
            pytest.skip(f"Docker engine found, but {BASE_IMAGE} is not available: {exc}")
    yield client
    client.close()


def _get_json(url: str) -> Any:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=5) as response:
        return json.loads(response.read())


def test_real_engine_start_wait_stop(engine: Any) -> None:
    with LocalDockerProvider(stop_timeout_s=1) as provider:
        url = provider.start_container(
            BASE_IMAGE,
            env_vars={"OPENENV_TEST_TOKEN": SECRET},
            command=["python", "-c", HEALTH_SERVER],
            mem_limit="256m",
        )
        provider.wait_for_ready(url, timeout_s=60)
        assert _get_json(url + "/health")["token"] == SECRET
        name = provider.container_name
        info = engine.api.inspect_container(name)
        assert info["HostConfig"]["AutoRemove"] is True
        assert info["Config"]["Labels"][MANAGED_LABEL] == "1"
        assert {b["HostIp"] for b in info["NetworkSettings"]["Ports"]["8000/tcp"]} == {"127.0.0.1"}
        provider.stop_container()
        deadline = time.monotonic() + 10
        while any(c.name == name for c in engine.containers.list(all=True)) and time.monotonic() < deadline:
            time.sleep(0.2)  # auto_remove may still be finishing
        assert not any(c.name == name for c in engine.containers.list(all=True))
        provider.stop_container()  # idempotent


def test_real_engine_server_that_dies_fails_fast_with_its_output(engine: Any) -> None:
    with LocalDockerProvider(stop_timeout_s=1) as provider:
        script = "import sys, time; time.sleep(1); print('boom: cannot load app'); sys.exit(3)"
        url = provider.start_container(BASE_IMAGE, command=["python", "-c", script])
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="boom: cannot load app"):
            provider.wait_for_ready(url, timeout_s=60)
        assert time.monotonic() - started < 20


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("OPENENV_DOCKER_BUILD"),
    reason="set OPENENV_DOCKER_BUILD=1: builds an image (network access to PyPI)",
)
def test_real_engine_builds_and_serves_the_echo_env_from_the_template(engine: Any, tmp_path: Path) -> None:
    context = tmp_path / "echo_env"
    shutil.copytree(
        ROOT / "envs/echo_env", context, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__", "tests")
    )
    (context / "Dockerfile").write_text(dockerfile_template())
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(context / "wheels"), str(ROOT)], check=True
    )
    tag = "openenv-echo-template-test:latest"
    engine.images.build(path=str(context), tag=tag, rm=True)
    try:
        with LocalDockerProvider() as provider:
            url = provider.start_container(tag)
            provider.wait_for_ready(url, timeout_s=120)
            assert _get_json(url + "/health")["status"] == "healthy"
            uid = engine.containers.get(provider.container_name).exec_run(["id", "-u"]).output.strip()
            assert uid != b"0"
    finally:
        engine.images.remove(tag, force=True)
