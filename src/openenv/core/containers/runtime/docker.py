"""Environment servers in local Docker containers, through the ``docker`` Python SDK.

:class:`LocalDockerProvider` runs an environment image (one built from
:func:`dockerfile_template`, or any image whose server answers ``GET /health`` on port 8000) and
hands the client a base URL. Compared with upstream OpenEnv 0.10 it:

* publishes the server on ``127.0.0.1`` only, on a port Docker picks and reports (no race for a
  free port);
* passes environment variables in the API request (``environment=``), never on a command line,
  and redacts their values from every error message and log line;
* starts containers with ``auto_remove`` and the label ``openenv.managed=1``: a container whose
  server exits removes itself, and ``docker ps -a --filter label=openenv.managed=1`` finds any
  that outlive their client;
* stops its container when the provider is garbage-collected and at interpreter exit. Nothing
  runs when the client process is killed (SIGKILL, a crash, OOM): such containers keep running
  until someone removes them by their label;
* rejects unknown keyword arguments instead of ignoring them, and fails fast (with the
  container's last log lines) when the server exits before it becomes ready.

Every method blocks; async code calls them in a worker thread. The SDK is an optional
dependency (``pip install 'openenv[docker]'``), imported only when a provider is created.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import threading
import time
import uuid
import weakref
from importlib import resources
from typing import Any, Deque, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import urlsplit

from .providers import ContainerProvider

logger = logging.getLogger("openenv.docker")

CONTAINER_PORT = 8000
"""The port the environment server listens on inside the container (the container contract)."""

MANAGED_LABEL = "openenv.managed"
"""Label set (to ``"1"``) on every container and network this module creates."""

ISOLATED_NETWORK = "openenv-isolated"
"""The internal bridge network used for ``network_disabled=True``."""

INSTALL_HINT = "the docker Python SDK is not installed: pip install 'openenv[docker]'"

START_OPTIONS = ("mem_limit", "cpus", "nano_cpus", "pids_limit", "network_disabled", "command")
"""The keyword arguments :meth:`LocalDockerProvider.start_container` accepts beyond the interface's."""

_REDACTED = "***"
_MIN_REDACTED_LEN = 4  # shorter values cannot hide a secret, and replacing them garbles messages
_LOG_LINES = 40


def dockerfile_template() -> str:
    """The Dockerfile template for environment packages laid out as ``openenv init`` makes them.

    Copy it into the package directory (next to ``openenv.yaml``) and build that directory:
    ``docker build -t openenv-<name> <package dir>``.
    """
    return (
        resources.files(__name__.rpartition(".")[0])
        .joinpath("templates")
        .joinpath("Dockerfile")
        .read_text(encoding="utf-8")
    )


def _import_docker() -> Any:
    try:
        import docker
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return docker


def _redact(text: str, secrets: Iterable[str]) -> str:
    for value in sorted(set(secrets), key=len, reverse=True):
        if len(value) >= _MIN_REDACTED_LEN:
            text = text.replace(value, _REDACTED)
    # credentials in URLs (a DOCKER_HOST of tcp://user:password@host, a registry URL)
    return re.sub(r"(?<=//)[^/@\s]+@", f"{_REDACTED}@", text)


def _docker_host() -> str:
    host = os.environ.get("DOCKER_HOST")
    if not host:
        return "the default Docker socket"
    parts = urlsplit(host)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return f"{parts.scheme}://{netloc}{parts.path}" if parts.scheme else host


def _container_name(prefix: str, image: str) -> str:
    base = image.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]
    base = re.sub(r"[^a-zA-Z0-9_.-]+", "-", base).strip("-.") or "env"
    return f"{prefix}-{base}-{uuid.uuid4().hex[:8]}"


def _check_env_vars(env_vars: Optional[Mapping[str, str]]) -> Dict[str, str]:
    environment: Dict[str, str] = {}
    for key, value in (env_vars or {}).items():
        if not isinstance(key, str) or not key or "=" in key or "\x00" in key:
            raise ValueError(f"env_vars: invalid variable name {key!r}")
        if not isinstance(value, str):
            raise TypeError(f"env_vars[{key!r}] must be a str, not {type(value).__name__}")
        environment[key] = value
    return environment


def _check_options(options: Dict[str, Any]) -> Dict[str, Any]:
    """Validate ``start_container``'s extra keyword arguments; return the SDK's ``run`` options."""
    unknown = sorted(set(options) - set(START_OPTIONS))
    if unknown:
        raise TypeError(
            f"start_container() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; "
            f"LocalDockerProvider accepts {', '.join(START_OPTIONS)}"
        )
    run: Dict[str, Any] = {}
    mem_limit = options.get("mem_limit")
    if mem_limit is not None:
        if isinstance(mem_limit, bool) or not isinstance(mem_limit, (int, float, str)) or not str(mem_limit).strip():
            raise TypeError("mem_limit must be a number of bytes or a string such as '2g'")
        run["mem_limit"] = mem_limit
    cpus, nano_cpus = options.get("cpus"), options.get("nano_cpus")
    if cpus is not None and nano_cpus is not None:
        raise TypeError("pass cpus or nano_cpus, not both")
    if cpus is not None:
        if isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or cpus <= 0:
            raise ValueError(f"cpus must be a positive number, got {cpus!r}")
        run["nano_cpus"] = int(cpus * 1e9)
    if nano_cpus is not None:
        if isinstance(nano_cpus, bool) or not isinstance(nano_cpus, int) or nano_cpus <= 0:
            raise ValueError(f"nano_cpus must be a positive int, got {nano_cpus!r}")
        run["nano_cpus"] = nano_cpus
    pids_limit = options.get("pids_limit")
    if pids_limit is not None:
        if isinstance(pids_limit, bool) or not isinstance(pids_limit, int) or pids_limit <= 0:
            raise ValueError(f"pids_limit must be a positive int, got {pids_limit!r}")
        run["pids_limit"] = pids_limit
    if not isinstance(options.get("network_disabled", False), bool):
        raise TypeError("network_disabled must be a bool")
    command = options.get("command")
    if command is not None:
        if isinstance(command, str) or not all(isinstance(part, str) for part in command):
            raise TypeError("command must be a list of strings (argv), not a shell string")
        run["command"] = list(command)
    return run


class _LogTail:
    """Follows a container's output on a daemon thread and keeps its last lines.

    The container removes itself when it exits (``auto_remove``), after which its logs cannot be
    asked for: following them from the start is the only way to report why it died.
    """

    def __init__(self, container: Any, max_lines: int = _LOG_LINES) -> None:
        self._lines: Deque[str] = collections.deque(maxlen=max_lines)
        self._partial = ""
        self._lock = threading.Lock()
        self._stream: Any = None
        self._thread = threading.Thread(target=self._follow, args=(container,), name="openenv-docker-logs", daemon=True)
        self._thread.start()

    def _follow(self, container: Any) -> None:
        try:
            self._stream = container.logs(stream=True, follow=True, stdout=True, stderr=True)
            for chunk in self._stream:
                text = chunk.decode("utf-8", "replace") if isinstance(chunk, bytes) else str(chunk)
                with self._lock:
                    *lines, self._partial = (self._partial + text).split("\n")
                    self._lines.extend(line.rstrip("\r") for line in lines)
        except Exception as exc:  # the container is gone, or the stream was closed by stop()
            logger.debug("log stream ended: %s", type(exc).__name__)
        with self._lock:
            if self._partial:
                self._lines.append(self._partial)
                self._partial = ""

    def lines(self, wait_s: float = 0.0) -> List[str]:
        """The last lines so far; ``wait_s`` gives a finished container's stream time to drain."""
        if wait_s:
            self._thread.join(wait_s)
        with self._lock:
            return list(self._lines) + ([self._partial] if self._partial else [])

    def close(self) -> None:
        stream = self._stream
        if stream is not None and hasattr(stream, "close"):
            try:
                stream.close()
            except Exception:
                pass


def _stop_and_remove(client: Any, container_id: str, timeout_s: float) -> None:
    """Stop a container (SIGTERM, then SIGKILL after ``timeout_s``) and remove it; gone is fine."""
    errors = _import_docker().errors
    try:
        container = client.containers.get(container_id)
    except errors.NotFound:
        return
    try:
        container.stop(timeout=max(0, int(timeout_s)))
    except errors.NotFound:
        return
    try:
        container.remove(force=True)
    except errors.NotFound:
        pass
    except errors.APIError as exc:
        if exc.status_code != 409:  # 409: auto_remove is already removing it
            raise


def _stop_at_exit(client: Any, container_id: str, timeout_s: float, log_tail: _LogTail) -> None:
    try:
        _stop_and_remove(client, container_id, timeout_s)
    except Exception as exc:
        logger.warning(
            "could not stop container %s (%s); remove leftovers with: docker rm -f $(docker ps -aq --filter label=%s=1)",
            container_id[:12],
            type(exc).__name__,
            MANAGED_LABEL,
        )
    finally:
        log_tail.close()


class LocalDockerProvider(ContainerProvider):
    """Runs one environment container at a time on the local Docker engine.

    ``client`` is a ``docker.DockerClient`` to use (the caller keeps ownership); by default one is
    made from the environment (``DOCKER_HOST``, the current Docker context) on first use, and a
    ``RuntimeError`` says so when no engine answers. ``stop_timeout_s`` is the grace period
    between SIGTERM and SIGKILL when stopping.
    """

    def __init__(self, *, client: Any = None, stop_timeout_s: float = 5.0, name_prefix: str = "openenv") -> None:
        self._docker = _import_docker()
        self._client = client
        self._owns_client = client is None
        self._stop_timeout_s = stop_timeout_s
        self._name_prefix = name_prefix
        self._container: Any = None
        self._secrets: Tuple[str, ...] = ()
        self._log_tail: Optional[_LogTail] = None
        self._finalizer: Optional[weakref.finalize] = None

    # -- the SDK client -------------------------------------------------------------------------

    @property
    def client(self) -> Any:
        """The SDK client, made on first use; ``RuntimeError`` when no Docker engine answers."""
        if self._client is None:
            try:
                self._client = self._docker.from_env()
            except self._docker.errors.DockerException as exc:
                raise RuntimeError(
                    f"no Docker engine reachable at {_docker_host()} ({_redact(str(exc), ())}): start Docker, "
                    "or point DOCKER_HOST at a running engine; SandboxProvider runs environments without Docker"
                ) from None
        return self._client

    # -- the ContainerProvider interface ------------------------------------------------------

    def start_container(
        self,
        image: str,
        port: Optional[int] = None,
        env_vars: Optional[Dict[str, str]] = None,
        **kwargs: Any,
    ) -> str:
        """Start ``image`` detached and return the server's base URL.

        The container's port 8000 is published on ``127.0.0.1:<port>`` (a port Docker picks when
        ``port`` is None). ``env_vars`` reach the container's environment and no error text.
        Options: ``mem_limit`` (bytes or ``"2g"``), ``cpus`` (float) or ``nano_cpus``,
        ``pids_limit``, ``command`` (argv replacing the image's CMD) and ``network_disabled``:
        the container joins the internal network ``openenv-isolated`` (no route out) and the URL
        is its address there, reachable from a Linux host but not from Docker Desktop's. Unknown
        options raise ``TypeError``; a provider runs one container at a time (``RuntimeError``).
        """
        if not isinstance(image, str) or not image:
            raise ValueError("image must be a non-empty image reference")
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
            raise ValueError(f"port must be an int from 1 to 65535, or None for a free port; got {port!r}")
        run_options = _check_options(kwargs)
        network_disabled = kwargs.get("network_disabled", False)
        if network_disabled and port is not None:
            raise ValueError("network_disabled=True publishes no host port: leave port=None")
        environment = _check_env_vars(env_vars)
        if self._container is not None:
            raise RuntimeError(
                f"this provider already runs container {self._container.name}: stop_container() first, "
                "or use one provider per container"
            )

        secrets = tuple(environment.values())
        name = _container_name(self._name_prefix, image)
        client = self.client
        errors = self._docker.errors
        run_options.update(
            detach=True,
            auto_remove=True,
            name=name,
            environment=environment,
            labels={MANAGED_LABEL: "1", "openenv.image": image, "openenv.client-pid": str(os.getpid())},
        )
        if network_disabled:
            run_options["network"] = self._isolated_network()
        else:
            run_options["ports"] = {f"{CONTAINER_PORT}/tcp": ("127.0.0.1", port)}
        try:
            container = client.containers.run(image, **run_options)
        except errors.ImageNotFound as exc:
            self._remove_quietly(name)
            raise RuntimeError(
                f"image {image!r} not found locally or in its registry ({_redact(exc.explanation or str(exc), secrets)}): "
                "build it (openenv build, docker build) or check the name"
            ) from None
        except (errors.DockerException, OSError) as exc:  # OSError: requests' connection errors
            self._remove_quietly(name)  # created but not started (a port in use, say): auto_remove never fires
            raise RuntimeError(f"could not start a container from {image!r}: {_redact(str(exc), secrets)}") from None

        log_tail = _LogTail(container)
        self._container, self._secrets, self._log_tail = container, secrets, log_tail
        self._finalizer = weakref.finalize(self, _stop_at_exit, client, container.id, self._stop_timeout_s, log_tail)
        try:
            base_url = self._base_url(container, network_disabled)
        except BaseException:
            self.stop_container()
            raise
        logger.info("started container %s from %s at %s", name, image, base_url)
        return base_url

    def wait_for_ready(self, base_url: str, timeout_s: float = 30.0) -> None:
        """Poll ``GET <base_url>/health`` until it answers 200.

        Raises ``RuntimeError`` (with the container's last log lines) as soon as this provider's
        container has exited, and ``TimeoutError`` after ``timeout_s``.
        """
        import httpx

        deadline = time.monotonic() + timeout_s
        url = base_url.rstrip("/") + "/health"
        interval = 0.1
        last = "no answer yet"
        with httpx.Client(trust_env=False) as http:  # loopback / container addresses: no proxies
            while True:
                remaining = deadline - time.monotonic()
                try:
                    response = http.get(url, timeout=max(0.05, min(2.0, remaining)))
                    if response.status_code == 200:
                        return
                    last = f"HTTP {response.status_code}"
                except httpx.HTTPError as exc:
                    last = type(exc).__name__
                exited = self._exit_status()
                if exited is not None:
                    raise RuntimeError(self._describe_exit(exited))
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"environment server at {base_url} did not answer GET /health with 200 within "
                        f"{timeout_s:g} s (last: {last}){self._recent_logs()}"
                    )
                time.sleep(min(interval, remaining))
                interval = min(interval * 1.5, 0.5)

    def stop_container(self) -> None:
        """Stop the container (SIGTERM, SIGKILL after ``stop_timeout_s``) and remove it.

        Does nothing when no container runs; a container already gone is fine.
        """
        container, finalizer, log_tail = self._container, self._finalizer, self._log_tail
        self._container = self._finalizer = self._log_tail = None
        if container is None:
            return
        if finalizer is not None:
            finalizer.detach()
        try:
            _stop_and_remove(self.client, container.id, self._stop_timeout_s)
        except self._docker.errors.DockerException as exc:
            raise RuntimeError(
                f"could not stop container {container.name}: {_redact(str(exc), self._secrets)}; "
                f"remove it with: docker rm -f {container.name}"
            ) from None
        finally:
            if log_tail is not None:
                log_tail.close()
            self._secrets = ()
        logger.info("stopped container %s", container.name)

    def close(self) -> None:
        """Stop the container if one still runs, then release the SDK client (if this provider made it)."""
        try:
            self.stop_container()
        finally:
            if self._client is not None and self._owns_client:
                self._client.close()
                self._client = None

    # -- helpers ------------------------------------------------------------------------------

    @property
    def container_name(self) -> Optional[str]:
        """The name of the running container, or None."""
        return None if self._container is None else self._container.name

    def _remove_quietly(self, name: str) -> None:
        try:
            self.client.containers.get(name).remove(force=True)
        except Exception:
            pass

    def _isolated_network(self) -> str:
        networks = self.client.networks
        if not any(net.name == ISOLATED_NETWORK for net in networks.list(names=[ISOLATED_NETWORK])):
            try:
                networks.create(ISOLATED_NETWORK, driver="bridge", internal=True, labels={MANAGED_LABEL: "1"})
            except self._docker.errors.APIError as exc:
                if exc.status_code != 409:  # 409: another process created it meanwhile
                    raise RuntimeError(f"could not create the network {ISOLATED_NETWORK}: {exc}") from None
        return ISOLATED_NETWORK

    def _base_url(self, container: Any, network_disabled: bool) -> str:
        errors = self._docker.errors
        try:
            container.reload()
        except errors.NotFound:
            raise RuntimeError(self._describe_exit(None)) from None
        settings = container.attrs.get("NetworkSettings") or {}
        if network_disabled:
            address = ((settings.get("Networks") or {}).get(ISOLATED_NETWORK) or {}).get("IPAddress")
            if not address:
                raise RuntimeError(f"container {container.name} has no address on {ISOLATED_NETWORK}")
            return f"http://{address}:{CONTAINER_PORT}"
        bindings: Sequence[Mapping[str, str]] = (settings.get("Ports") or {}).get(f"{CONTAINER_PORT}/tcp") or []
        for binding in bindings:
            if binding.get("HostIp") in ("127.0.0.1", "") and binding.get("HostPort"):
                return f"http://127.0.0.1:{int(binding['HostPort'])}"
        if container.status in ("exited", "dead"):
            raise RuntimeError(self._describe_exit(container.attrs.get("State", {}).get("ExitCode")))
        raise RuntimeError(f"Docker published no host port for port {CONTAINER_PORT} of container {container.name}")

    def _exit_status(self) -> Optional[Any]:
        """None while the container runs; its exit code (or ``"removed"``) once it has exited."""
        container = self._container
        if container is None:
            return None
        try:
            container.reload()
        except self._docker.errors.NotFound:
            return "removed"
        except self._docker.errors.DockerException:
            return None
        if container.status in ("exited", "dead"):
            return container.attrs.get("State", {}).get("ExitCode", "unknown")
        return None

    def _describe_exit(self, exit_code: Any) -> str:
        name = self._container.name if self._container is not None else "the container"
        code = "" if exit_code in (None, "removed") else f" with code {exit_code}"
        return f"container {name} exited{code} before its server became ready{self._recent_logs(wait_s=1.0)}"

    def _recent_logs(self, wait_s: float = 0.0) -> str:
        if self._log_tail is None:
            return ""
        lines = self._log_tail.lines(wait_s)
        if not lines:
            return "; it wrote no output"
        return _redact("; its last output:\n" + "\n".join(lines[-20:]), self._secrets)
