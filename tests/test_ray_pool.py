"""RayEnvPool on a real Ray cluster of two nodes on this machine (ray.cluster_utils.Cluster).

Every Ray node here listens on 127.0.0.1 only (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, set before
Ray starts; checked). One cluster and one pool serve the whole module; the node-loss test removes
the second node mid-rollout and adds a fresh one.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import httpx
import pytest

# Loopback only: Ray reads this when it is imported (later is too late); checked on every node below.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'openenv[ray]')")

from ray.cluster_utils import Cluster  # noqa: E402

from openenv.core.client_errors import AuthenticationError  # noqa: E402
from openenv.core.containers.runtime.sandbox import _descendants  # noqa: E402
from openenv.core.env_server.mcp_types import CallToolAction  # noqa: E402
from openenv.ray import RayEnvPool  # noqa: E402
from openenv.testing.escape import wait_for  # noqa: E402

ECHO = str(Path(__file__).resolve().parents[1] / "envs" / "echo_env")
HALF_A_CPU = {"CPU": 0.5}  # two pools fit on the two 1-CPU nodes at once
SERVE_MODULE = b"openenv.core.containers.runtime._serve"


def echo(message: str) -> dict:
    return {"type": "call_tool", "tool_name": "echo_message", "arguments": {"message": message}}


def sandbox_pids() -> set:
    """Host pids of every sandboxed server and warden on this machine (by their module)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if SERVE_MODULE in (entry / "cmdline").read_bytes():
                    found.add(int(entry.name))
            except OSError:
                pass
    return found


def describe(pids: set) -> list:
    """What ``pids`` are (their parent and command line), for a failure message."""
    found = []
    for pid in sorted(pids):
        try:
            parent = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
            found.append((pid, parent, Path(f"/proc/{pid}/cmdline").read_bytes()[:120]))
        except OSError:
            pass
    return found


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


@pytest.fixture(scope="module")
def cluster():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    try:
        ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
        cluster.wait_for_nodes()
        assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def pool(cluster):
    with RayEnvPool(ECHO, replicas=2, placement="STRICT_SPREAD", resources_per_replica=HALF_A_CPU) as pool:
        yield pool


def alive_nodes() -> list:
    return [n for n in ray.nodes() if n["Alive"]]


def test_every_ray_node_listens_on_loopback(cluster):
    nodes = alive_nodes()
    assert len(nodes) == 2
    assert [n["NodeManagerAddress"] for n in nodes] == ["127.0.0.1", "127.0.0.1"]


def test_strict_spread_puts_one_replica_on_each_node(pool):
    replicas = pool.replicas
    assert sorted(r.node_id for r in replicas) == sorted(n["NodeID"] for n in alive_nodes())
    assert all(r.healthy and r.base_url.startswith("http://127.0.0.1:") for r in replicas)


async def test_sixteen_concurrent_echo_clients_share_the_replicas(pool):
    from echo_env import EchoEnv

    clients = [pool.client(EchoEnv) for _ in range(16)]
    try:
        await asyncio.gather(*(c.connect() for c in clients))
        await asyncio.gather(*(c.reset() for c in clients))
        results = await asyncio.gather(
            *(
                c.step(CallToolAction(tool_name="echo_message", arguments={"message": f"m{i}"}))
                for i, c in enumerate(clients)
            )
        )
        assert [r.observation.result for r in results] == [f"m{i}" for i in range(16)]
        assert sorted(r.sessions for r in pool.replicas) == [8, 8]  # least-loaded: half on each
    finally:
        await asyncio.gather(*(c.close() for c in clients))
    assert wait_for(lambda: [r.sessions for r in pool.replicas] == [0, 0], timeout_s=10)


def test_a_pool_client_works_in_sync_code(pool):
    with pool.client().sync() as env:
        env.reset()
        assert env.step(echo("hello")).observation["result"]["data"] == "hello"


GRID_WORLD = str(Path(__file__).resolve().parents[1] / "envs" / "grid_world_env")


async def test_a_session_forks_and_restores_across_replicas_on_other_nodes(cluster):
    """The replicas share the pool's snapshot key: a session snapshotted on one node's replica
    continues exactly on the other's, and ``pool.fork`` spreads forks over the replicas."""
    from openenv.core.generic_client import GenericEnvClient

    moves = [{"action": a} for a in ("RIGHT", "DOWN", "RIGHT", "DOWN", "LEFT")]
    with RayEnvPool(GRID_WORLD, replicas=2, placement="STRICT_SPREAD", resources_per_replica=HALF_A_CPU) as grid:
        first, second = grid.replicas
        assert first.node_id != second.node_id
        original = GenericEnvClient(base_url=first.base_url, headers=grid.headers)
        elsewhere = GenericEnvClient(base_url=second.base_url, headers=grid.headers)
        try:
            await original.reset(seed=4)
            await original.step({"action": "DOWN"})
            snapshot = await original.snapshot()
            forks = await grid.fork(original, 2)
            expected = [(r.observation, r.reward, r.done) for r in [await original.step(m) for m in moves]]
            await elsewhere.restore(snapshot)
            assert [(r.observation, r.reward, r.done) for r in [await elsewhere.step(m) for m in moves]] == expected
            assert {fork.base_url for fork in forks} == {first.base_url, second.base_url}  # one on each node
            for fork in forks:
                assert [(r.observation, r.reward, r.done) for r in [await fork.step(m) for m in moves]] == expected
            await asyncio.gather(*(fork.close() for fork in forks))
        finally:
            await original.close()
            await elsewhere.close()


async def test_a_replica_refuses_clients_without_the_pool_token(pool):
    from echo_env import EchoEnv

    url = pool.replicas[0].base_url
    with pytest.raises(AuthenticationError):
        async with EchoEnv(base_url=url) as env:
            await env.reset()
    with pytest.raises(AuthenticationError):
        async with EchoEnv(base_url=url, headers={"Authorization": "Bearer " + "x" * 43}) as env:
            await env.reset()
    assert httpx.get(url + "/metadata", timeout=10).status_code == 401
    assert httpx.get(url + "/metadata", headers=pool.headers, timeout=10).status_code == 200


def test_strict_spread_over_more_replicas_than_nodes_says_what_is_missing(pool):
    with pytest.raises(RuntimeError, match=r"STRICT_SPREAD needs 3 nodes \(one per replica\) but the cluster has 2"):
        RayEnvPool(ECHO, replicas=3, placement="STRICT_SPREAD", resources_per_replica=HALF_A_CPU, start_timeout_s=2)
    left = [g["name"] for g in ray.util.placement_group_table().values() if g["state"] != "REMOVED"]
    assert left == [pool.name]  # the failed pool removed its placement group


def test_close_leaves_no_actor_placement_group_sandbox_or_process(cluster, pool):
    other = RayEnvPool(ECHO, replicas=2, placement="STRICT_SPREAD", resources_per_replica=HALF_A_CPU)
    actor_pids = [
        ray.get(ray.get_actor(f"{other.name}-{i}", namespace="openenv").info.remote())["pid"] for i in range(2)
    ]
    # Its sandboxes: below its actors (other sessions on this machine run sandboxes of their own).
    its_sandboxes = sandbox_pids() & {p for pid in actor_pids for p in _descendants(pid)}
    assert len(its_sandboxes) >= 4  # each replica's server and warden run in a sandbox
    with other.client().sync() as env:
        env.reset()  # a session open while the pool closes
        other.close()
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    assert not [n for n in names if n.startswith(other.name)]
    groups = [g for g in ray.util.placement_group_table().values() if g["name"] == other.name]
    assert [g["state"] for g in groups] == ["REMOVED"]
    assert wait_for(lambda: not sandbox_pids() & its_sandboxes, timeout_s=10), describe(sandbox_pids() & its_sandboxes)
    assert wait_for(lambda: not any(pid_alive(p) for p in actor_pids), timeout_s=10)
    assert len(pool.urls()) == 2  # the module's pool was not touched


def test_losing_a_node_mid_rollout_fails_its_episodes_and_the_pool_recovers(cluster, pool, tmp_path):
    head = cluster.head_node.node_id
    lost = next(r for r in pool.replicas if r.node_id != head)
    worker = next(n for n in cluster.worker_nodes if n.node_id == lost.node_id)
    played = threading.Semaphore(0)

    async def policy(observation, episode):
        played.release()
        await asyncio.sleep(0.02)
        return echo("x")

    box = {}
    jsonl = tmp_path / "rollout.jsonl"
    thread = threading.Thread(
        target=lambda: box.update(
            result=pool.rollout(policy, episodes=48, concurrency=8, max_steps=10, jsonl_path=jsonl)
        )
    )
    thread.start()
    for _ in range(40):  # some steps on both replicas first
        assert played.acquire(timeout=30)
    cluster.remove_node(worker, allow_graceful=False)
    thread.join(90)
    assert not thread.is_alive(), "the rollout hung after a node was lost"
    result = box["result"]
    assert result.summary.episodes == 48 == len(jsonl.read_text().splitlines())
    failed = [e for e in result.episodes if not e.ok]
    assert failed and all("SessionLostError" in e.error or "Connection" in e.error for e in failed), failed[:3]
    assert result.summary.completed >= 48 - 8  # only the sessions on the lost node's replica failed
    assert wait_for(lambda: pool.urls() == [pool.replicas[1 - lost.index].base_url], timeout_s=10)

    cluster.add_node(num_cpus=1)  # capacity returns: Ray places the bundle there and restarts the actor
    assert wait_for(lambda: len(pool.urls()) == 2, timeout_s=90)
    replicas = pool.replicas
    assert replicas[lost.index].restarts == 1 and replicas[lost.index].node_id not in (lost.node_id, head)
    again = pool.rollout(policy, episodes=8, concurrency=4, max_steps=2)
    assert again.summary.errors == 0


CATALOGUE = Path(__file__).resolve().parents[1] / "envs"


def _catalogue_cases():
    from .test_catalogue_snapshots import CASES

    return sorted(name for name in CASES if ":" not in name)


@pytest.mark.parametrize("name", _catalogue_cases())
async def test_every_catalogue_environment_restores_on_another_replica(cluster, name):
    """A snapshot made on one node's replica of the environment (its package served in the
    sandbox, as `openenv serve` serves it) continues exactly on the other node's replica."""
    from openenv.core.generic_client import GenericEnvClient

    from .test_catalogue_snapshots import CASES, _final_state, _play, _skip, _trace

    case = CASES[name]
    _skip(case)
    if name == "repl_env":  # served in the sandbox, its REPL runs through the broker: refused, saying why
        pytest.skip("repl_env refuses snapshots where its REPL runs through the sandbox broker (checked below)")
    with RayEnvPool(
        str(CATALOGUE / name), replicas=2, placement="STRICT_SPREAD", resources_per_replica=HALF_A_CPU
    ) as pool:
        first, second = pool.replicas
        assert first.node_id != second.node_id
        here = GenericEnvClient(base_url=first.base_url, headers=pool.headers, message_timeout_s=120)
        there = GenericEnvClient(base_url=second.base_url, headers=pool.headers, message_timeout_s=120)
        try:
            await here.reset(**case.reset)
            await _play(here, case.prefix)
            snapshot = await here.snapshot()
            expected = _trace(await _play(here, case.following), case)
            final = await _final_state(case, here)
            await there.restore(snapshot)
            assert _trace(await _play(there, case.following), case) == expected
            assert await _final_state(case, there) == final
        finally:
            await here.close()
            await there.close()


async def test_repl_env_served_in_the_sandbox_refuses_snapshots_and_says_why(cluster):
    from openenv.core.client_errors import NotSupportedError
    from openenv.core.generic_client import GenericEnvClient

    with RayEnvPool(str(CATALOGUE / "repl_env"), replicas=1, resources_per_replica=HALF_A_CPU) as pool:
        env = GenericEnvClient(base_url=pool.replicas[0].base_url, headers=pool.headers)
        try:
            await env.reset(task_id="sum_numbers")
            await env.step({"code": "x = 1"})
            with pytest.raises(NotSupportedError, match="runs through the sandbox broker"):
                await env.snapshot()
            assert (await env.step({"code": "print(x + 1)"})).observation["result"]["stdout"].strip() == "2"
        finally:
            await env.close()
