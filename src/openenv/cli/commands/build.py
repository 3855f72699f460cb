"""``openenv build``: an environment package's sdist and wheel, then its Docker image.

The distributions are always built (pypa ``build``: the sdist, then the wheel from the sdist, so a
file the sdist forgets fails the build here rather than in someone's ``pip install``). The image
is built when the package has a Dockerfile and a Docker engine answers; otherwise the command
says what it built, why the image was skipped and how to build it later.
"""

from __future__ import annotations

import collections
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Deque, Dict, List, Optional

import typer

from openenv.cli import _publish
from openenv.cli._common import CLIError, err, load_package, out, styled
from openenv.core.manifest import EnvManifest

_TAIL_LINES = 30


def _docker_client() -> Any:
    """A Docker SDK client connected to an engine; RuntimeError (no engine) or ImportError (no SDK)
    saying why not. The command's one seam to Docker: tests replace it, as no engine runs there."""
    from openenv.core.containers.runtime.docker import LocalDockerProvider

    return LocalDockerProvider().client


def _print_tail(lines: Deque[str], what: str) -> None:
    if lines:
        err.print(f"The last lines of {what}:", style="bold")
        for line in lines:
            err.print(f"  {line}", markup=False, style="dim")


def build_distributions(
    package_dir: Path, out_dir: Path, *, isolation: bool = True, verbose: bool = False
) -> List[Path]:
    """Build the sdist and wheel of ``package_dir`` into ``out_dir``; return their paths.

    Runs ``python -m build`` (isolated: the build requirements are installed into a throwaway
    environment; ``isolation=False``: this environment must already have them). Progress lines
    are printed as they come, every line with ``verbose``; on failure the log's last lines are
    printed and a CLIError raised.
    """
    if importlib.util.find_spec("build") is None:
        raise CLIError("the `build` package is not installed in this environment: pip install build")
    if not (package_dir / "pyproject.toml").is_file() and not (package_dir / "setup.py").is_file():
        raise CLIError(f"{package_dir} has no pyproject.toml (or setup.py): there is nothing to build a wheel from")
    mode = "in an isolated environment" if isolation else "with this environment's packages (--no-build-isolation)"
    err.print(f"Building the sdist and wheel of {package_dir} {mode}…", markup=False)
    tail: Deque[str] = collections.deque(maxlen=_TAIL_LINES)
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("FORCE_COLOR", None)
    with tempfile.TemporaryDirectory(prefix="openenv-build-") as scratch:
        command = [sys.executable, "-m", "build", "--outdir", scratch, *([] if isolation else ["--no-isolation"])]
        process = subprocess.Popen(
            [*command, str(package_dir)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env=env,
        )
        try:
            assert process.stdout is not None
            listing = False  # the lines under a "* ...:" heading of build's are its items ("  - setuptools")
            for raw in process.stdout:
                line = raw.rstrip("\n")
                tail.append(line)
                if verbose or line.startswith("* ") or (listing and line.startswith("  - ")):
                    err.print(f"  {line}", markup=False, style="dim")
                listing = (line.startswith("* ") and line.endswith(":")) or (listing and line.startswith("  - "))
            code = process.wait()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        if code != 0:
            if not verbose:
                _print_tail(tail, "the build log")
            hint = "run it again with --verbose for the whole log"
            if any("Unmet dependencies" in line or "Missing dependencies" in line for line in tail):
                hint = "install the missing build requirements into this environment, or build without --no-build-isolation"
            raise CLIError(f"building the sdist and wheel of {package_dir} failed (exit code {code}): {hint}")
        out_dir.mkdir(parents=True, exist_ok=True)
        built = []
        for artifact in sorted(Path(scratch).iterdir(), key=lambda p: not p.name.endswith(".tar.gz")):
            if artifact.is_file():
                target = out_dir / artifact.name
                shutil.move(str(artifact), str(target))
                built.append(target)
    if not built:
        raise CLIError(f"building {package_dir} reported success but produced no files")
    return built


def _size(path: Path) -> str:
    size = float(path.stat().st_size)
    for unit in ("B", "kB", "MB"):
        if size < 1000 or unit == "MB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return ""


def build_image(
    client: Any,
    context: Path,
    dockerfile: str,
    tag: str,
    *,
    build_args: Optional[Dict[str, str]] = None,
    labels: Optional[Dict[str, str]] = None,
    no_cache: bool = False,
) -> str:
    """Build ``context`` with ``dockerfile`` (relative to it, or absolute) through the Docker SDK's
    low-level API, printing the build log as it streams; return the image id (CLIError on failure)."""
    tail: Deque[str] = collections.deque(maxlen=_TAIL_LINES)
    image_id: Optional[str] = None
    try:
        stream = client.api.build(
            path=str(context),
            dockerfile=dockerfile,
            tag=tag,
            rm=True,
            forcerm=True,
            nocache=no_cache,
            buildargs=build_args or None,
            labels=labels or None,
            decode=True,
        )
        for chunk in stream:
            if chunk.get("error"):
                message = str((chunk.get("errorDetail") or {}).get("message") or chunk["error"]).strip()
                raise CLIError(f"docker build of {tag} failed: {message}")
            for line in str(chunk.get("stream") or "").splitlines():
                if line.strip():
                    tail.append(line)
                    err.print(f"  {line}", markup=False, style="dim")
            if chunk.get("status") and not chunk.get("progressDetail"):  # pulls: skip per-layer progress
                err.print(f"  {chunk.get('id', '')} {chunk['status']}".rstrip(), markup=False, style="dim")
            aux = chunk.get("aux")
            if isinstance(aux, dict) and aux.get("ID"):
                image_id = str(aux["ID"])
    except CLIError:
        raise
    except Exception as exc:  # the SDK's APIError, a dropped connection (requests' errors are OSErrors)
        raise CLIError(f"docker build of {tag} failed: {type(exc).__name__}: {exc}") from None
    if image_id is None:
        for line in reversed(tail):
            if line.startswith("Successfully built "):
                image_id = line.split()[-1]
                break
    return image_id or tag


def _dockerfile_for(manifest: EnvManifest, option: Optional[str], staged: Path) -> Optional[str]:
    """The Dockerfile to build with, as the SDK wants it; None when the package has none."""
    if option is None:
        return _publish.find_dockerfile(staged)
    given = Path(option).expanduser()
    source = given if given.is_absolute() else manifest.path / given
    if not source.is_file():
        raise CLIError(f"--dockerfile {option}: no such file (a path relative to {manifest.path}, or absolute)")
    source = source.resolve()
    try:
        relative = source.relative_to(manifest.path).as_posix()
    except ValueError:
        return str(source)  # outside the package: the SDK sends it along with the context
    return relative if (staged / relative).is_file() else str(source)


def _docker_command(tag: str, package: Path, dockerfile: str) -> str:
    """The ``docker build`` command line for the package, runnable from the current directory
    (docker reads ``-f`` from there, not from the context)."""
    path = Path(dockerfile) if Path(dockerfile).is_absolute() else package / dockerfile
    return shlex.join(["docker", "build", "-t", tag, "-f", str(path), str(package)])


def _image(
    manifest: EnvManifest,
    tag: str,
    dockerfile_option: Optional[str],
    build_args: Dict[str, str],
    no_cache: bool,
    built: List[Path],
) -> Optional[str]:
    package = manifest.path
    where = f"the distributions are in {built[0].parent}" if built else "nothing was built"
    with tempfile.TemporaryDirectory(prefix="openenv-image-") as scratch:
        context = Path(scratch) / "context"
        _publish.stage(package, context)
        dockerfile = _dockerfile_for(manifest, dockerfile_option, context)
        if dockerfile is None:
            err.print(
                styled(
                    "[yellow]Image skipped:[/] {} has no Dockerfile ({}); {}. To build an image, {}",
                    package,
                    " or ".join(_publish.DOCKERFILES),
                    where,
                    _publish.dockerfile_hint(package),
                )
            )
            return None
        try:
            client = _docker_client()
        except (ImportError, RuntimeError) as exc:
            err.print(
                styled(
                    "[yellow]Image skipped:[/] {}. {}; the image {} was not built. Once Docker runs, build it "
                    "with: openenv build {} (or: {})",
                    exc,
                    where[:1].upper() + where[1:],
                    tag,
                    package,
                    _docker_command(tag, package, dockerfile),
                )
            )
            return None
        err.print(f"Building the Docker image {tag} from {dockerfile}…", markup=False)
        labels = {"openenv.name": manifest.name, **({"openenv.version": manifest.version} if manifest.version else {})}
        try:
            image_id = build_image(
                client, context, dockerfile, tag, build_args=build_args, labels=labels, no_cache=no_cache
            )
        except CLIError as exc:
            raise CLIError(f"{exc} ({where}; the image was not built)") from None
        finally:
            close = getattr(client, "close", None)
            if callable(close):
                close()
    err.print(styled("[green]Built image[/] {} ({})", tag, image_id[:19]))
    return tag


def register(app: typer.Typer) -> None:
    @app.command("build")
    def command(
        path: Optional[str] = typer.Argument(None, help="The environment package (default: the current directory)."),
        tag: Optional[str] = typer.Option(
            None, "--tag", "-t", help="The image tag (default: openenv-<name without _env>:latest)."
        ),
        out_dir: Optional[Path] = typer.Option(
            None, "--out-dir", "-o", metavar="DIR", help="Where the sdist and wheel go (default: PATH/dist)."
        ),
        no_docker: bool = typer.Option(False, "--no-docker", help="Build the sdist and wheel only."),
        no_isolation: bool = typer.Option(
            False,
            "--no-build-isolation",
            "--no-isolation",
            help="Build with this environment's packages instead of installing the build requirements "
            "into an isolated one.",
        ),
        dockerfile: Optional[str] = typer.Option(
            None,
            "--dockerfile",
            "-f",
            metavar="PATH",
            help="The Dockerfile (default: server/Dockerfile, then Dockerfile).",
        ),
        build_arg: Optional[List[str]] = typer.Option(
            None, "--build-arg", metavar="KEY=VALUE", help="KEY=VALUE passed to the image build; repeat for more."
        ),
        no_cache: bool = typer.Option(False, "--no-cache", help="Build the image without Docker's layer cache."),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="Show the whole wheel build log."),
    ) -> None:
        """Build the environment's sdist and wheel, then its Docker image when Docker is available.

        Prints the built files (and the image tag) on stdout, progress on stderr.
        """
        manifest = load_package(path)
        build_args = _publish.parse_assignments(build_arg, "--build-arg")
        destination = (out_dir.expanduser() if out_dir else manifest.path / "dist").resolve()
        built = build_distributions(manifest.path, destination, isolation=not no_isolation, verbose=verbose)
        err.print(styled("[green]Built[/] {} distributions in {}:", len(built), destination))
        for artifact in built:
            err.print(f"  {artifact.name} ({_size(artifact)})", markup=False)
        image_tag = tag or _publish.image_tag(manifest.name)
        image = None
        if no_docker:
            err.print(f"Image skipped (--no-docker): {image_tag} was not built.", markup=False)
        else:
            image = _image(manifest, image_tag, dockerfile, build_args, no_cache, built)
        for artifact in built:
            out.print(str(artifact), markup=False)
        if image:
            out.print(image, markup=False)
