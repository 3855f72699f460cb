"""Roles in a RayEnvPool, on a real Ray cluster of two nodes on this machine (ray.cluster_utils.Cluster;
every node on 127.0.0.1, set before Ray starts and checked).

The pool hands every replica its three role tokens (``pool.token``, ``pool.grader_token``,
``pool.observer_token``); each replica decides by the table of docs/roles.md (roles_matrix.TABLE,
written out independently of the server's): each credential x reset, step, tools/list, the agent's
tool, the grader's tool, grade and snapshot, on each replica. An agent credential is minted by the
replica holding its session and works there alone: the other replica refuses it.

The replicas serve in their actors' processes (``sandbox=False``): the table is the server's,
sandboxed or not (tests/test_ray_pool.py covers sandboxed replicas), and so they run the framework
this test imports (a sandboxed server imports the installed one).
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterator, List, Tuple

import httpx
import pytest

# Loopback only: Ray reads this when it is imported (later is too late); checked on every node below.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'openenv[ray]')")

from ray.cluster_utils import Cluster  # noqa: E402

from openenv.ray import RayEnvPool  # noqa: E402

from .roles_matrix import (  # noqa: E402
    OK,
    QUIZ,
    UNAUTHORIZED,
    WHO,
    WRONG,
    Matrix,
    bearer,
    outcome,
    rpc_body,
)

ANSWER = "42"  # the quiz's answer (tests/fixtures/roles_quiz_env)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    try:
        ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
        cluster.wait_for_nodes()
        nodes = [node for node in ray.nodes() if node["Alive"]]
        assert len(nodes) == 2
        for node in nodes:
            assert node["NodeManagerAddress"] == "127.0.0.1"
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def pool(cluster: Any) -> Iterator[RayEnvPool]:
    with RayEnvPool(
        str(QUIZ), replicas=2, placement="STRICT_SPREAD", resources_per_replica={"CPU": 0.5}, sandbox=False
    ) as pool:
        yield pool


def rpc(http: httpx.Client, headers: Dict[str, str], method: str, **params: Any) -> httpx.Response:
    return http.post("/mcp", json=rpc_body(method, **params), headers=headers)


def replica_credentials(pool: RayEnvPool, http: httpx.Client) -> Tuple[str, Dict[str, Any]]:
    """Sessions A, B and C (closed) on the replica ``http`` reaches; every credential, as tokens."""
    boss = pool.headers

    def create() -> str:
        return rpc(http, boss, "openenv/session/create").json()["result"]["session_id"]

    def mint(session_id: str) -> str:
        return http.post("/openenv/agent_token", json={"session_id": session_id}, headers=boss).json()["token"]

    a, b, c = create(), create(), create()
    stale = mint(c)
    assert rpc(http, boss, "openenv/session/close", session_id=c).json()["result"]
    tokens = {
        "orchestrator": pool.token,
        "grader": pool.grader_token,
        "observer": pool.observer_token,
        "agent": mint(a),
        "other_agent": mint(b),
        "stale_agent": stale,
        "none": None,
        "wrong": WRONG,
    }
    return a, tokens


def check_replica(pool: RayEnvPool, http: httpx.Client, matrix: Matrix, name: str) -> str:
    """Each credential x each operation on session A of the replica ``http`` reaches, into
    ``matrix``; returns that replica's agent credential (of A)."""
    a, tokens = replica_credentials(pool, http)
    guess = {"type": "call_tool", "tool_name": "guess", "arguments": {"value": "1"}}
    cells: Dict[str, Any] = {
        "POST /reset": ("reset", lambda h: http.post("/reset", json={"session_id": a}, headers=h)),
        "POST /step": ("step", lambda h: http.post("/step", json={"session_id": a, "action": guess}, headers=h)),
        "tools/list": ("tools/list", lambda h: rpc(http, h, "tools/list", session_id=a)),
        "tools/call guess": (
            "call agent tool",
            lambda h: rpc(http, h, "tools/call", session_id=a, name="guess", arguments={"value": "2"}),
        ),
        "tools/call check": (
            "call grader tool",
            lambda h: rpc(http, h, "tools/call", session_id=a, name="check", arguments={}),
        ),
        "POST /openenv/grade": ("grade", lambda h: http.post("/openenv/grade", json={"session_id": a}, headers=h)),
        "POST /openenv/snapshot": (
            "snapshot",
            lambda h: http.post("/openenv/snapshot", json={"session_id": a}, headers=h),
        ),
    }
    for label, (row, call) in cells.items():
        for who in WHO:
            matrix.check(f"{name}: {label}", row, who, outcome(call(bearer(tokens[who])), who))
    return tokens["agent"]


def test_every_replica_enforces_the_table_and_an_agent_credential_works_on_its_own_replica_alone(
    pool: RayEnvPool,
) -> None:
    urls = [replica.base_url for replica in pool.replicas]
    assert len(urls) == 2 and all(url and url.startswith("http://127.0.0.1:") for url in urls), urls
    assert len({replica.node_id for replica in pool.replicas}) == 2  # one replica on each node
    matrix = Matrix("ray")
    agents: List[str] = []
    for index, url in enumerate(urls):
        with httpx.Client(base_url=url, timeout=30) as http:
            agents.append(check_replica(pool, http, matrix, f"replica {index}"))
    print(matrix.report())
    assert not matrix.wrong, "\n".join(map(str, matrix.wrong))
    assert matrix.cells == 2 * 7 * len(WHO)

    # each replica's agent credential, on the other replica: an unknown token there
    crossed = []
    for index, token in enumerate(agents):
        session = token.split(".")[1]  # (oe-agent.<session>.<expiry>.<nonce>.<mac>)
        with httpx.Client(base_url=urls[1 - index], timeout=30) as http:
            agent = bearer(token)
            crossed += [
                outcome(rpc(http, agent, "tools/list")),
                outcome(rpc(http, agent, "tools/call", name="guess", arguments={"value": "3"})),
                outcome(rpc(http, {**agent, "Mcp-Session-Id": session}, "tools/list")),
            ]
    assert crossed == [UNAUTHORIZED] * 6, crossed


async def test_the_orchestrator_hands_its_agent_a_credential_and_the_replica_that_holds_its_session(
    pool: RayEnvPool,
) -> None:
    """The shape a trainer writes: a pool client plays the episode; its session's agent credential
    and that client's ``base_url`` go to the agent's harness; the grader checks the episode with
    the pool's grader token; the observer sees capacity and nothing else."""
    async with pool.client() as env:
        await env.reset()
        credential = await env.agent_token()
        url = env.base_url
        other = next(replica.base_url for replica in pool.replicas if replica.base_url != url)
        agent = bearer(credential["token"])
        async with httpx.AsyncClient(base_url=url, headers=agent, timeout=30) as http:
            init = await http.post("/mcp", json=rpc_body("initialize"))
            assert init.headers["mcp-session-id"] == credential["session_id"]
            listed = (await http.post("/mcp", json=rpc_body("tools/list"))).json()["result"]["tools"]
            assert [tool["name"] for tool in listed] == ["guess"]
            guessed = await http.post("/mcp", json=rpc_body("tools/call", name="guess", arguments={"value": ANSWER}))
            assert outcome(guessed, "agent") == OK, guessed.text
            refused = await http.post("/reset", json={"session_id": credential["session_id"]})
            assert outcome(refused, "agent") == "403"
        async with httpx.AsyncClient(base_url=other, headers=agent, timeout=30) as elsewhere:
            assert outcome(await elsewhere.post("/mcp", json=rpc_body("tools/list"))) == UNAUTHORIZED
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            grader = bearer(pool.grader_token)
            checked = await http.post(
                "/mcp",
                json=rpc_body("tools/call", session_id=credential["session_id"], name="check", arguments={}),
                headers=grader,
            )
            assert checked.json()["result"]["structuredContent"] == {"correct": True, "answer": ANSWER}
            observer = bearer(pool.observer_token)
            assert (await http.get("/openenv/capacity", headers=observer)).json()["active_sessions"] >= 1
            assert outcome(await http.post("/reset", json={}, headers=observer)) == "403"
