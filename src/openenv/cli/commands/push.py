"""``openenv push``: publish an environment package to a Hugging Face Space or any git remote.

Both destinations get the same staged copy of the package (see :mod:`openenv.cli._publish`: no
``.git``, ``.venv``, ``.env``, caches or build outputs). A Space also gets the Space layout: the
Dockerfile at its root and README front matter with ``sdk: docker`` and ``app_port``, and (unless
``--no-interface``) opens on the web playground: ``base_path: /web`` and ``ENV
ENABLE_WEB_INTERFACE=true``, as upstream's ``openenv push`` sets up.

A git remote receives a new commit on top of its branch (when the branch exists), holding exactly
the staged files: a second push adds a commit, it never rewrites history, and a push with nothing
changed adds nothing.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import List, Optional, Sequence

import typer

from openenv.cli import _publish
from openenv.cli._common import CLIError, err, load_package, out, styled
from openenv.core.containers.runtime.docker import _redact
from openenv.core.manifest import EnvManifest

_SPACE_URL = re.compile(r"^(https?://)?([^/@]+@)?(huggingface\.co|hf\.co)/spaces/", re.IGNORECASE)
_IDENTITY = ("openenv push", "openenv-push@localhost")


def _report(manifest: EnvManifest, files: Sequence[str], changes: Sequence[str], destination: str) -> None:
    err.print(f"Pushing {manifest.name} ({len(files)} files) to {destination}…", markup=False)
    for change in changes:
        err.print(f"  {change}", markup=False, style="dim")


# -- a Hugging Face Space -------------------------------------------------------------------------


def push_to_space(
    manifest: EnvManifest,
    repo_id: Optional[str],
    private: bool,
    excludes: Sequence[str],
    message: str,
    web: bool = True,
) -> str:
    """Upload the staged package to the Docker Space ``repo_id`` (made when absent); return its URL."""
    api = _publish.hf_api()
    with tempfile.TemporaryDirectory(prefix="openenv-push-") as scratch:
        staged = Path(scratch) / "space"
        files = _publish.stage(manifest.path, staged, excludes)
        changes = _publish.space_layout(staged, manifest, web)
        user = _publish.hub_user(api)
        repo = _publish.resolve_repo_id(repo_id, manifest.name, user)
        _report(manifest, files, changes, f"the Hugging Face Space {repo}")
        try:
            url = api.create_repo(
                repo, repo_type="space", space_sdk="docker", private=True if private else None, exist_ok=True
            )
        except Exception as exc:
            raise _publish.hub_error(exc, f"creating the Space {repo}") from None
        try:
            commit = api.upload_folder(repo_id=repo, folder_path=str(staged), repo_type="space", commit_message=message)
        except Exception as exc:
            raise _publish.hub_error(exc, f"uploading to the Space {repo}") from None
    space_url = str(url) if url else f"https://huggingface.co/spaces/{repo}"
    oid = getattr(commit, "oid", None)
    commit_url = getattr(commit, "commit_url", None)
    detail = f" (commit {str(oid)[:12]}{', ' + str(commit_url) if commit_url else ''})" if oid else ""
    err.print(styled("[green]Pushed[/] {}{}{}", repo, detail, " as a private Space" if private else ""))
    err.print("The Space builds its image now; its page shows the build log.", markup=False)
    return space_url


# -- any git remote -------------------------------------------------------------------------------


def _git(args: Sequence[str], cwd: Path, *, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, errors="replace")
    if check and result.returncode != 0:
        detail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-10:])
        raise CLIError(_redact(f"git {args[0]} failed (exit code {result.returncode}): {detail}", ()))
    return result


def _remote_location(remote: str) -> str:
    """A URL as given; a local repository's path made absolute (git runs in a scratch directory)."""
    if "://" in remote or (re.match(r"^[^/\\]+:", remote) and not Path(remote).exists()):
        return remote  # a URL, or scp-like ssh (user@host:path)
    path = Path(remote).expanduser()
    if not path.exists():
        raise CLIError(f"--git-remote {remote}: no such repository; make one with: git init --bare {remote}")
    return str(path.resolve())


def _identity_options(work: Path) -> List[str]:
    have = all(_git(["config", key], work, check=False).stdout.strip() for key in ("user.name", "user.email"))
    if have:
        return []
    name, email = _IDENTITY
    err.print(f"No git identity is configured (git config user.name/user.email): committing as {name} <{email}>.")
    return ["-c", f"user.name={name}", "-c", f"user.email={email}"]


def _default_branch(location: str, work: Path) -> str:
    """The branch a clone of ``location`` checks out: the one its HEAD names (``main`` where that
    cannot be told: a remote elsewhere with no commits yet)."""
    listed = _git(["ls-remote", "--symref", location, "HEAD"], work, check=False).stdout
    for line in listed.splitlines():
        if line.startswith("ref: refs/heads/") and line.endswith("\tHEAD"):
            return line[len("ref: refs/heads/") : -len("\tHEAD")]
    if Path(location).is_dir():  # a repository on this machine: its HEAD names its branch, born or not
        head = _git(["-C", location, "symbolic-ref", "--quiet", "HEAD"], work, check=False).stdout.strip()
        if head.startswith("refs/heads/"):
            return head[len("refs/heads/") :]
    return "main"


def push_to_git(
    manifest: EnvManifest,
    remote: str,
    branch: Optional[str],
    excludes: Sequence[str],
    message: str,
    web: bool = True,
) -> str:
    """Commit the staged package on top of ``branch`` of ``remote`` (default: the remote's default
    branch) and push it; return the commit id."""
    if shutil.which("git") is None:
        raise CLIError("git is not installed: install it (apt-get install git), or push to a Space instead")
    location = _remote_location(remote)
    shown = _redact(location, ())
    with tempfile.TemporaryDirectory(prefix="openenv-push-") as scratch:
        work = Path(scratch) / "repo"
        files = _publish.stage(manifest.path, work, excludes)
        changes = _publish.space_layout(work, manifest, web) if _SPACE_URL.match(location) else []
        _git(["init", "-q"], work)
        branch = branch or _default_branch(location, work)
        if _git(["check-ref-format", f"refs/heads/{branch}"], work, check=False).returncode != 0:
            raise CLIError(f"--branch {branch!r} is not a valid branch name")
        _git(["symbolic-ref", "HEAD", f"refs/heads/{branch}"], work)
        _report(manifest, files, changes, f"{shown} (branch {branch})")
        heads = _git(["ls-remote", "--heads", location, f"refs/heads/{branch}"], work).stdout
        parent = None
        if any(line.endswith(f"\trefs/heads/{branch}") for line in heads.splitlines()):
            _git(["fetch", "-q", "--no-tags", "--depth=1", location, f"refs/heads/{branch}"], work)
            parent = _git(["rev-parse", "FETCH_HEAD"], work).stdout.strip()
            _git(["update-ref", f"refs/heads/{branch}", parent], work)
        _git(["add", "-A"], work)
        if parent is not None and _git(["diff", "--cached", "--quiet", "HEAD"], work, check=False).returncode == 0:
            err.print(
                f"Nothing to push: branch {branch} of {shown} already holds this package ({parent[:12]}).", markup=False
            )
            return parent
        _git([*_identity_options(work), "commit", "-q", "-m", message], work)
        commit = _git(["rev-parse", "HEAD"], work).stdout.strip()
        pushed = _git(["push", "-q", location, f"HEAD:refs/heads/{branch}"], work, check=False)
        if pushed.returncode != 0:
            detail = "\n".join(pushed.stderr.strip().splitlines()[-10:])
            hint = " (the branch moved while pushing: run openenv push again)" if "rejected" in detail else ""
            raise CLIError(_redact(f"git push to {location} failed{hint}: {detail}", ()))
    on_top = f" on top of {parent[:12]}" if parent else " (the branch's first commit)"
    err.print(styled("[green]Pushed[/] commit {}{} to {}, branch {}.", commit[:12], on_top, shown, branch))
    return commit


def register(app: typer.Typer) -> None:
    @app.command("push")
    def command(
        path: Optional[str] = typer.Argument(None, help="The environment package (default: the current directory)."),
        repo_id: Optional[str] = typer.Option(
            None,
            "--repo-id",
            "-r",
            help="The Space: ORG/NAME, or NAME in your namespace (default: the manifest's name).",
        ),
        private: bool = typer.Option(False, "--private", help="Make a new Space private."),
        git_remote: Optional[str] = typer.Option(
            None, "--git-remote", help="Push to this git remote (a URL or a local repository) instead of a Space."
        ),
        branch: Optional[str] = typer.Option(
            None,
            "--branch",
            "-b",
            metavar="BRANCH",
            help="The git remote's branch (default: the one its HEAD names, which a clone checks out; main for an "
            "empty remote that is not on this machine).",
        ),
        exclude: Optional[List[str]] = typer.Option(
            None,
            "--exclude",
            "-x",
            metavar="PATTERN",
            help="Leave out matching files: NAME-PATTERN at any depth, or a PATH/PATTERN from the package root "
            "(a trailing / matches directories only); repeat for more.",
        ),
        message: Optional[str] = typer.Option(None, "--message", "-m", metavar="TEXT", help="The commit message."),
        interface: bool = typer.Option(
            True,
            "--interface/--no-interface",
            help="A Space opens on the web playground (base_path: /web, ENABLE_WEB_INTERFACE=true in its Dockerfile).",
        ),
    ) -> None:
        """Publish the environment package to a Hugging Face Space (or, with --git-remote, a git repository).

        Prints the Space's URL (or the pushed commit's id) on stdout.
        """
        manifest = load_package(path)
        if git_remote is None and branch is not None:
            raise CLIError("--branch applies to --git-remote; a Space is always pushed to its main branch")
        if git_remote is not None and (repo_id is not None or private):
            raise CLIError("--repo-id and --private are for Spaces; with --git-remote, the remote names the repository")
        for warning in _publish.check_structure(manifest):
            err.print(styled("[yellow]Warning:[/] {}", warning))
        excludes = list(exclude or ())
        text = message or f"openenv push: {manifest.name}" + (f" {manifest.version}" if manifest.version else "")
        if git_remote is not None:
            out.print(push_to_git(manifest, git_remote, branch, excludes, text, interface), markup=False)
        else:
            out.print(push_to_space(manifest, repo_id, private, excludes, text, interface), markup=False)
