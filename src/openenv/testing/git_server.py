"""A local stand-in for the Gitea server that :class:`~openenv.core.tools.git_server_client.GitServerClient`
talks to, for tests where Gitea itself cannot run.

It serves what the client uses of Gitea, for real, on 127.0.0.1: ``GET /`` (the readiness probe),
``GET /api/v1/user/repos`` (the repositories of the authenticated user, Gitea's JSON fields and
``page``/``limit`` paging) and git's smart HTTP protocol at ``/<owner>/<repo>.git`` (clone, fetch,
push), answered by git's own ``git http-backend``. Every request but ``GET /`` needs HTTP basic
authentication, and a user reaches only their own repositories (another's answer 404, as Gitea's
private repositories do)::

    with LocalGitServer({"agent": "secret"}) as server:
        first = server.create_repo("agent", "demo", {"README.md": "hello\\n"})
        client = GitServerClient(server.url, "agent", "secret", workspace_dir=str(tmp_path))
        client.wait_for_ready()
        client.clone_to_workspace("demo")

Repositories are bare repositories under ``root/<owner>/<repo>.git`` (a temporary directory unless
``root`` is given); :meth:`create_repo` and :meth:`commit` write commits into them directly.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple
from urllib.parse import parse_qs, urlsplit

__all__ = ["LocalGitServer"]

_REPO_PATH = re.compile(r"^/(?P<owner>[A-Za-z0-9_.-]+)/(?P<repo>[A-Za-z0-9_.-]+)\.git(?P<rest>/.*)?$")
_DEFAULT_DESCRIPTION = "Unnamed repository"  # what `git init` writes into a repository's description
_MAX_BODY = 64 * 1024 * 1024  # a push to a test repository is far smaller
_GIT_ENV = {
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "Test Server",
    "GIT_AUTHOR_EMAIL": "server@local.env",
    "GIT_COMMITTER_NAME": "Test Server",
    "GIT_COMMITTER_EMAIL": "server@local.env",
    "GIT_TERMINAL_PROMPT": "0",
}


class LocalGitServer:
    """A Gitea stand-in on 127.0.0.1 (a context manager; ``url`` is ready on entry).

    ``users`` maps user names to passwords. ``requests`` records ``(method, path, user)`` of every
    request served (``user`` is None when it carried no valid credentials), for tests that check
    what a client sent.
    """

    def __init__(self, users: Mapping[str, str], root: Optional[str] = None) -> None:
        if shutil.which("git") is None:
            raise RuntimeError("LocalGitServer needs git (on Debian: apt-get install git)")
        backend = subprocess.run(["git", "--exec-path"], capture_output=True, text=True, check=True).stdout.strip()
        self._backend = os.path.join(backend, "git-http-backend")
        if not os.access(self._backend, os.X_OK):
            raise RuntimeError(f"git's http-backend is missing ({self._backend}): install git's full package")
        self.users = dict(users)
        self._tmp: Optional[tempfile.TemporaryDirectory] = None
        if root is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="openenv-git-server-")
            root = self._tmp.name
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.requests: List[Tuple[str, str, Optional[str]]] = []
        self._httpd: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    @property
    def url(self) -> str:
        """The server's base URL, ``http://127.0.0.1:<port>``."""
        if self._httpd is None:
            raise RuntimeError("the server is not running: use it as a context manager")
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __enter__(self) -> LocalGitServer:
        server = self

        class Handler(_Handler):
            owner = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="openenv-git-server", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._tmp is not None:
            self._tmp.cleanup()

    # --- repositories ----------------------------------------------------------------------------

    def repo_path(self, owner: str, name: str) -> Path:
        """The bare repository of ``owner/name`` on disk."""
        return self.root / owner / f"{name}.git"

    def create_repo(
        self, owner: str, name: str, files: Mapping[str, str], *, description: str = "", branch: str = "main"
    ) -> str:
        """A new repository ``owner/name`` whose first commit on ``branch`` holds ``files``
        (relative path -> text). Returns the commit id."""
        bare = self.repo_path(owner, name)
        if bare.exists():
            raise FileExistsError(f"repository {owner}/{name} exists already at {bare}")
        bare.parent.mkdir(parents=True, exist_ok=True)
        _git(["init", "--quiet", "--bare", f"--initial-branch={branch}", str(bare)], cwd=self.root)
        if description:
            (bare / "description").write_text(description + "\n")
        return self.commit(owner, name, files, message="Initial commit", branch=branch)

    def commit(
        self,
        owner: str,
        name: str,
        files: Mapping[str, str],
        *,
        message: str = "Update",
        branch: str = "main",
        parent: Optional[str] = None,
    ) -> str:
        """Write ``files`` over the tree of ``parent`` (default: the tip of ``branch``, when it
        exists) as a new commit, and point ``branch`` at it. Returns the commit id."""
        bare = self.repo_path(owner, name)
        env = {**os.environ, **_GIT_ENV, "GIT_DIR": str(bare)}
        with tempfile.TemporaryDirectory(prefix="openenv-git-commit-") as tmp:
            work = Path(tmp, "tree")
            work.mkdir()
            env["GIT_WORK_TREE"] = str(work)
            env["GIT_INDEX_FILE"] = os.path.join(tmp, "index")
            start = parent or _git(["rev-parse", "--verify", "--quiet", f"refs/heads/{branch}"], work, env, check=False)
            if start:
                _git(["read-tree", start], work, env)
            for path, text in files.items():
                target = work / path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
                _git(["update-index", "--add", "--", path], work, env)
            tree = _git(["write-tree"], work, env)
            commit = _git(["commit-tree", tree, "-m", message, *(["-p", start] if start else [])], work, env)
            _git(["update-ref", f"refs/heads/{branch}", commit], work, env)
        return commit

    def head(self, owner: str, name: str, branch: str = "main") -> str:
        """The commit id at the tip of ``branch`` on the server."""
        return _git(["rev-parse", f"refs/heads/{branch}"], self.repo_path(owner, name))

    def _repos_of(self, owner: str) -> List[Dict[str, object]]:
        directory = self.root / owner
        if not directory.is_dir():
            return []
        repos = []
        for index, bare in enumerate(sorted(directory.glob("*.git")), start=1):
            name = bare.name[: -len(".git")]
            description = (bare / "description").read_text().strip() if (bare / "description").exists() else ""
            if description.startswith(_DEFAULT_DESCRIPTION):
                description = ""
            repos.append(
                {
                    "id": index,
                    "name": name,
                    "full_name": f"{owner}/{name}",
                    "owner": {"login": owner},
                    "description": description,
                    "private": True,
                    "html_url": f"{self.url}/{owner}/{name}",
                    "clone_url": f"{self.url}/{owner}/{name}.git",
                    "default_branch": "main",
                }
            )
        return repos


class _Handler(BaseHTTPRequestHandler):
    owner: LocalGitServer
    protocol_version = "HTTP/1.1"  # keep-alive, as git's HTTP client expects of a server

    def log_message(self, format: str, *args: object) -> None:
        pass  # the tests read `requests`, not a log on stderr

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def _serve(self) -> None:
        parts = urlsplit(self.path)
        user = self._user()
        self.owner.requests.append((self.command, parts.path, user))
        if parts.path == "/" and self.command == "GET":
            self._answer(200, b"<html><body>Gitea stand-in</body></html>", "text/html; charset=utf-8")
            return
        if user is None:
            self._answer(
                401,
                b'{"message":"unauthorized"}',
                "application/json",
                {"WWW-Authenticate": 'Basic realm="Gitea"'},
            )
            return
        if parts.path == "/api/v1/user/repos" and self.command == "GET":
            self._list_repos(user, parse_qs(parts.query))
            return
        match = _REPO_PATH.match(parts.path)
        if match is None or match["owner"] != user or not self.owner.repo_path(user, match["repo"]).is_dir():
            self._answer(404, b"Not found\n", "text/plain")
            return
        self._git_http_backend(user, parts.path, parts.query)

    def _user(self) -> Optional[str]:
        header = self.headers.get("Authorization", "")
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            name, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        expected = self.owner.users.get(name)
        if expected is None or not hmac.compare_digest(expected.encode(), password.encode()):
            return None
        return name

    def _list_repos(self, user: str, query: Mapping[str, List[str]]) -> None:
        try:
            page = max(1, int(query.get("page", ["1"])[0]))
            limit = max(1, min(50, int(query.get("limit", ["30"])[0])))
        except ValueError:
            self._answer(422, b'{"message":"page and limit must be numbers"}', "application/json")
            return
        repos = self.owner._repos_of(user)
        chunk = repos[(page - 1) * limit : page * limit]
        self._answer(200, json.dumps(chunk).encode(), "application/json", {"X-Total-Count": str(len(repos))})

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return bytes(body)
                if len(body) + size > _MAX_BODY:
                    raise ValueError("request body too large")
                body += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        if length > _MAX_BODY:
            raise ValueError("request body too large")
        return self.rfile.read(length)

    def _git_http_backend(self, user: str, path: str, query: str) -> None:
        try:
            body = self._body() if self.command == "POST" else b""
        except ValueError as exc:
            self._answer(413, f"{exc}\n".encode(), "text/plain")
            self.close_connection = True
            return
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            **_GIT_ENV,
            "GIT_PROJECT_ROOT": str(self.owner.root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "REQUEST_METHOD": self.command,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_USER": user,  # git http-backend accepts pushes from an authenticated user only
            "REMOTE_ADDR": self.client_address[0],
        }
        for header in ("Content-Encoding", "Git-Protocol"):
            if header in self.headers:
                env["HTTP_" + header.upper().replace("-", "_")] = self.headers[header]
        done = subprocess.run([self.owner._backend], input=body, env=env, capture_output=True, timeout=120)
        # A CGI answer: header lines, a blank line, the body (git ends its lines with CRLF or LF).
        head, separator, payload = done.stdout.partition(b"\r\n\r\n")
        if not separator:
            head, _, payload = done.stdout.partition(b"\n\n")
        status, headers = 200, {}
        for line in head.decode("latin-1").splitlines():
            key, _, value = line.partition(":")
            if key.lower() == "status":
                status = int(value.split()[0])
            elif key:
                headers[key.strip()] = value.strip()
        if done.returncode != 0 and not payload:
            status, payload = 500, done.stderr or b"git http-backend failed\n"
        content_type = headers.pop("Content-Type", "application/octet-stream")
        self._answer(status, payload, content_type, headers)

    def _answer(self, status: int, body: bytes, content_type: str, headers: Optional[Mapping[str, str]] = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def _git(args: List[str], cwd: Path, env: Optional[Mapping[str, str]] = None, *, check: bool = True) -> str:
    done = subprocess.run(
        ["git", *args],
        cwd=str(cwd),
        env=dict(env) if env is not None else {**os.environ, **_GIT_ENV},
        capture_output=True,
        text=True,
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {cwd}: {done.stderr.strip()}")
    return done.stdout.strip()
