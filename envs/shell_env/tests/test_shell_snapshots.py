"""Snapshots of shell_env sessions: the work directory travels as a packed tree, and the attacks.

The work directory is the agent's: whatever it holds, saving it never follows a link (a link out
of it is refused, never read through), and restoring never writes outside the fresh directory it
builds, not even from a snapshot signed with the server's key. (The exact continuation of forks
and restored sessions is checked for every catalogue environment in
tests/test_catalogue_snapshots.py.)
"""

from __future__ import annotations

import asyncio
import os
import struct
import tempfile
from pathlib import Path
from typing import Any, Iterator, List

import pytest
from shell_env.models import ShellObservation, ShellState
from shell_env.server.shell_environment import ShellEnvironment
from shell_env.server.workspace import MAX_WORKSPACE_BYTES, Workspace

from openenv.core.client_errors import EnvironmentExecutionError, NotSupportedError, SnapshotRefusedError
from openenv.core.client_types import Snapshot
from openenv.core.containers.runtime.isolation import find_bwrap
from openenv.core.env_server.exceptions import SnapshotUnsupportedError
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.serving.runner import BackgroundServer
from openenv.core.env_server.snapshots import SnapshotSeal
from openenv.core.generic_client import GenericEnvClient
from openenv.core.tools import TreeError, pack_directory, unpack_directory
from openenv.testing import planted_secret

KEY = "shell-snapshot-key"
needs_bwrap = pytest.mark.skipif(
    find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)"
)


def call(name: str, **arguments: Any) -> dict:
    return {"type": "call_tool", "tool_name": name, "arguments": arguments}


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: Any) -> Iterator[Path]:
    """Where this test's work directories are made (so that what is left behind can be seen)."""
    where = tmp_path / "tmp"
    where.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(where))
    yield where


def serving(isolation: str, made: List[ShellEnvironment]) -> BackgroundServer:
    def build() -> ShellEnvironment:
        made.append(ShellEnvironment(isolation=isolation))
        return made[-1]

    app = create_app(
        build,
        CallToolAction,
        CallToolObservation,
        env_name="shell_env",
        max_concurrent_envs=4,
        reset_observation_cls=ShellObservation,
        state_cls=ShellState,
        snapshot_key=KEY,
    )
    return BackgroundServer(app)


def record(kind: bytes, name: str, payload: bytes = b"", mode: int = 0o644) -> bytes:
    """One entry of a packed tree (the format of openenv.core.tools._tree), as an attacker writes it."""
    encoded = name.encode()
    return struct.pack(">cIqQI", kind, mode, 0, len(payload), len(encoded)) + encoded + payload


END = struct.pack(">cIqQI", b".", 0, 0, 0, 0)


def test_saving_keeps_links_inside_as_links_and_refuses_links_out_without_reading_them(private_tmp: Path) -> None:
    env = ShellEnvironment(isolation="none")
    try:
        env.reset(task_id="sort_unique")
        root = env.workspace.path
        os.symlink("names.txt", root / "inside")
        (root / "sub").mkdir()
        os.symlink("../names.txt", root / "sub" / "up")
        saved = env.snapshot_state()
        copy = private_tmp / "copy"
        copy.mkdir()
        unpack_directory(saved["workspace"], copy)
        assert os.readlink(copy / "inside") == "names.txt" and os.readlink(copy / "sub" / "up") == "../names.txt"
        assert (copy / "names.txt").read_bytes() == (root / "names.txt").read_bytes()

        with planted_secret() as secret:  # in the host's home
            for name, target in (("passwd", "/etc/passwd"), ("secret", str(secret)), ("home", str(Path.home()))):
                os.symlink(target, root / name)
                with pytest.raises(SnapshotUnsupportedError) as refused:
                    env.snapshot_state()
                assert repr(name) in str(refused.value) and "links leading out of it" in str(refused.value)
                assert secret.text not in str(refused.value)
                os.unlink(root / name)
            # a relative link that climbs out of the tree is refused too
            os.symlink("../..", root / "sub" / "climb")
            with pytest.raises(SnapshotUnsupportedError, match="sub/climb"):
                env.snapshot_state()
            os.unlink(root / "sub" / "climb")
        os.mkfifo(root / "pipe")  # would block a reader forever: refused, never opened
        with pytest.raises(SnapshotUnsupportedError, match="'pipe'"):
            env.snapshot_state()
    finally:
        env.close()


def test_a_link_out_planted_in_a_served_session_is_refused_and_the_session_goes_on(private_tmp: Path) -> None:
    made: List[ShellEnvironment] = []
    with serving("none", made) as server, planted_secret() as secret:

        async def main() -> None:
            async with GenericEnvClient(base_url=server.base_url) as env:
                await env.reset(task_id="hello_file")
                os.symlink(str(secret), made[-1].workspace.path / "leak")
                with pytest.raises(NotSupportedError) as refused:
                    await env.snapshot()
                assert "'leak'" in str(refused.value) and secret.text not in str(refused.value)
                listing = (await env.step(call("list_dir"))).observation["result"]["data"]
                assert {"name": "leak", "type": "link"} in [
                    {k: e[k] for k in ("name", "type")} for e in listing["entries"]
                ]

        asyncio.run(main())


def _crafted_trees(outside: Path) -> dict:
    """Trees that would write outside the work directory if they were unpacked naively."""
    return {
        "a link out": record(b"l", "esc", str(outside).encode()) + END,
        "a link climbing out": record(b"l", "esc", b"../../../" + str(outside).lstrip("/").encode()) + END,
        "a file through a link out": record(b"l", "esc", str(outside.parent).encode())
        + record(b"f", f"esc/{outside.name}", b"pwned")
        + END,
        "a file through a link inside": record(b"d", "d", mode=0o755)
        + record(b"l", "d/self", b".")
        + record(b"f", "d/self/x", b"pwned")
        + END,
        "a parent name": record(b"f", f"../{outside.name}", b"pwned") + END,
        "an absolute name": record(b"f", str(outside), b"pwned") + END,
        "a name twice": record(b"f", "a", b"one") + record(b"f", "a", b"two") + END,
        "a device": record(b"c", "dev", b"") + END,
    }


def test_restoring_never_writes_outside_the_fresh_work_directory(private_tmp: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    env = ShellEnvironment(isolation="none")
    try:
        env.reset(task_id="count_lines")
        good = env.snapshot_state()
        before, files = env.workspace.path, pack_directory(env.workspace.path)
        for what, tree in _crafted_trees(outside).items():
            with pytest.raises(TreeError):
                env.restore_state({**good, "workspace": tree})
            assert not outside.exists() and not os.path.lexists(outside), what
            # the old work directory is untouched, and the fresh one is gone
            assert env.workspace.path == before and pack_directory(before) == files, what
            assert sorted(p.name for p in private_tmp.iterdir()) == [before.name], what
        env.restore_state(good)  # a good one still loads, into a fresh directory
        assert env.workspace.path != before and not before.exists()
        assert pack_directory(env.workspace.path) == files
        assert [p.name for p in private_tmp.iterdir()] == [env.workspace.path.name]
    finally:
        env.close()
    assert list(private_tmp.iterdir()) == []


def test_even_a_snapshot_signed_with_the_servers_key_cannot_write_outside(private_tmp: Path, tmp_path: Path) -> None:
    """Defence in depth: a server only loads what it signed, but should its key leak, a crafted
    work directory still fails to unpack (and the session's environment is discarded)."""
    outside = tmp_path / "outside.txt"
    made: List[ShellEnvironment] = []
    forger = ShellEnvironment(isolation="none")
    forger.reset(task_id="count_lines")
    good = forger.snapshot_state()
    seal = SnapshotSeal(KEY.encode(), env_name="shell_env")
    with serving("none", made) as server:

        async def main() -> None:
            async with GenericEnvClient(base_url=server.base_url) as env:
                await env.reset(task_id="count_lines")
                for tree in _crafted_trees(outside).values():
                    forger.snapshot_state = lambda tree=tree: {**good, "workspace": tree}  # type: ignore[method-assign]
                    with pytest.raises(EnvironmentExecutionError):  # restore_state raised TreeError
                        await env.restore(Snapshot(seal.seal(forger)))
                    assert not os.path.lexists(outside)
                    await env.reset(task_id="count_lines")  # a fresh environment, and the session goes on

        asyncio.run(main())
    forger.close()


def test_a_workspace_over_the_snapshot_limit_is_refused_clearly(private_tmp: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("OPENENV_MAX_SNAPSHOT_MB", "1")
    made: List[ShellEnvironment] = []
    with serving("none", made) as server:

        async def main() -> None:
            async with GenericEnvClient(base_url=server.base_url) as env:
                await env.reset(task_id="hello_file")
                root = made[-1].workspace.path
                (root / "noise.bin").write_bytes(os.urandom(2 * 1024 * 1024))  # does not compress
                with pytest.raises(SnapshotRefusedError) as refused:
                    await env.snapshot()
                assert refused.value.details["reason"] == "too_large"
                assert "over this server's limit" in str(refused.value) and "OPENENV_MAX_SNAPSHOT_MB" in str(
                    refused.value
                )
                (root / "noise.bin").unlink()
                with open(root / "sparse.bin", "wb") as f:  # past what a work directory may hold
                    f.truncate(MAX_WORKSPACE_BYTES + 1)
                with pytest.raises(NotSupportedError) as refused:
                    await env.snapshot()
                assert "the work directory cannot be saved" in str(refused.value) and "32 MiB" in str(refused.value)
                (root / "sparse.bin").unlink()
                assert len(await env.snapshot()) < 64 * 1024  # and the session goes on

        asyncio.run(main())


def test_workspace_load_replaces_the_directory_and_close_removes_the_new_one(private_tmp: Path) -> None:
    first, second = Workspace(isolation="none"), Workspace(isolation="none")
    first.write_file("a/b.txt", "hello")
    os.chmod(first.path / "a" / "b.txt", 0o751)
    os.utime(first.path / "a" / "b.txt", ns=(1_600_000_000_123_456_789,) * 2)
    old = second.path
    second.load(first.save())
    assert not old.exists() and second.read_file("a/b.txt") == "hello"
    info = os.stat(second.path / "a" / "b.txt")
    assert (info.st_mode & 0o777, info.st_mtime_ns) == (0o751, 1_600_000_000_123_456_789)
    second.close()
    first.close()
    assert list(private_tmp.iterdir()) == []


@needs_bwrap
def test_a_link_out_made_by_a_command_never_reaches_the_snapshot(private_tmp: Path) -> None:
    made: List[ShellEnvironment] = []
    with serving("sandbox", made) as server:

        async def main() -> None:
            async with GenericEnvClient(base_url=server.base_url, message_timeout_s=60) as env:
                await env.reset(task_id="hello_file")
                done = (
                    await env.step(call("run_command", command="ln -s /etc/passwd leak; echo hi > kept"))
                ).observation
                assert "not kept" in done["result"]["data"]["stderr"] and "leak" in done["result"]["data"]["stderr"]
                snapshot = await env.snapshot()
                await env.reset(task_id="count_lines")
                await env.restore(snapshot)
                names = [e["name"] for e in (await env.step(call("list_dir"))).observation["result"]["data"]["entries"]]
                assert names == ["kept"]
                assert b"root:x:0:0" not in snapshot.data

        asyncio.run(main())
