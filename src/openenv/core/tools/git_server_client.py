"""A client for the git server (Gitea) that an environment clones its task repositories from.

Upstream OpenEnv's ``git_env`` keeps task repositories on a shared Gitea server; each environment
instance clones them into a workspace of its own and resets that clone between episodes with git
(no re-clone, no server restart). :class:`GitServerClient` is that client, with upstream's names,
signatures and return values::

    client = GitServerClient("http://gitea:3000", "agent", password, workspace_dir="/workspace")
    if not client.wait_for_ready():
        raise RuntimeError("no git server")
    path = client.clone_to_workspace("my-repo", commit="abc123")    # /workspace/my-repo
    code, out, err = client.execute_git_command("log --oneline", working_dir="my-repo")
    client.reset_workspace("my-repo", commit="abc123")               # back to the task's start

What it needs of the server: ``GET /`` answers once it is up, ``GET /api/v1/user/repos`` lists the
user's repositories (Gitea's API, HTTP basic authentication), and ``/<user>/<repo>.git`` speaks
git's smart HTTP protocol. Git runs as a subprocess (2.32 or newer).

Unlike upstream's client, this one never writes the user's ``~/.gitconfig`` or
``~/.git-credentials``: every git it runs gets a private configuration through the environment
(the user's and the system's git configuration are not read, so none of their credential helpers
sees, or stores, the password), and the password reaches git only through a credential helper
scoped to the server's address. Paths are confined to the workspace, commands are split like a
shell would split them (quotes work) but no shell runs them, and ``reset_workspace`` returns to the
server's commit even after local commits or a half-done merge.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple
from urllib.parse import urlparse

__all__ = ["GitServerClient", "RepoInfo"]

DEFAULT_TIMEOUT_S = 600.0
"""How long one git command may run before it is killed (a clone of a large repository included)."""

_PAGE_SIZE = 50  # Gitea's default cap on items per API page
_MAX_PAGES = 1000
_TIMEOUT_EXIT_CODE = 124  # what coreutils' `timeout` returns, for a command that ran too long

# The credential helper git runs for the server's URL: it answers git's "get" with the name and
# password it finds in its environment, and ignores "store" and "erase" (nothing is written).
_CREDENTIAL_HELPER = (
    '!f() { if [ "$1" = get ]; then '
    'printf \'username=%s\\npassword=%s\\n\' "$OPENENV_GIT_SERVER_USERNAME" "$OPENENV_GIT_SERVER_PASSWORD"; '
    "fi; }; f"
)


@dataclass
class RepoInfo:
    """A repository on the git server: its name, web URL, a commit and the URL to clone it from."""

    name: str
    url: str
    commit: str
    clone_url: str


class GitServerClient:
    """Clones repositories from a Gitea server into a local workspace and runs git there.

    ``gitea_url`` is the server's base URL (``http://host:3000``); ``username`` and ``password``
    authenticate both the API and git; ``workspace_dir`` (created if missing) holds the clones.
    ``timeout_s`` bounds each git command. Attributes as upstream's: ``gitea_url`` (without a
    trailing slash), ``username``, ``password``, ``workspace_dir`` (a Path), ``is_ready`` (set by
    :meth:`wait_for_ready`), ``domain`` and ``port`` (the server's host and port, 3000 when the URL
    names none).
    """

    def __init__(
        self,
        gitea_url: str,
        username: str,
        password: str,
        workspace_dir: str = "/workspace",
        *,
        timeout_s: Optional[float] = DEFAULT_TIMEOUT_S,
    ) -> None:
        if not isinstance(gitea_url, str):  # os.getenv("GITEA_URL") of an unset variable, usually
            raise ValueError(f"gitea_url must be the server's URL, such as http://gitea:3000, got {gitea_url!r}")
        parsed = urlparse(gitea_url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"gitea_url must be an http(s) URL such as http://gitea:3000, got {gitea_url!r}")
        for label, value in (("username", username), ("password", password)):
            if not isinstance(value, str):
                raise ValueError(f"{label} must be a string, got {type(value).__name__} (is its variable set?)")
            if any(c in value for c in "\n\r\0"):  # they would break git's credential protocol
                raise ValueError(f"{label} must not contain line breaks or NUL characters")
        if not username:
            raise ValueError("username must not be empty: the server's repositories are found under it")
        self.gitea_url = gitea_url.rstrip("/")
        self.username = username
        self.password = password
        self.workspace_dir = Path(workspace_dir)
        self.is_ready = False
        self.domain = parsed.hostname or "localhost"
        self.port = parsed.port or 3000
        self.timeout_s = timeout_s
        os.makedirs(self.workspace_dir, exist_ok=True)
        # Credentials are looked up by scheme, host and port only (git leaves the path out unless
        # credential.useHttpPath is set), so the helper is scoped to exactly that.
        self._origin = f"{parsed.scheme}://{parsed.netloc.rpartition('@')[2]}"
        self._git_env = self._private_git_environment()

    # --- the server ------------------------------------------------------------------------------

    def wait_for_ready(self, timeout: int = 30) -> bool:
        """Poll ``GET <gitea_url>/`` until it answers (any status below 400) or ``timeout`` seconds
        pass. Returns whether it answered, and sets ``is_ready`` when it did."""
        import httpx

        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                response = httpx.get(f"{self.gitea_url}/", timeout=max(0.1, min(5.0, remaining)))
                if response.status_code < 400:
                    self.is_ready = True
                    return True
            except httpx.HTTPError:
                pass  # not up yet: try again until the deadline
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(1.0, remaining))

    def list_repositories(self) -> List[Dict[str, str]]:
        """The repositories the user can see, each as ``{"name", "full_name", "clone_url",
        "description"}`` (every page of Gitea's ``/api/v1/user/repos``).

        Raises RuntimeError when the server is not ready, cannot be reached, refuses the
        credentials or answers something that is not a list of repositories.
        """
        import httpx

        self._require_ready()
        url = f"{self.gitea_url}/api/v1/user/repos"
        repos: List[Dict[str, str]] = []
        seen: set = set()
        with httpx.Client(auth=(self.username, self.password), timeout=30.0) as http:
            for page in range(1, _MAX_PAGES + 1):
                try:
                    response = http.get(url, params={"page": page, "limit": _PAGE_SIZE})
                except httpx.HTTPError as exc:
                    raise RuntimeError(f"cannot list repositories: no answer from {url} ({exc})") from exc
                if response.status_code in (401, 403):
                    raise RuntimeError(
                        f"the git server at {self.gitea_url} refused the credentials of {self.username!r} "
                        f"(HTTP {response.status_code}): check the username and password"
                    )
                if response.status_code != 200:
                    raise RuntimeError(f"cannot list repositories: {url} answered HTTP {response.status_code}")
                try:
                    items = response.json()
                    batch = [
                        {
                            "name": item["name"],
                            "full_name": item["full_name"],
                            "clone_url": item["clone_url"],
                            "description": item.get("description") or "",
                        }
                        for item in items
                    ]
                except (ValueError, TypeError, KeyError) as exc:
                    raise RuntimeError(
                        f"cannot list repositories: {url} did not answer with Gitea's list of repositories ({exc!r})"
                    ) from exc
                # A server that ignores paging answers every page with the same list: stop there.
                fresh = [repo for repo in batch if repo["full_name"] not in seen]
                if not fresh:
                    break
                seen.update(repo["full_name"] for repo in fresh)
                repos.extend(fresh)
        return repos

    # --- the workspace ---------------------------------------------------------------------------

    def clone_to_workspace(self, repo_name: str, target_dir: Optional[str] = None, commit: str = "main") -> str:
        """Clone ``<gitea_url>/<username>/<repo_name>.git`` into ``workspace_dir/<target_dir>``
        (default: ``repo_name``), replacing whatever is there, and check out ``commit`` (a commit id,
        branch or tag; ``"main"`` keeps what the clone checked out). Returns the clone's path.

        Raises RuntimeError ("Clone failed: ..." / "Checkout failed: ...") when git fails or the
        server is not ready, ValueError for a name that leaves the workspace.
        """
        self._require_ready()
        _check_name("repo_name", repo_name)
        _check_revision(commit)
        target = self._path_in_workspace(target_dir if target_dir is not None else repo_name, "target_dir")
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.exists():
            shutil.rmtree(target)
        clone_url = f"{self.gitea_url}/{self.username}/{repo_name}.git"
        target.parent.mkdir(parents=True, exist_ok=True)
        done = self._git(["clone", "--quiet", "--", clone_url, str(target)], cwd=self.workspace_dir)
        if done.returncode != 0:
            raise RuntimeError(
                f"Clone failed: git clone {clone_url} exited with {done.returncode}: {done.stderr.strip()}"
            )
        if commit != "main":
            # "--" makes `commit` a revision even where a file has its name; a remote branch's
            # name still gets a local branch that tracks it, as without "--".
            done = self._git(["checkout", "--quiet", commit, "--"], cwd=target)
            if done.returncode != 0:
                raise RuntimeError(f"Checkout failed: git checkout {commit} in {target}: {done.stderr.strip()}")
        return str(target)

    def reset_workspace(self, repo_name: str, commit: str = "main") -> bool:
        """Bring the clone ``workspace_dir/<repo_name>`` back to ``commit`` as the server has it:
        fetch, check out ``commit`` (a branch is reset to the server's tip of it; a commit id or
        tag is checked out detached), discard every local change, commit, merge in progress and
        untracked or ignored file. Returns True.

        Raises RuntimeError when the clone is missing or ``commit`` cannot be found (the fetch's
        error is quoted: the server may be down).
        """
        _check_revision(commit)
        path = self._path_in_workspace(repo_name, "repo_name")
        if not (path / ".git").exists():
            raise RuntimeError(
                f"Repository not found in workspace: {repo_name} ({path} is not a clone; call clone_to_workspace first)"
            )
        fetched = self._git(["fetch", "--all", "--prune", "--quiet"], cwd=path)
        remote_branch = f"refs/remotes/origin/{commit}"
        if self._resolves(path, remote_branch):
            # -B puts the local branch at the server's tip, whatever was committed on it here.
            args = ["checkout", "--quiet", "--force", "-B", commit, remote_branch, "--"]
        elif self._resolves(path, commit):
            args = ["checkout", "--quiet", "--force", commit, "--"]
        else:
            reason = f"; the fetch failed: {fetched.stderr.strip()}" if fetched.returncode != 0 else ""
            raise RuntimeError(
                f"Checkout failed: {commit!r} is neither a branch on the server nor a commit in {path}{reason}"
            )
        # --force discards local changes and ends a merge or cherry-pick in progress as well.
        done = self._git(args, cwd=path)
        if done.returncode != 0:
            raise RuntimeError(f"Reset failed: git {' '.join(args)} in {path}: {done.stderr.strip()}")
        done = self._git(["clean", "-ffdxq"], cwd=path)
        if done.returncode != 0:
            raise RuntimeError(f"Reset failed: git clean in {path}: {done.stderr.strip()}")
        return True

    def execute_git_command(self, command: str, working_dir: str = "") -> Tuple[int, str, str]:
        """Run one git command (``command`` without the leading ``git``: ``commit -m "fix it"``) in
        ``workspace_dir/<working_dir>``. Its words are split as a shell would split them, but no
        shell runs it (no pipes, redirections or ``;``).

        Returns ``(exit_code, stdout, stderr)``; never raises for a failing command. A missing or
        outside working directory, or a command that cannot be split, gives exit code 1 and the
        reason in stderr; a command killed after ``timeout_s`` gives 124.
        """
        try:
            work = self._path_in_workspace(working_dir, "working_dir", allow_root=True)
        except ValueError as exc:
            return (1, "", str(exc))
        if not work.is_dir():
            return (1, "", f"Working directory does not exist: {work} (clone the repository first)")
        try:
            args = shlex.split(command)
        except ValueError as exc:
            return (1, "", f"cannot split the git command {command!r}: {exc}")
        if args[:1] == ["git"]:
            args = args[1:]
        if not args:
            return (1, "", "no git command given: pass one such as 'status' or 'log --oneline'")
        try:
            done = self._git(args, cwd=work)
        except _GitTimeout as exc:
            return (_TIMEOUT_EXIT_CODE, "", str(exc))
        return (done.returncode, done.stdout, done.stderr)

    def get_current_commit(self, repo_name: str) -> str:
        """The commit id checked out in the clone ``workspace_dir/<repo_name>``.

        Raises RuntimeError when there is no such clone or it has no commit yet.
        """
        path = self._path_in_workspace(repo_name, "repo_name")
        if not path.exists():
            raise RuntimeError(f"Repository not found: {repo_name} (no {path}; call clone_to_workspace first)")
        done = self._git(["rev-parse", "HEAD"], cwd=path)
        if done.returncode != 0:
            raise RuntimeError(f"Failed to get commit: git rev-parse HEAD in {path}: {done.stderr.strip()}")
        return done.stdout.strip()

    def workspace_exists(self, repo_name: str) -> bool:
        """Whether ``workspace_dir/<repo_name>`` exists (a clone made earlier, usually)."""
        return self._path_in_workspace(repo_name, "repo_name").exists()

    # --- helpers ---------------------------------------------------------------------------------

    def _require_ready(self) -> None:
        if not self.is_ready:
            raise RuntimeError(
                f"Gitea server is not ready: call wait_for_ready() first (no answer from {self.gitea_url}/ yet)"
            )

    def _path_in_workspace(self, relative: str, label: str, *, allow_root: bool = False) -> Path:
        """``workspace_dir/<relative>``, refused (ValueError) when it resolves outside the workspace."""
        if not isinstance(relative, str) or "\0" in relative:
            raise ValueError(f"{label} must be a path relative to the workspace, got {relative!r}")
        root = self.workspace_dir.resolve()
        path = self.workspace_dir / relative
        resolved = path.resolve()
        if resolved != root and root not in resolved.parents:
            raise ValueError(f"{label} {relative!r} is outside the workspace {self.workspace_dir}")
        if resolved == root and not allow_root:
            raise ValueError(f"{label} must name a directory inside the workspace, not the workspace itself")
        return path

    def _resolves(self, path: Path, revision: str) -> bool:
        done = self._git(["rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"], cwd=path)
        return done.returncode == 0

    def _private_git_environment(self) -> Dict[str, str]:
        config = {
            "user.name": self.username,
            "user.email": f"{self.username}@local.env",
            "init.defaultBranch": "main",
            f"credential.{self._origin}.helper": _CREDENTIAL_HELPER,
        }
        env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_CONFIG")}
        env.update(
            {
                # Neither the user's (~/.gitconfig, ~/.config/git/config) nor the system's config.
                "GIT_CONFIG_GLOBAL": os.devnull,
                "GIT_CONFIG_NOSYSTEM": "1",
                "GIT_CONFIG_COUNT": str(len(config)),
                # Nothing waits for a person: no password prompt, no editor, no pager.
                "GIT_TERMINAL_PROMPT": "0",
                "GIT_ASKPASS": "",
                "SSH_ASKPASS": "",
                "GIT_EDITOR": "true",
                "GIT_PAGER": "cat",
                "OPENENV_GIT_SERVER_USERNAME": self.username,
                "OPENENV_GIT_SERVER_PASSWORD": self.password,
            }
        )
        for index, (key, value) in enumerate(config.items()):
            env[f"GIT_CONFIG_KEY_{index}"] = key
            env[f"GIT_CONFIG_VALUE_{index}"] = value
        return env

    def _git(self, args: Sequence[str], cwd: Path) -> subprocess.CompletedProcess:
        """Run ``git <args>`` in ``cwd`` with the private configuration; RuntimeError when git is
        missing or runs past ``timeout_s``."""
        try:
            return subprocess.run(
                ["git", *args],
                cwd=str(cwd),
                env=self._git_env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                encoding="utf-8",
                errors="replace",
                timeout=self.timeout_s,
            )
        except FileNotFoundError as exc:
            raise RuntimeError("git is not installed (on Debian: apt-get install git)") from exc
        except subprocess.TimeoutExpired as exc:
            raise _GitTimeout(f"git {' '.join(args)} ran past {self.timeout_s} s and was killed") from exc


class _GitTimeout(RuntimeError):
    """A git command ran past the client's ``timeout_s``."""


def _check_name(label: str, name: str) -> None:
    if not isinstance(name, str) or not name or name in (".", "..") or name.startswith("-"):
        raise ValueError(f"{label} must be a repository name such as 'my-repo', got {name!r}")
    if any(c in name for c in "/\\\0") or any(c.isspace() for c in name):
        raise ValueError(f"{label} must be a repository name without slashes or spaces, got {name!r}")


def _check_revision(commit: str) -> None:
    if not isinstance(commit, str) or not commit or commit.startswith("-") or "\0" in commit:
        raise ValueError(f"commit must be a commit id, branch or tag, got {commit!r}")
