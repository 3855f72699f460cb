"""The rollout graph: model calls linked by exact token prefix, and how an engine answer becomes a turn.

Covers ``openenv.core.harness.capture.graph`` (TurnNode, RolloutGraph, TrainingSequence),
``capture.ingest`` (node_from_exchange) and the engine-facing half of ``capture.upstream``
(prepare_request, normalize_response).
"""

from __future__ import annotations

import copy
import itertools
import json
import random
from typing import Any, Dict, List, Optional

import pytest

from openenv.core.harness.capture.graph import RolloutGraph, TurnNode
from openenv.core.harness.capture.ingest import node_from_exchange
from openenv.core.harness.capture.upstream import NON_POLICY_SAMPLING, normalize_response, prepare_request


def turn(node_id: str, prompt: List[int], sampled: List[int], logprobs: Optional[List[float]] = None) -> TurnNode:
    """A captured turn; logprobs default to one per sampled id."""
    if logprobs is None:
        logprobs = [-0.25] * len(sampled)
    return TurnNode(node_id=node_id, prompt_ids=list(prompt), sampled_ids=list(sampled), sampled_logprobs=logprobs)


def graph_of(*nodes: TurnNode) -> RolloutGraph:
    graph = RolloutGraph()
    for node in nodes:
        graph.add_turn(node)
    return graph


def parents(graph: RolloutGraph) -> Dict[str, Optional[str]]:
    return {node_id: node.parent_id for node_id, node in graph.nodes.items()}


# --- linking by token prefix ----------------------------------------------------------------------


def test_a_turn_whose_prompt_extends_an_earlier_answer_is_its_child() -> None:
    graph = graph_of(turn("a", [1, 2, 3], [4, 5]), turn("b", [1, 2, 3, 4, 5, 6, 7], [8]))
    assert parents(graph) == {"a": None, "b": "a"}
    assert graph.children("a") == [graph.get("b")]
    assert graph.get("b").context_ids(graph.get("a")) == [6, 7]


def test_the_longest_exact_prefix_is_the_parent() -> None:
    graph = graph_of(
        turn("short", [1], [2]),
        turn("long", [1, 2, 3], [4]),
        turn("child", [1, 2, 3, 4, 5], [6]),
    )
    assert graph.get("child").parent_id == "long"
    assert graph.get("long").parent_id == "short"


def test_a_prompt_that_differs_anywhere_in_the_prefix_is_not_linked() -> None:
    prompt = list(range(1000))
    changed = [*prompt, 7, 8, 9]
    changed[700] = -1  # one token differs, deep inside a hashed block
    graph = graph_of(turn("a", prompt, [5000]), turn("b", changed, [1]))
    assert parents(graph) == {"a": None, "b": None}


def test_identical_ends_go_to_the_earliest_turn() -> None:
    graph = graph_of(turn("first", [1, 2], [3]), turn("second", [1, 2], [3]), turn("child", [1, 2, 3, 4], [5]))
    assert graph.get("child").parent_id == "first"


def test_a_turn_with_the_same_prompt_is_a_sibling_not_a_child_even_when_nothing_was_sampled() -> None:
    graph = graph_of(turn("empty", [1, 2], []), turn("retry", [1, 2], [3]))
    assert parents(graph) == {"empty": None, "retry": None}


def test_a_late_ancestor_adopts_the_turns_it_prefixes() -> None:
    graph = graph_of(turn("c", [1, 2, 3, 4, 5], [6]), turn("a", [1], [2]), turn("b", [1, 2, 3], [4]))
    assert parents(graph) == {"c": "b", "a": None, "b": "a"}
    assert [n.node_id for n in graph.path_to("c")] == ["a", "b", "c"]


def _fork_rollout() -> List[TurnNode]:
    """a -> b -> (c, d); c -> e; plus an unrelated root x."""
    return [
        turn("a", [1, 2], [3]),
        turn("b", [1, 2, 3, 4], [5]),
        turn("c", [1, 2, 3, 4, 5, 6], [7]),
        turn("d", [1, 2, 3, 4, 5, 9], [10]),
        turn("e", [1, 2, 3, 4, 5, 6, 7, 8], [11]),
        turn("x", [50, 51], [52]),
    ]


def test_arrival_order_does_not_change_the_graph() -> None:
    expected = parents(graph_of(*_fork_rollout()))
    assert expected == {"a": None, "b": "a", "c": "b", "d": "b", "e": "c", "x": None}
    for order in itertools.permutations(range(6)):
        nodes = _fork_rollout()
        assert parents(graph_of(*(nodes[i] for i in order))) == expected, order


def _reference_parents(nodes: List[TurnNode]) -> Dict[str, Optional[str]]:
    """The rule written plainly: the longest end that prefixes the prompt, earliest on ties."""
    result: Dict[str, Optional[str]] = {}
    for child in nodes:
        best: Optional[TurnNode] = None
        for candidate in nodes:  # arrival order, so the first of equal length wins
            end = candidate.end_ids
            if len(candidate.prompt_ids) < len(child.prompt_ids) and child.prompt_ids[: len(end)] == end:
                if len(end) <= len(child.prompt_ids) and (best is None or len(end) > len(best.end_ids)):
                    best = candidate
        result[child.node_id] = best.node_id if best else None
    return result


@pytest.mark.parametrize("seed", range(20))
def test_random_branching_rollouts_match_the_plain_rule(seed: int) -> None:
    rng = random.Random(seed)
    nodes: List[TurnNode] = []
    for i in range(40):
        if nodes and rng.random() < 0.85:
            base = rng.choice(nodes)
            prompt = base.end_ids + [rng.randrange(4) for _ in range(rng.randrange(0, 300))]
            if rng.random() < 0.2:  # a retry of an existing prompt
                prompt = list(base.prompt_ids)
        else:
            prompt = [rng.randrange(4) for _ in range(rng.randrange(1, 600))]
        sampled = [rng.randrange(4) for _ in range(rng.randrange(0, 300))]
        nodes.append(turn(f"n{i}", prompt, sampled))
    rng.shuffle(nodes)
    assert parents(graph_of(*nodes)) == _reference_parents(nodes)


def test_children_are_listed_in_arrival_order_after_re_parenting() -> None:
    graph = graph_of(turn("d", [1, 2, 3, 9], [1]), turn("c", [1, 2, 3, 6], [1]), turn("a", [1, 2], [3]))
    assert [n.node_id for n in graph.children("a")] == ["d", "c"]


def test_forks_leaves_roots_and_paths() -> None:
    graph = graph_of(*_fork_rollout())
    assert [n.node_id for n in graph.forks()] == ["b"]
    assert [n.node_id for n in graph.roots()] == ["a", "x"]
    assert [n.node_id for n in graph.leaves()] == ["d", "e", "x"]
    assert [[n.node_id for n in path] for path in graph.paths()] == [["a", "b", "d"], ["a", "b", "c", "e"], ["x"]]
    assert graph.root_of("e").node_id == "a"


def test_a_childless_sibling_of_a_continued_turn_is_discarded() -> None:
    graph = graph_of(*_fork_rollout())
    assert [n.node_id for n in graph.discarded_nodes()] == ["d"]
    assert graph.stats() == {"n_turns": 6, "n_roots": 2, "n_leaves": 3, "n_forks": 1, "n_discarded": 1}


def test_roots_with_identical_prompts_are_siblings() -> None:
    graph = graph_of(turn("try1", [1, 2], [3]), turn("try2", [1, 2], [4]), turn("next", [1, 2, 4, 5], [6]))
    assert [n.node_id for n in graph.discarded_nodes()] == ["try1"]


def test_a_fork_whose_branches_all_stop_discards_nothing() -> None:
    graph = graph_of(turn("a", [1], [2]), turn("b", [1, 2, 3], [4]), turn("c", [1, 2, 5], [6]))
    assert [n.node_id for n in graph.forks()] == ["a"]
    assert graph.discarded_nodes() == []


def test_a_node_id_can_be_added_once() -> None:
    graph = graph_of(turn("a", [1], [2]))
    with pytest.raises(ValueError, match="already"):
        graph.add_turn(turn("a", [1], [2]))


# --- linking by messages (no token ids) -----------------------------------------------------------


def message_turn(node_id: str, messages: List[Dict[str, Any]], answer: Dict[str, Any]) -> TurnNode:
    return TurnNode(node_id=node_id, prompt_ids=[], sampled_ids=[], request_messages=messages, response_message=answer)


def test_without_token_ids_turns_link_by_messages() -> None:
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": '{"path": ".", "all": true}'}}
    ]}  # fmt: skip
    echoed = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "other-id", "type": "function", "function": {"name": "ls", "arguments": '{"all":true,"path":"."}'}}
    ]}  # fmt: skip
    first = message_turn("a", [{"role": "system", "content": "v1"}, {"role": "user", "content": "hi"}], call)
    second = message_turn(
        "b",
        [
            {"role": "system", "content": "v2: rewritten"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            echoed,
            {"role": "tool", "tool_call_id": "other-id", "content": "a.txt"},
        ],
        {"role": "assistant", "content": "done"},
    )
    other = message_turn("c", [{"role": "user", "content": "something else"}], {"role": "assistant", "content": "?"})
    graph = graph_of(second, other, first)  # out of order on purpose
    assert parents(graph) == {"b": "a", "c": None, "a": None}


def test_a_changed_tool_argument_breaks_the_message_link() -> None:
    ask = {"role": "user", "content": "hi"}
    answer = {"role": "assistant", "tool_calls": [{"function": {"name": "ls", "arguments": '{"path": "."}'}}]}
    edited = {"role": "assistant", "tool_calls": [{"function": {"name": "ls", "arguments": '{"path": "/"}'}}]}
    graph = graph_of(message_turn("a", [ask], answer), message_turn("b", [ask, edited], {"role": "assistant"}))
    assert graph.get("b").parent_id is None


# --- training sequences ---------------------------------------------------------------------------


def test_a_sequence_trains_exactly_on_the_sampled_tokens() -> None:
    graph = graph_of(
        turn("a", [1, 2, 3], [4, 5], [-0.1, -0.2]),
        turn("b", [1, 2, 3, 4, 5, 6], [7], [-0.3]),
        turn("c", [1, 2, 3, 4, 5, 6, 7, 8, 9], [10, 11], [-0.4, -0.5]),
    )
    sequence = graph.sequence_for("c")
    assert sequence.input_ids == graph.get("c").end_ids
    assert sequence.loss_mask == [0, 0, 0, 1, 1, 0, 1, 0, 0, 1, 1]
    assert sequence.logprobs == [0.0, 0.0, 0.0, -0.1, -0.2, 0.0, -0.3, 0.0, 0.0, -0.4, -0.5]
    assert (sequence.node_ids, sequence.root_id, sequence.n_turns, sequence.prompt_len) == (["a", "b", "c"], "a", 3, 3)
    assert sequence.turn_lengths == [2, 1, 2]
    assert sequence.n_trainable == 5


def test_a_turn_without_usable_logprobs_is_context_in_its_sequence() -> None:
    graph = graph_of(turn("a", [1], [2, 3], None), turn("b", [1, 2, 3, 4], [5], [-1.0]))
    graph.get("a").sampled_logprobs = None
    sequence = graph.sequence_for("b")
    assert sequence.loss_mask == [0, 0, 0, 0, 1]
    assert sequence.logprobs == [0.0, 0.0, 0.0, 0.0, -1.0]


def test_sequences_has_one_row_per_leaf() -> None:
    graph = graph_of(*_fork_rollout())
    assert [s.node_ids for s in graph.sequences()] == [["a", "b", "d"], ["a", "b", "c", "e"], ["x"]]


# --- JSON round trip (the journal) ----------------------------------------------------------------


def full_node() -> TurnNode:
    return TurnNode(
        node_id="n00001-ab",
        prompt_ids=[1, 2, 3],
        sampled_ids=[4],
        sampled_logprobs=[-0.5],
        parent_id=None,
        index=1,
        model="tiny",
        finish_reason="tool_calls",
        harness_session_id="h-1",
        system_digest="abc",
        n_tools=1,
        request_messages=[{"role": "user", "content": "hi"}],
        request_tools=[{"type": "function", "function": {"name": "ls", "parameters": {}}}],
        sampling_params={"temperature": 1.0},
        requested_sampling_params={"temperature": 0.7},
        response_message={"role": "assistant", "content": "x"},
    )


def test_a_turn_node_round_trips_through_json() -> None:
    node = full_node()
    assert TurnNode.from_dict(json.loads(json.dumps(node.to_dict()))) == node


def test_a_turn_node_record_with_unknown_or_missing_fields_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown TurnNode fields: extra"):
        TurnNode.from_dict({**full_node().to_dict(), "extra": 1})
    record = full_node().to_dict()
    del record["prompt_ids"]
    with pytest.raises(ValueError, match="prompt_ids"):
        TurnNode.from_dict(record)


def test_a_graph_rebuilt_from_journalled_nodes_is_the_same_graph() -> None:
    nodes = _fork_rollout()
    random.Random(3).shuffle(nodes)
    original = graph_of(*nodes)
    journal = [json.dumps(n.to_dict()) for n in nodes]
    rebuilt = graph_of(*(TurnNode.from_dict(json.loads(line)) for line in journal))
    assert parents(rebuilt) == parents(original)


# --- from an engine answer to a turn --------------------------------------------------------------

CHAT_REQUEST = {
    "model": "tiny",
    "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "list files"}],
    "tools": [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}],
}


def vllm_answer(prompt: List[int], sampled: List[int], logprobs: List[float], **choice: Any) -> Dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "model": "tiny",
        "prompt_token_ids": prompt,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop",
                "token_ids": sampled,
                "logprobs": {"content": [{"token": "x", "logprob": lp, "top_logprobs": []} for lp in logprobs]},
                **choice,
            }
        ],
    }


def ingest(
    answer: Dict[str, Any], level: str = "tokens", node_id: str = "n1", graph: Optional[RolloutGraph] = None
) -> Any:
    return node_from_exchange(
        CHAT_REQUEST,
        normalize_response(answer),
        node_id=node_id,
        capture_level=level,
        harness_session_id="h-7",
        requested_sampling={"temperature": 0.7},
        sampling={"temperature": 1.0},
        graph=graph,
    )


def test_an_engine_answer_becomes_a_turn() -> None:
    node, findings = ingest(vllm_answer([5, 6, 7], [8, 9], [-0.1, -0.2]))
    assert findings == []
    assert (node.prompt_ids, node.sampled_ids, node.sampled_logprobs) == ([5, 6, 7], [8, 9], [-0.1, -0.2])
    assert (node.model, node.finish_reason, node.harness_session_id, node.n_tools) == ("tiny", "stop", "h-7", 1)
    assert node.request_messages == CHAT_REQUEST["messages"]
    assert node.response_message == {"role": "assistant", "content": "ok"}
    assert (node.sampling_params, node.requested_sampling_params) == ({"temperature": 1.0}, {"temperature": 0.7})
    assert node.system_digest is not None
    assert json.loads(json.dumps(node.to_dict()))["node_id"] == "n1"


def test_a_turn_repeating_the_latest_turns_ids_takes_them_over_and_checks_only_the_rest() -> None:
    """The proxy's next call repeats the rollout so far: those ids are the earlier turn's own
    objects afterwards (ids over 256 decoded from JSON are distinct objects unless shared), and an
    invalid id after them is still found, named by its place in the whole prompt."""

    def wire(answer: Dict[str, Any]) -> Dict[str, Any]:
        return json.loads(json.dumps(answer))  # fresh id objects, as each engine answer has

    graph = RolloutGraph()
    first, _ = ingest(wire(vllm_answer([1000, 1001, 1002], [2000, 2001], [-0.1, -0.2])), node_id="a", graph=graph)
    graph.add_turn(first)
    prompt = [1000, 1001, 1002, 2000, 2001, 3000]
    second, findings = ingest(wire(vllm_answer(prompt, [4000], [-0.3])), node_id="b", graph=graph)
    assert findings == [] and second.prompt_ids == prompt
    assert all(x is y for x, y in zip(second.prompt_ids[:5], first.end_ids, strict=True))
    assert graph.add_turn(second).parent_id == "a"
    unshared, _ = ingest(wire(vllm_answer(prompt, [4000], [-0.3])), node_id="u")  # no graph: its own objects
    assert not any(x is y for x, y in zip(unshared.prompt_ids[:5], first.end_ids, strict=True))
    third, findings = ingest(vllm_answer([*second.end_ids, -1], [5], [-0.1]), node_id="c", graph=graph)
    assert [(f.code, "prompt id at 7 is -1" in f.detail) for f in findings] == [("invalid_token_id", True)]
    assert third.prompt_ids == []  # not kept, as without a graph
    # a prompt that differs inside the earlier ids takes nothing over and is checked whole
    _, findings = ingest(vllm_answer([1000, True, 1002, 2000, 2001, 4000, 4001], [6], [-0.1]), graph=graph)
    assert "invalid_token_id" in [f.code for f in findings]


def test_sglang_prompt_ids_on_the_choice_are_read_too() -> None:
    answer = vllm_answer([], [8], [-0.1], prompt_token_ids=[5, 6])
    del answer["prompt_token_ids"]
    node, findings = ingest(answer)
    assert findings == [] and node.prompt_ids == [5, 6]


def test_misaligned_logprobs_are_rejected_at_ingest_and_the_turn_kept_as_context() -> None:
    node, findings = ingest(vllm_answer([5, 6, 7], [8, 9], [-0.1]))
    assert [(f.level, f.code) for f in findings] == [("FATAL", "logprob_misalign")]
    assert str(findings[0]).startswith("[FATAL] logprob_misalign: turn n1")
    assert node is not None and node.sampled_logprobs is None
    graph = graph_of(node, turn("next", [5, 6, 7, 8, 9, 10], [11], [-0.3]))
    assert graph.get("next").parent_id == "n1"
    assert graph.sequence_for("next").loss_mask == [0, 0, 0, 0, 0, 0, 1]


@pytest.mark.parametrize(
    ("answer", "code"),
    [
        (vllm_answer([5], [8], [0.5]), "positive_logprob"),
        (vllm_answer([5], [8], [float("nan")]), "invalid_logprob"),
        (vllm_answer([], [8], [-0.1]), "no_prompt_ids"),
        (vllm_answer([5, True], [8], [-0.1]), "invalid_token_id"),
        (
            {**vllm_answer([5], [8], [-0.1]), "choices": [{"message": {}, "token_ids": [8], "logprobs": None}]},
            "no_logprobs",
        ),
    ],
)
def test_untrainable_turns_are_fatal_at_level_tokens(answer: Dict[str, Any], code: str) -> None:
    node, findings = ingest(answer)
    assert code in [f.code for f in findings if f.level == "FATAL"]
    assert node is not None and node.sampled_logprobs is None


def test_invalid_token_ids_are_not_kept_even_as_context() -> None:
    node, _ = ingest(vllm_answer([5, "6"], [8], [-0.1]))
    assert (node.prompt_ids, node.sampled_ids) == ([], [])


def test_a_truncated_turn_is_a_warning() -> None:
    node, findings = ingest(vllm_answer([5], [8], [-0.1], finish_reason="length"))
    assert [(f.level, f.code) for f in findings] == [("WARN", "truncated_turn")]
    assert node.sampled_logprobs == [-0.1]


def test_below_level_tokens_missing_ids_are_expected() -> None:
    answer = {"model": "m", "choices": [{"message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}
    node, findings = ingest(answer, level="text")
    assert findings == [] and node.prompt_ids == [] and node.sampled_logprobs is None


def test_an_answer_without_choices_is_not_a_turn() -> None:
    node, findings = ingest({"model": "m", "choices": []})
    assert node is None and [(f.level, f.code) for f in findings] == [("WARN", "no_choices")]


def test_ingest_never_raises() -> None:
    node, findings = node_from_exchange(
        CHAT_REQUEST, None, node_id="n9", capture_level="tokens",  # type: ignore[arg-type]
        harness_session_id=None, requested_sampling={}, sampling={},
    )  # fmt: skip
    assert node is None and [(f.level, f.code) for f in findings] == [("FATAL", "capture_ingest_failed")]


# --- the engine request and answer ----------------------------------------------------------------


def test_level_tokens_asks_for_ids_and_logprobs_and_neutralises_truncation() -> None:
    request = {
        "model": "m",
        "messages": [{"role": "assistant", "content": "a", "reasoning_content": "thought"}],
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 0,
        "min_p": 0.05,
    }
    before = copy.deepcopy(request)
    engine, overridden = prepare_request(request, capture_level="tokens")
    assert request == before  # the caller's request is untouched
    assert engine["logprobs"] is True and engine["return_token_ids"] is True and engine["top_logprobs"] == 0
    assert {k: engine[k] for k in NON_POLICY_SAMPLING} == NON_POLICY_SAMPLING
    assert engine["temperature"] == 0.7  # the policy's own knob is the agent's to set
    assert overridden == {"top_p": 0.9, "min_p": 0.05}  # top_k 0 is already neutral
    assert engine["messages"] == [{"role": "assistant", "content": "a", "reasoning": "thought"}]


def test_level_logprobs_and_text_add_only_what_they_can_use() -> None:
    request = {"messages": [{"role": "assistant", "content": "a", "reasoning_content": "t"}], "top_p": 0.9}
    engine, overridden = prepare_request(request, capture_level="logprobs")
    assert (engine["logprobs"], engine["top_logprobs"], engine["top_p"], overridden) == (True, 0, 0.9, {})
    assert "return_token_ids" not in engine
    engine, _ = prepare_request({**request, "top_logprobs": 3}, capture_level="text")
    assert "logprobs" not in engine and engine["top_logprobs"] == 3
    assert engine["messages"] == [{"role": "assistant", "content": "a"}]


def test_a_training_policy_overwrites_the_knobs_and_refuses_constraints() -> None:
    policy = {"temperature": 1.0, **NON_POLICY_SAMPLING}
    engine, overridden = prepare_request({"messages": [], "temperature": 0.2}, capture_level="tokens", policy=policy)
    assert engine["temperature"] == 1.0 and overridden == {"temperature": 0.2}
    for field, value in [("logit_bias", {"5": 10}), ("guided_regex", "a+"), ("tool_choice", "required"),
                         ("response_format", {"type": "json_object"}), ("min_tokens", 4)]:  # fmt: skip
        with pytest.raises(ValueError, match=f"training policy over the full vocabulary; {field}"):
            prepare_request({"messages": [], field: value}, capture_level="tokens", policy=policy)
    with pytest.raises(ValueError, match="capture level tokens"):
        prepare_request({"messages": []}, capture_level="logprobs", policy=policy)


def test_eval_sampling_pinned_by_the_session_survives_level_tokens() -> None:
    engine, overridden = prepare_request(
        {"messages": [], "top_p": 0.5}, capture_level="tokens", eval_sampling={"temperature": 0.0, "top_p": 0.95}
    )
    assert (engine["temperature"], engine["top_p"], engine["min_p"]) == (0.0, 0.95, 0.0)
    assert overridden == {"top_p": 0.5}


def test_normalize_response_gives_logprob_entries_their_ids_and_renames_reasoning() -> None:
    answer = vllm_answer([1], [8, 9], [-0.1, -0.2])
    answer["choices"][0]["message"]["reasoning"] = "because"
    answer["choices"][0]["logprobs"]["content"][1]["token"] = "token_id:9"
    before = copy.deepcopy(answer)
    normal = normalize_response(answer)
    assert answer == before
    choice = normal["choices"][0]
    assert [e["token_id"] for e in choice["logprobs"]["content"]] == [8, 9]
    assert choice["message"] == {"role": "assistant", "content": "ok", "reasoning_content": "because"}


def test_a_logprob_entry_naming_another_token_drops_the_choices_logprobs() -> None:
    answer = vllm_answer([1], [8, 9], [-0.1, -0.2])
    answer["choices"][0]["logprobs"]["content"][0]["token"] = "token_id:77"
    assert normalize_response(answer)["choices"][0]["logprobs"] is None
    answer["choices"][0]["logprobs"]["content"][0]["token"] = "token_id:008"  # the same id, written oddly
    assert normalize_response(answer)["choices"][0]["logprobs"] is not None


def test_normalize_response_without_copying_gives_the_same_answer_in_place() -> None:
    answer = vllm_answer([1], [8, 9], [-0.1, -0.2])
    expected = normalize_response(answer)
    entries = answer["choices"][0]["logprobs"]["content"]
    assert normalize_response(answer, copy=False) == expected
    assert [e["token_id"] for e in entries] == [8, 9]  # the caller's own entries now carry them
