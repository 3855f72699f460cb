"""``openenv push``: to a git remote end to end, and to a Hugging Face Space up to the network.

The git path is real from start to finish: a bare repository in tmp_path receives the pushes, a
clone of it is pip-installed into a throwaway virtual environment and served in a real sandbox.
The Hub cannot be reached from these tests: a recording fake ``HfApi`` takes the place of
``openenv.cli._publish.hf_api`` (the commands' one seam to the Hub) and the tests check what the
command would send: the staged folder, the repository id, the flags. Only the "not logged in"
test runs the real ``huggingface_hub``, which refuses before any request when there is no token.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
import yaml

import openenv
from openenv.cli import _common, _publish
from openenv.cli.__main__ import main
from openenv.core.containers.runtime import SandboxProvider
from openenv.core.containers.runtime.docker import dockerfile_template
from openenv.core.containers.runtime.isolation import find_bwrap

ROOT = Path(__file__).resolve().parents[2]
ECHO = ROOT / "envs" / "echo_env"
OPENENV = [sys.executable, "-m", "openenv.cli"]
GREETING = "Echo environment ready!"


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(autouse=True)
def _unwrapped_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_common.err, "soft_wrap", True)  # long paths stay on one line


def run(capsys: pytest.CaptureFixture, *args: str) -> tuple:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, flat(captured.err)


@pytest.fixture
def package(tmp_path: Path) -> Path:
    """A copy of the echo environment made complete for publishing, plus what must not be published."""
    dest = tmp_path / "echo_env"
    shutil.copytree(ECHO, dest, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__", "dist", "build"))
    if not (dest / "README.md").exists():
        (dest / "README.md").write_text("# Echo environment\n\nEchoes messages back.\n")
    if not (dest / "server" / "Dockerfile").exists() and not (dest / "Dockerfile").exists():
        (dest / "server" / "Dockerfile").write_text(dockerfile_template())
    for junk in (".git/HEAD", ".venv/bin/python", "__pycache__/client.cpython-311.pyc", "server/app.pyc"):
        (dest / junk).parent.mkdir(parents=True, exist_ok=True)
        (dest / junk).write_text("junk")
    for junk in ("dist/echo.whl", "build/lib/x.py", "openenv_echo_env.egg-info/PKG-INFO", "data/big.ckpt"):
        (dest / junk).parent.mkdir(parents=True, exist_ok=True)
        (dest / junk).write_text("junk")
    (dest / ".env").write_text("HF_TOKEN=hf_do_not_publish\n")
    (dest / ".dockerignore").write_text("*.ckpt\n")
    return dest


class RecordingHfApi:
    """A stand-in for ``huggingface_hub.HfApi`` (the Hub is out of reach here): it answers
    ``whoami`` and records ``create_repo`` and ``upload_folder``, snapshotting the uploaded folder
    (the command deletes it afterwards)."""

    def __init__(self, user: Optional[str] = "alice") -> None:
        self.user = user
        self.calls: List[tuple] = []
        self.uploaded: Dict[str, str] = {}

    def whoami(self) -> Dict[str, Any]:
        self.calls.append(("whoami", {}))
        if self.user is None:
            from huggingface_hub.errors import LocalTokenNotFoundError

            raise LocalTokenNotFoundError("Token is required to call the /whoami-v2 endpoint, but no token found.")
        return {"name": self.user, "type": "user"}

    def create_repo(self, repo_id: str, **kwargs: Any) -> Any:
        from huggingface_hub import RepoUrl

        self.calls.append(("create_repo", {"repo_id": repo_id, **kwargs}))
        return RepoUrl(f"https://huggingface.co/spaces/{repo_id}")

    def upload_folder(self, **kwargs: Any) -> Any:
        from huggingface_hub import CommitInfo

        self.calls.append(("upload_folder", kwargs))
        folder = Path(kwargs["folder_path"])
        self.uploaded = {
            p.relative_to(folder).as_posix(): p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file()
        }
        url = f"https://huggingface.co/spaces/{kwargs['repo_id']}/commit/0123456789abcdef"
        return CommitInfo(commit_url=url, commit_message="", commit_description="", oid="0123456789abcdef")

    def called(self, name: str) -> Dict[str, Any]:
        (kwargs,) = [kw for called, kw in self.calls if called == name]
        return kwargs


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> RecordingHfApi:
    api = RecordingHfApi()
    monkeypatch.setattr(_publish, "hf_api", lambda: api)
    return api


# -- to a Space (up to the network) ------------------------------------------------------------


def test_the_space_gets_the_package_with_its_dockerfile_at_the_root_and_nothing_local(
    package: Path, hub: RecordingHfApi, capsys: pytest.CaptureFixture
) -> None:
    code, out, err = run(capsys, "push", str(package), "--exclude", "data/")
    assert code == 0, err
    assert hub.uploaded["Dockerfile"] == _publish.with_web_interface(dockerfile_template())
    assert "server/Dockerfile" not in hub.uploaded
    assert {"openenv.yaml", "__init__.py", "client.py", "server/app.py", "pyproject.toml", ".dockerignore"} <= set(
        hub.uploaded
    )
    leaked = [f for f in hub.uploaded if f.startswith((".git/", ".venv/", "dist/", "build/", "data/", ".env"))]
    leaked += [f for f in hub.uploaded if f.endswith(".pyc") or "__pycache__" in f or ".egg-info" in f]
    assert leaked == []
    assert out == "https://huggingface.co/spaces/alice/echo_env\n"
    assert "Pushed alice/echo_env (commit 0123456789ab" in err


def test_the_space_readme_gets_front_matter_for_a_docker_space_and_keeps_its_text(
    package: Path, hub: RecordingHfApi, capsys: pytest.CaptureFixture
) -> None:
    original = (package / "README.md").read_text()
    assert run(capsys, "push", str(package))[0] == 0
    readme = hub.uploaded["README.md"]
    _, front, body = readme.split("---\n", 2)
    assert yaml.safe_load(front) == {
        "title": "echo_env",
        "tags": ["openenv"],
        "base_path": "/web",
        "sdk": "docker",
        "app_port": 8000,
    }
    assert body.lstrip("\n") == original
    assert (package / "README.md").read_text() == original  # the package itself is untouched


def test_the_space_opens_on_the_web_playground_unless_told_not_to(
    package: Path, hub: RecordingHfApi, capsys: pytest.CaptureFixture
) -> None:
    code, _, err = run(capsys, "push", str(package))
    assert code == 0 and "Dockerfile: added ENV ENABLE_WEB_INTERFACE=true" in err
    lines = hub.uploaded["Dockerfile"].splitlines()
    instructions = [line.split()[0] for line in lines if line[:1].isalpha()]
    assert instructions[-2:] == ["ENV", "CMD"] and "ENV ENABLE_WEB_INTERFACE=true" in lines
    assert run(capsys, "push", str(package), "--no-interface")[0] == 0
    assert hub.uploaded["Dockerfile"] == dockerfile_template()
    assert "base_path" not in hub.uploaded["README.md"]


def test_a_dockerfile_that_sets_the_variable_or_a_base_path_is_left_alone() -> None:
    own = "FROM python:3.11-slim\nENV ENABLE_WEB_INTERFACE=false\nCMD run\n"
    assert _publish.with_web_interface(own) == own
    continued = "FROM x\nHEALTHCHECK \\\nCMD true\nCMD serve\n"
    assert _publish.with_web_interface(continued).endswith("ENV ENABLE_WEB_INTERFACE=true\n\nCMD serve\n")
    assert _publish.with_web_interface("FROM x").endswith("FROM x\nENV ENABLE_WEB_INTERFACE=true\n")
    text, changes = _publish.space_front_matter(
        "---\nbase_path: /docs\n---\n", {"sdk": "docker"}, {"base_path": "/web"}
    )
    assert "base_path: /docs" in text and changes == ["added sdk: docker"]


def test_existing_front_matter_keeps_its_keys_and_comments_and_gets_sdk_docker(tmp_path: Path) -> None:
    readme = "---\ntitle: My env  # shown on the Hub\nsdk: gradio\ncolorFrom: red\ntags:\n- games\n---\n# Body\n"
    text, changes = _publish.space_front_matter(readme, {"sdk": "docker", "app_port": 8000}, {"tags": ["openenv"]})
    assert text == (
        "---\ntitle: My env  # shown on the Hub\nsdk: docker\ncolorFrom: red\ntags:\n- games\napp_port: 8000\n---\n# Body\n"
    )
    assert changes == ["sdk: 'gradio' replaced by 'docker'", "added app_port: 8000"]
    assert _publish.space_front_matter(text, {"sdk": "docker", "app_port": 8000}, {}) == (text, [])


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (None, "alice/echo_env"),
        ("my-space", "alice/my-space"),
        ("my-org/their-space", "my-org/their-space"),
        ("https://huggingface.co/spaces/my-org/their-space", "my-org/their-space"),
    ],
)
def test_the_repo_id_defaults_to_the_manifest_name_in_the_users_namespace(
    package: Path, hub: RecordingHfApi, capsys: pytest.CaptureFixture, given: Optional[str], expected: str
) -> None:
    args = ["push", str(package)] + (["--repo-id", given] if given else [])
    code, out, _ = run(capsys, *args)
    assert code == 0
    assert hub.called("create_repo")["repo_id"] == expected
    assert hub.called("upload_folder")["repo_id"] == expected
    assert out.strip() == f"https://huggingface.co/spaces/{expected}"


def test_a_repo_id_with_two_slashes_is_refused_before_anything_is_created(
    package: Path, hub: RecordingHfApi, capsys: pytest.CaptureFixture
) -> None:
    code, _, err = run(capsys, "push", str(package), "--repo-id", "a/b/c")
    assert code == 1 and "invalid Space id 'a/b/c': use NAME or ORG/NAME" in err
    assert [name for name, _ in hub.calls] == ["whoami"]


@pytest.mark.parametrize(("flag", "private"), [([], None), (["--private"], True)])
def test_the_space_is_a_docker_space_made_private_on_request(
    package: Path, hub: RecordingHfApi, capsys: pytest.CaptureFixture, flag: List[str], private: Optional[bool]
) -> None:
    assert run(capsys, "push", str(package), *flag)[0] == 0
    assert hub.called("create_repo") == {
        "repo_id": "alice/echo_env",
        "repo_type": "space",
        "space_sdk": "docker",
        "private": private,
        "exist_ok": True,
    }
    upload = hub.called("upload_folder")
    assert upload["repo_type"] == "space" and upload["commit_message"] == "openenv push: echo_env 0.1.0"


def test_without_a_token_the_fake_hub_refusal_becomes_a_login_hint(
    package: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    api = RecordingHfApi(user=None)
    monkeypatch.setattr(_publish, "hf_api", lambda: api)
    code, out, err = run(capsys, "push", str(package))
    assert code == 1 and out == ""
    assert "Error: not logged in to the Hugging Face Hub: log in with `hf auth login`" in err
    assert [name for name, _ in api.calls] == ["whoami"]


def test_without_a_token_the_real_huggingface_hub_gives_the_same_login_hint(package: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH")}
    env.update(HF_HOME=str(tmp_path / "hf-home"), COLUMNS="1000")
    result = subprocess.run([*OPENENV, "push", str(package)], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 1
    assert "Error: not logged in to the Hugging Face Hub" in flat(result.stderr)


def test_an_incomplete_package_is_refused_with_everything_it_lacks(
    package: Path, hub: RecordingHfApi, capsys: pytest.CaptureFixture
) -> None:
    (package / "client.py").unlink()
    (package / "server" / "Dockerfile").unlink()
    (package / "README.md").unlink()
    code, _, err = run(capsys, "push", str(package))
    assert code == 1
    assert (
        "is not a complete environment package; missing: client.py, README.md, server/Dockerfile or Dockerfile" in err
    )
    assert "dockerfile_template" in err
    assert hub.calls == []


# -- to a git remote (for real) ----------------------------------------------------------------


def git(*args: str, cwd: Optional[Path] = None) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def throwaway_venv(path: Path) -> Tuple[Path, Path]:
    """A venv without pip for installing a package into: its python and its site-packages.

    ``venv --system-site-packages`` would expose the base interpreter's packages, not this
    checkout's venv, so a .pth file lends it the checkout's dependencies (openenv, fastapi, ...);
    the package installed into it is its own."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    lent = [sysconfig.get_paths()["purelib"], str(Path(openenv.__file__).resolve().parents[1])]
    (site / "lent-from-the-checkout.pth").write_text("\n".join(lent) + "\n")
    return python, site


@pytest.fixture
def remote(tmp_path: Path) -> Path:
    bare = tmp_path / "remote.git"
    git("init", "-q", "--bare", "--initial-branch=main", str(bare))
    return bare


def test_a_second_push_adds_a_commit_on_top_and_an_unchanged_one_adds_none(
    package: Path, remote: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    code, out, err = run(capsys, "push", str(package), "--git-remote", str(remote))
    assert code == 0, err
    first = out.strip()
    assert "(the branch's first commit)" in err

    (package / "client.py").write_text((package / "client.py").read_text() + "\n# second version\n")
    (package / "models.py").unlink()
    code, out, err = run(capsys, "push", str(package), "--git-remote", str(remote), "-m", "Second version")
    assert code == 0, err
    second = out.strip()
    assert f"on top of {first[:12]}" in err

    clone = tmp_path / "clone"
    git("clone", "-q", str(remote), str(clone))
    assert git("log", "--format=%H %P %s", cwd=clone).splitlines() == [
        f"{second} {first} Second version",
        f"{first}  openenv push: echo_env 0.1.0",
    ]
    files = git("ls-files", cwd=clone).splitlines()
    assert "models.py" not in files  # a file removed from the package is removed from the branch
    assert {"openenv.yaml", "server/app.py", "server/Dockerfile", ".dockerignore"} <= set(files)
    assert [f for f in files if f.startswith((".git/", ".venv/", "dist/", "build/", ".env"))] == []
    assert "# second version" in (clone / "client.py").read_text()

    code, out, err = run(capsys, "push", str(package), "--git-remote", str(remote))
    assert code == 0 and out.strip() == second
    assert "Nothing to push: branch main of" in err
    assert git("rev-parse", "main", cwd=remote) == second


@pytest.mark.parametrize("head", ["master", "trunk"])
def test_a_push_to_a_fresh_bare_remote_goes_to_the_branch_its_head_names_so_a_plain_clone_checks_it_out(
    package: Path, tmp_path: Path, capsys: pytest.CaptureFixture, head: str
) -> None:
    bare = tmp_path / "fresh.git"
    git("init", "-q", "--bare", f"--initial-branch={head}", str(bare))  # what `git init --bare` makes
    code, _, err = run(capsys, "push", str(package), "--git-remote", str(bare))
    assert code == 0, err
    assert f"branch {head}" in err
    clone = tmp_path / "clone"
    git("clone", "-q", str(bare), str(clone))  # no "remote HEAD refers to nonexistent ref"
    assert (clone / "openenv.yaml").is_file()
    code, _, err = run(capsys, "push", str(package), "--git-remote", f"file://{bare}")  # HEAD now born: via ls-remote
    assert code == 0 and f"Nothing to push: branch {head} of" in err


def test_the_pushed_package_installs_with_pip_and_serves_in_a_sandbox(
    package: Path, remote: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    if find_bwrap() is None:
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")
    environment = package / "server" / "echo_environment.py"
    environment.write_text(environment.read_text().replace(GREETING, "Echo environment, as pushed, ready!"))
    code, _, err = run(capsys, "push", str(package), "--git-remote", f"file://{remote}", "--branch", "release")
    assert code == 0, err
    clone = tmp_path / "clone"
    git("clone", "-q", "--branch", "release", f"file://{remote}", str(clone))

    python, site = throwaway_venv(tmp_path / "venv")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(clone)], check=True
    )
    where = subprocess.run(
        [python, "-c", "import echo_env; print(echo_env.__file__)"], check=True, capture_output=True, text=True
    ).stdout.strip()
    assert Path(where).is_relative_to(site)

    from echo_env import CallToolAction, EchoEnv

    provider = SandboxProvider(project_path=str(clone), python=str(python))
    url = provider.start()
    try:
        provider.wait_for_ready(60)
        with EchoEnv(base_url=url).sync() as env:
            assert env.reset().observation.echoed_message == "Echo environment, as pushed, ready!"
            result = env.step(CallToolAction(tool_name="echo_message", arguments={"message": "pushed"}))
            assert result.observation.result == "pushed"
    finally:
        provider.stop()


def test_without_a_git_identity_the_commit_is_made_as_openenv_push(
    package: Path, remote: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    empty = tmp_path / "empty-gitconfig"
    empty.write_text("")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(empty))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for name in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "EMAIL"):
        monkeypatch.delenv(name, raising=False)
    code, out, err = run(capsys, "push", str(package), "--git-remote", str(remote))
    assert code == 0, err
    assert "committing as openenv push <openenv-push@localhost>" in err
    assert git("log", "-1", "--format=%an <%ae>", out.strip(), cwd=remote) == "openenv push <openenv-push@localhost>"


def test_a_missing_git_remote_says_how_to_make_one(
    package: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    missing = tmp_path / "nowhere.git"
    code, _, err = run(capsys, "push", str(package), "--git-remote", str(missing))
    assert code == 1 and f"no such repository; make one with: git init --bare {missing}" in err


def test_space_options_are_refused_with_a_git_remote(
    package: Path, remote: Path, capsys: pytest.CaptureFixture
) -> None:
    code, _, err = run(capsys, "push", str(package), "--git-remote", str(remote), "--private")
    assert code == 1 and "--repo-id and --private are for Spaces" in err
    code, _, err = run(capsys, "push", str(package), "--branch", "dev")
    assert code == 1 and "--branch applies to --git-remote" in err
