"""``openenv.core.tools.git_server_client``: upstream's client of the Gitea server its git
environment clones task repositories from.

Gitea itself does not run here. The server is :class:`openenv.testing.git_server.LocalGitServer`,
a stand-in that serves what the client uses of Gitea for real on 127.0.0.1: the readiness page,
``/api/v1/user/repos`` (basic authentication, paging) and git's smart HTTP protocol through git's
own ``git http-backend``. Git runs for real on both sides.
"""

from __future__ import annotations

import inspect
import os
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from openenv.core.tools.git_server_client import GitServerClient, RepoInfo
from openenv.testing.git_server import LocalGitServer

USER, PASSWORD = "agent", "correct horse"


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME of the test's own whose git config would store any password git is handed."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text("[credential]\n\thelper = store\n[user]\n\tname = Someone Else\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    return home


@pytest.fixture
def server() -> Iterator[LocalGitServer]:
    with LocalGitServer({USER: PASSWORD, "other": "other-password"}) as server:
        yield server


@pytest.fixture
def repo(server: LocalGitServer) -> dict:
    """``agent/demo``: two commits on main, one more on a branch ``feature``."""
    first = server.create_repo(USER, "demo", {"README.md": "hello\n", ".gitignore": "*.log\n"}, description="Demo")
    second = server.commit(USER, "demo", {"app.py": "print('v2')\n"}, message="v2")
    feature = server.commit(USER, "demo", {"feature.txt": "f\n"}, message="feature", branch="feature", parent=second)
    return {"first": first, "second": second, "feature": feature}


@pytest.fixture
def client(server: LocalGitServer, tmp_path: Path) -> GitServerClient:
    client = GitServerClient(server.url, USER, PASSWORD, workspace_dir=str(tmp_path / "workspace"))
    assert client.wait_for_ready(timeout=10)
    return client


def git(path: str, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=path, capture_output=True, text=True, check=True).stdout.strip()


# --- the API ---------------------------------------------------------------------------------------


def test_the_names_and_signatures_are_upstreams() -> None:
    from openenv.core import tools

    assert tools.GitServerClient is GitServerClient and tools.RepoInfo is RepoInfo
    params = inspect.signature(GitServerClient).parameters
    assert list(params)[:4] == ["gitea_url", "username", "password", "workspace_dir"]
    assert params["workspace_dir"].default == "/workspace"
    assert inspect.signature(GitServerClient.wait_for_ready).parameters["timeout"].default == 30
    assert inspect.signature(GitServerClient.clone_to_workspace).parameters["commit"].default == "main"
    assert inspect.signature(GitServerClient.execute_git_command).parameters["working_dir"].default == ""
    info = RepoInfo(name="demo", url="http://h/agent/demo", commit="abc", clone_url="http://h/agent/demo.git")
    assert (info.name, info.commit) == ("demo", "abc")


def test_the_url_gives_domain_and_port_and_the_workspace_is_made(tmp_path: Path) -> None:
    client = GitServerClient("http://gitea:3001/", USER, PASSWORD, workspace_dir=str(tmp_path / "w" / "s"))
    assert (client.gitea_url, client.domain, client.port) == ("http://gitea:3001", "gitea", 3001)
    assert GitServerClient("http://gitea", USER, PASSWORD, workspace_dir=str(tmp_path)).port == 3000
    assert (tmp_path / "w" / "s").is_dir() and client.is_ready is False


def test_a_url_that_is_not_http_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="http://gitea:3000"):
        GitServerClient("gitea:3000", USER, PASSWORD, workspace_dir=str(tmp_path))
    with pytest.raises(ValueError, match="got None"):  # an unset GITEA_URL
        GitServerClient(os.environ.get("NO_SUCH_VARIABLE"), USER, PASSWORD, workspace_dir=str(tmp_path))  # type: ignore[arg-type]


# --- readiness -------------------------------------------------------------------------------------


def test_wait_for_ready_sees_the_server_and_marks_the_client_ready(server: LocalGitServer, tmp_path: Path) -> None:
    client = GitServerClient(server.url, USER, PASSWORD, workspace_dir=str(tmp_path))
    assert client.wait_for_ready(timeout=10) is True
    assert client.is_ready is True


def test_wait_for_ready_gives_up_after_its_timeout(tmp_path: Path) -> None:
    with socket.socket() as unused:  # a port that nothing listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    client = GitServerClient(f"http://127.0.0.1:{port}", USER, PASSWORD, workspace_dir=str(tmp_path))
    start = time.monotonic()
    assert client.wait_for_ready(timeout=1) is False
    assert time.monotonic() - start < 5
    assert client.is_ready is False


def test_the_server_is_not_used_before_it_is_ready(server: LocalGitServer, tmp_path: Path) -> None:
    client = GitServerClient(server.url, USER, PASSWORD, workspace_dir=str(tmp_path))
    with pytest.raises(RuntimeError, match=r"not ready: call wait_for_ready\(\)"):
        client.list_repositories()
    with pytest.raises(RuntimeError, match="not ready"):
        client.clone_to_workspace("demo")


# --- listing ---------------------------------------------------------------------------------------


def test_list_repositories_gives_the_users_repositories(
    client: GitServerClient, server: LocalGitServer, repo: dict
) -> None:
    server.create_repo("other", "private", {"x": "x\n"})
    assert client.list_repositories() == [
        {"name": "demo", "full_name": "agent/demo", "clone_url": f"{server.url}/agent/demo.git", "description": "Demo"}
    ]


def test_list_repositories_reads_every_page(client: GitServerClient, server: LocalGitServer) -> None:
    names = [f"repo{i:02d}" for i in range(53)]  # Gitea answers at most 50 a page
    for name in names:
        server.create_repo(USER, name, {"f": name})
    assert [r["name"] for r in client.list_repositories()] == names
    pages = [path for method, path, _ in server.requests if path == "/api/v1/user/repos"]
    assert len(pages) == 3  # 50, 3, then an empty page ends it


def test_list_repositories_with_a_wrong_password_says_so(server: LocalGitServer, tmp_path: Path) -> None:
    client = GitServerClient(server.url, USER, "wrong", workspace_dir=str(tmp_path))
    assert client.wait_for_ready(timeout=10)
    with pytest.raises(RuntimeError, match=r"refused the credentials of 'agent' \(HTTP 401\)"):
        client.list_repositories()


# --- cloning ---------------------------------------------------------------------------------------


def test_clone_checks_out_the_servers_main(client: GitServerClient, repo: dict, tmp_path: Path) -> None:
    path = client.clone_to_workspace("demo")
    assert path == str(tmp_path / "workspace" / "demo")
    assert client.get_current_commit("demo") == repo["second"]
    assert Path(path, "app.py").read_text() == "print('v2')\n"
    assert git(path, "remote", "get-url", "origin") == f"{client.gitea_url}/agent/demo.git"


def test_clone_at_a_commit_id_or_a_branch(client: GitServerClient, repo: dict) -> None:
    old = client.clone_to_workspace("demo", target_dir="old", commit=repo["first"])
    assert git(old, "rev-parse", "HEAD") == repo["first"] and not Path(old, "app.py").exists()
    branch = client.clone_to_workspace("demo", target_dir="feat", commit="feature")
    assert git(branch, "rev-parse", "HEAD") == repo["feature"]
    assert git(branch, "rev-parse", "--abbrev-ref", "HEAD") == "feature"


def test_clone_replaces_what_the_target_held(client: GitServerClient, repo: dict, tmp_path: Path) -> None:
    stale = tmp_path / "workspace" / "demo"
    stale.mkdir(parents=True)
    (stale / "left-over.txt").write_text("old episode")
    client.clone_to_workspace("demo")
    assert not (stale / "left-over.txt").exists() and (stale / "README.md").exists()


def test_clone_of_a_missing_repository_fails_with_gits_reason(client: GitServerClient, repo: dict) -> None:
    with pytest.raises(RuntimeError, match=r"(?s)Clone failed: git clone .*/agent/nope\.git.*not found"):
        client.clone_to_workspace("nope")


def test_clone_with_a_wrong_password_fails_without_prompting(
    server: LocalGitServer, repo: dict, tmp_path: Path
) -> None:
    client = GitServerClient(server.url, USER, "wrong", workspace_dir=str(tmp_path / "workspace"), timeout_s=60)
    assert client.wait_for_ready(timeout=10)
    with pytest.raises(RuntimeError, match=r"Clone failed: .*Authentication failed"):
        client.clone_to_workspace("demo")


def test_a_checkout_of_an_unknown_commit_fails(client: GitServerClient, repo: dict) -> None:
    with pytest.raises(RuntimeError, match="Checkout failed: git checkout no-such-branch"):
        client.clone_to_workspace("demo", commit="no-such-branch")


def test_the_password_is_written_nowhere(client: GitServerClient, repo: dict, home: Path, tmp_path: Path) -> None:
    """Upstream writes ~/.gitconfig and ~/.git-credentials; here git gets a private config, so not
    even a credential helper of the user's own config (``store`` here) sees the password."""
    gitconfig = (home / ".gitconfig").read_text()
    path = client.clone_to_workspace("demo")
    client.execute_git_command("fetch", working_dir="demo")
    assert (home / ".gitconfig").read_text() == gitconfig
    assert not (home / ".git-credentials").exists()
    for file in Path(tmp_path).rglob("*"):
        if file.is_file():
            assert PASSWORD.encode() not in file.read_bytes(), file
    assert git(path, "config", "--get", "remote.origin.url") == f"{client.gitea_url}/agent/demo.git"


@pytest.mark.parametrize("target", ["../outside", "/tmp/elsewhere", ".."])
def test_a_target_outside_the_workspace_is_refused(client: GitServerClient, repo: dict, target: str) -> None:
    with pytest.raises(ValueError, match="outside the workspace"):
        client.clone_to_workspace("demo", target_dir=target)


@pytest.mark.parametrize("name", ["", "../demo", "a/b", "-u"])
def test_a_repository_name_that_is_no_name_is_refused(client: GitServerClient, name: str) -> None:
    with pytest.raises(ValueError, match="repo_name must be a repository name"):
        client.clone_to_workspace(name)


# --- git commands ----------------------------------------------------------------------------------


def test_a_commit_message_in_quotes_stays_one_argument(client: GitServerClient, repo: dict) -> None:
    path = client.clone_to_workspace("demo")
    Path(path, "new.txt").write_text("new\n")
    assert client.execute_git_command("add new.txt", working_dir="demo")[0] == 0
    code, _, err = client.execute_git_command('commit -m "fix the bug"', working_dir="demo")
    assert code == 0, err
    assert git(path, "log", "-1", "--format=%s|%an|%ae") == "fix the bug|agent|agent@local.env"


def test_a_leading_git_is_dropped_and_failures_are_returned(client: GitServerClient, repo: dict) -> None:
    client.clone_to_workspace("demo")
    code, out, _ = client.execute_git_command("git rev-parse HEAD", working_dir="demo")
    assert (code, out.strip()) == (0, repo["second"])
    code, _, err = client.execute_git_command("checkout no-such-branch", working_dir="demo")
    assert code != 0 and "no-such-branch" in err


@pytest.mark.parametrize(
    ("command", "working_dir", "reason"),
    [
        ("status", "missing", "Working directory does not exist"),
        ("status", "../..", "outside the workspace"),
        ('commit -m "unclosed', "", "cannot split"),
        ("", "", "no git command given"),
    ],
)
def test_a_command_that_cannot_run_gives_exit_code_1(
    client: GitServerClient, command: str, working_dir: str, reason: str
) -> None:
    code, out, err = client.execute_git_command(command, working_dir=working_dir)
    assert (code, out) == (1, "") and reason in err


def test_a_push_reaches_the_server_with_the_clients_credentials(
    client: GitServerClient, server: LocalGitServer, repo: dict
) -> None:
    path = client.clone_to_workspace("demo")
    Path(path, "pushed.txt").write_text("p\n")
    client.execute_git_command("add pushed.txt", working_dir="demo")
    client.execute_git_command("commit -m pushed", working_dir="demo")
    code, _, err = client.execute_git_command("push origin HEAD:refs/heads/work", working_dir="demo")
    assert code == 0, err
    assert server.head(USER, "demo", "work") == client.get_current_commit("demo")
    pushes = [user for method, path, user in server.requests if path.endswith("/git-receive-pack")]
    assert pushes and set(pushes) == {USER}


def test_a_command_past_the_timeout_is_killed(server: LocalGitServer, repo: dict, tmp_path: Path) -> None:
    stalled = socket.socket()  # accepts connections and never answers
    stalled.bind(("127.0.0.1", 0))
    stalled.listen()
    accepted: list = []
    threading.Thread(target=lambda: accepted.append(stalled.accept()), daemon=True).start()
    try:
        client = GitServerClient(server.url, USER, PASSWORD, workspace_dir=str(tmp_path / "ws"), timeout_s=1.5)
        start = time.monotonic()
        code, _, err = client.execute_git_command(f"ls-remote http://127.0.0.1:{stalled.getsockname()[1]}/x.git")
        assert code == 124 and "ran past 1.5 s" in err
        assert time.monotonic() - start < 10
    finally:
        stalled.close()
        for conn, _ in accepted:
            conn.close()


# --- resetting -------------------------------------------------------------------------------------


def test_reset_discards_every_local_change_and_commit(client: GitServerClient, repo: dict) -> None:
    path = Path(client.clone_to_workspace("demo"))
    (path / "README.md").write_text("edited\n")
    (path / "untracked.txt").write_text("u")
    (path / "debug.log").write_text("ignored")
    client.execute_git_command("commit -am local", working_dir="demo")
    (path / "app.py").write_text("changed again\n")
    assert client.reset_workspace("demo") is True
    assert client.get_current_commit("demo") == repo["second"]  # the local commit on main is gone
    assert git(str(path), "status", "--porcelain", "--ignored") == ""
    assert (path / "README.md").read_text() == "hello\n"


def test_reset_ends_a_merge_in_progress(client: GitServerClient, server: LocalGitServer, repo: dict) -> None:
    server.commit(USER, "demo", {"README.md": "theirs\n"}, message="theirs", branch="feature")
    path = Path(client.clone_to_workspace("demo"))
    (path / "README.md").write_text("ours\n")
    client.execute_git_command("commit -am ours", working_dir="demo")
    code, _, _ = client.execute_git_command("merge origin/feature", working_dir="demo")
    assert code != 0 and (path / ".git" / "MERGE_HEAD").exists()  # a conflict, left unresolved
    client.reset_workspace("demo", commit="feature")
    assert not (path / ".git" / "MERGE_HEAD").exists()
    assert client.get_current_commit("demo") == server.head(USER, "demo", "feature")
    assert git(str(path), "status", "--porcelain") == ""


def test_reset_fetches_what_the_server_got_since(client: GitServerClient, server: LocalGitServer, repo: dict) -> None:
    client.clone_to_workspace("demo")
    newer = server.commit(USER, "demo", {"late.txt": "late\n"}, message="late")
    client.reset_workspace("demo", commit="main")
    assert client.get_current_commit("demo") == newer


def test_reset_to_a_commit_id_detaches_there(client: GitServerClient, repo: dict) -> None:
    path = client.clone_to_workspace("demo")
    client.reset_workspace("demo", commit=repo["first"])
    assert client.get_current_commit("demo") == repo["first"]
    assert git(path, "rev-parse", "--abbrev-ref", "HEAD") == "HEAD"


def test_reset_of_an_unknown_commit_or_a_missing_clone_says_why(client: GitServerClient, repo: dict) -> None:
    with pytest.raises(RuntimeError, match=r"Repository not found in workspace: demo .*clone_to_workspace"):
        client.reset_workspace("demo")
    client.clone_to_workspace("demo")
    with pytest.raises(RuntimeError, match="'nope' is neither a branch on the server nor a commit"):
        client.reset_workspace("demo", commit="nope")


def test_workspace_exists_and_the_current_commit(client: GitServerClient, repo: dict) -> None:
    assert client.workspace_exists("demo") is False
    with pytest.raises(RuntimeError, match="Repository not found: demo"):
        client.get_current_commit("demo")
    client.clone_to_workspace("demo", commit=repo["first"])
    assert client.workspace_exists("demo") is True
    assert client.get_current_commit("demo") == repo["first"]
    with pytest.raises(ValueError, match="outside the workspace"):
        client.workspace_exists("../../etc")


def test_git_is_never_run_with_the_users_config(client: GitServerClient, repo: dict, home: Path) -> None:
    client.clone_to_workspace("demo")
    # ~/.gitconfig names the `store` helper and another identity: git sees neither
    code, out, _ = client.execute_git_command("config --get-all credential.helper", working_dir="demo")
    assert (code, out) == (1, "")
    code, out, _ = client.execute_git_command("config user.name", working_dir="demo")
    assert (code, out.strip()) == (0, USER)
    assert os.environ["HOME"] == str(home)
