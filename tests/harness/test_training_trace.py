"""What a trainer gets: the strict TrainingTrace contract, the sampling policies, and the exports
of a captured rollout (``openenv.core.harness.training``, ``capture.upstream``, ``capture.export``)."""

from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
from pydantic import ValidationError

from openenv.core.harness.capture.export import (
    export_session,
    measure_retokenization_skew,
    to_trace_entries,
    to_training_trace,
    to_turn_records,
)
from openenv.core.harness.capture.graph import RolloutGraph, TurnNode
from openenv.core.harness.capture.ingest import node_from_exchange
from openenv.core.harness.capture.upstream import (
    NON_POLICY_SAMPLING,
    evaluation_sampling,
    rollout_type_for,
    training_sampling,
)
from openenv.core.harness.capture.validate import Finding
from openenv.core.harness.training import TrainingTrace, TrainingTurn, validate_training_turn

ROOT = Path(__file__).resolve().parents[2]


def turn_fields(**changes: Any) -> Dict[str, Any]:
    fields = {
        "node_id": "n1",
        "prompt_token_ids": [1, 2, 3],
        "completion_token_ids": [4, 5],
        "per_token_logps": [-0.5, -1.25],
        "loss_mask": [0, 0, 0, 1, 1],
    }
    fields.update(changes)
    return fields


# --- TrainingTurn / TrainingTrace -----------------------------------------------------------------


def test_a_valid_turn_is_accepted() -> None:
    turn = TrainingTurn(**turn_fields(per_token_logps=[0, -1]))  # ints are fine as logprobs
    assert turn.per_token_logps == [0.0, -1.0] and turn.request == {} and turn.metadata == {}


def test_partial_completion_masks_and_empty_completions_are_accepted() -> None:
    TrainingTurn(**turn_fields(loss_mask=[0, 0, 0, 1, 0]))
    TrainingTurn(**turn_fields(completion_token_ids=[], per_token_logps=[], loss_mask=[0, 0, 0]))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"prompt_token_ids": [1, True, 3]}, "int"),
        ({"loss_mask": [0, 0, 0, True, 1]}, "int"),
        ({"per_token_logps": [-0.5, False]}, "float"),
        ({"prompt_token_ids": (1, 2, 3)}, "list"),
        ({"per_token_logps": [-0.5, 0.25]}, "positive_logprob"),
        ({"per_token_logps": [-0.5, math.nan]}, "invalid_logprob"),
        ({"per_token_logps": [-0.5, -math.inf]}, "invalid_logprob"),
        ({"per_token_logps": [-0.5]}, "logprob_misalign"),
        ({"loss_mask": [1, 0, 0, 1, 1]}, "mask_over_prompt"),
        ({"loss_mask": [0, 0, 0, 1]}, "invalid_loss_mask"),
        ({"loss_mask": [0, 0, 0, 2, 1]}, "invalid_loss_mask"),
        ({"prompt_token_ids": [], "loss_mask": [1, 1]}, "no_prompt_ids"),
        ({"completion_token_ids": [4, -5]}, "invalid_token_id"),
        ({"node_id": ""}, "at least 1 character"),
        ({"reward": 1.0}, "Extra inputs are not permitted"),
    ],
)
def test_an_untrainable_turn_is_refused(changes: Dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        TrainingTurn(**turn_fields(**changes))


def test_validate_training_turn_names_every_problem() -> None:
    with pytest.raises(ValueError) as refused:
        validate_training_turn([1], [2, 3], [0.5], [1, 1, 1])
    text = str(refused.value)
    assert text.startswith("invalid training turn: ")
    assert all(code in text for code in ("positive_logprob", "logprob_misalign", "mask_over_prompt"))


def test_a_trace_refuses_duplicate_turns_and_other_schema_versions() -> None:
    turn = turn_fields()
    with pytest.raises(ValidationError, match="duplicate node_id 'n1'"):
        TrainingTrace(turns=[turn, turn])
    with pytest.raises(ValidationError, match="literal"):
        TrainingTrace(schema_version=2, turns=[])


def test_a_trace_round_trips_through_trace_entries() -> None:
    trace = TrainingTrace(turns=[turn_fields(metadata={"model": "tiny"}), turn_fields(node_id="n2")])
    entries = trace.to_trace_entries()
    assert entries[0]["metadata"] == {"node_id": "n1", "model": "tiny"}
    assert "node_id" not in entries[0] and entries[0]["loss_mask"] == [0, 0, 0, 1, 1]
    assert TrainingTrace.from_entries(entries) == trace
    assert TrainingTrace.model_validate_json(trace.model_dump_json()) == trace


def test_an_entry_needs_its_node_id_and_keeps_its_reward() -> None:
    entry = TrainingTrace(turns=[turn_fields()]).to_trace_entries()[0]
    entry["reward"] = 0.5
    assert TrainingTrace.from_entries([entry]).to_trace_entries()[0]["reward"] == 0.5
    del entry["metadata"]["node_id"]
    with pytest.raises(ValueError, match=r"trace entry 0 has no metadata\['node_id'\]"):
        TrainingTrace.from_entries([entry])


# --- sampling policies ----------------------------------------------------------------------------

TRL_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": None, "repetition_penalty": 1.0}


@pytest.mark.parametrize(
    "sampling",
    [TRL_DEFAULTS, {**TRL_DEFAULTS, "top_k": -1, "min_p": 0.0}, {"temperature": 0.7}, {"temperature": 2}],
)
def test_training_sampling_accepts_a_full_vocabulary_policy(sampling: Dict[str, Any]) -> None:
    policy = training_sampling(sampling)
    assert policy == {"temperature": float(sampling["temperature"]), **NON_POLICY_SAMPLING}
    assert type(policy["temperature"]) is float


def test_no_training_sampling_is_no_policy() -> None:
    assert training_sampling() == {} and training_sampling(None) == {}


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        ({**TRL_DEFAULTS, "top_p": 0.9}, "training sampling requires top_p=1.0"),
        ({**TRL_DEFAULTS, "top_k": 50}, "training sampling requires top_k=-1"),
        ({**TRL_DEFAULTS, "min_p": 0.1}, "training sampling requires min_p=0.0"),
        ({**TRL_DEFAULTS, "repetition_penalty": 1.1}, "training sampling requires repetition_penalty=1.0"),
        ({**TRL_DEFAULTS, "presence_penalty": 0.5}, "training sampling requires presence_penalty=0.0"),
        ({**TRL_DEFAULTS, "top_p": "1.0"}, "training sampling requires top_p=1.0"),
        ({**TRL_DEFAULTS, "seed": 3}, "unsupported training sampling fields: seed"),
        ({"temperature": 0}, "finite temperature > 0"),
        ({"temperature": -1.0}, "finite temperature > 0"),
        ({"temperature": math.inf}, "finite temperature > 0"),
        ({"temperature": True}, "finite temperature > 0"),
        ({"top_p": 1.0}, "finite temperature > 0"),
        ([("temperature", 1.0)], "must be a dict"),
    ],
)
def test_training_sampling_refuses_anything_else(sampling: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        training_sampling(sampling)


def test_evaluation_sampling_bounds() -> None:
    assert evaluation_sampling({"temperature": 0, "top_p": 1, "top_k": 20}) == {
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 20,
    }
    for bad in ({"temperature": 2.5}, {"top_p": 0}, {"top_k": 0}, {"top_k": 1.5}, {"min_p": 0.1}):
        with pytest.raises(ValueError, match="eval sampling"):
            evaluation_sampling(bad)


def test_rollout_type_follows_purpose_and_level() -> None:
    assert rollout_type_for("auto", "tokens") == "train"
    assert rollout_type_for("train", "tokens") == "train"
    assert rollout_type_for("eval", "tokens") == "eval"
    assert rollout_type_for("auto", "logprobs") == "eval"
    with pytest.raises(ValueError, match="needs capture level tokens"):
        rollout_type_for("train", "text")
    with pytest.raises(ValueError, match="purpose"):
        rollout_type_for("grade", "tokens")


# --- exporting a captured rollout -----------------------------------------------------------------


@dataclass
class Session:
    """The fields of a capture session that ``export_session`` reads."""

    graph: RolloutGraph = field(default_factory=RolloutGraph)
    session_id: str = "rollout-1"
    metadata: Dict[str, Any] = field(default_factory=lambda: {"task": "t1"})
    budget_stop_count: int = 0
    capture_level: str = "tokens"
    rollout_type: str = "train"
    findings: List[Finding] = field(default_factory=list)

    def add(self, node: Optional[TurnNode], findings: List[Finding]) -> None:
        assert node is not None
        node.index = len(self.graph)
        self.graph.add_turn(node)
        self.findings.extend(findings)


def exchange(session: Session, node_id: str, prompt: List[int], sampled: List[int], logprobs: List[float],
             *, tools: bool = True, messages: Optional[List[Dict[str, Any]]] = None) -> None:  # fmt: skip
    """One engine call as the proxy ingests it."""
    request: Dict[str, Any] = {"messages": messages or [{"role": "user", "content": node_id}]}
    if tools:
        request["tools"] = [{"type": "function", "function": {"name": "ls", "parameters": {}}}]
    answer = {
        "model": "tiny",
        "prompt_token_ids": prompt,
        "choices": [
            {
                "message": {"role": "assistant", "content": f"answer {node_id}"},
                "finish_reason": "stop",
                "token_ids": sampled,
                "logprobs": {"content": [{"token": "x", "logprob": lp} for lp in logprobs]},
            }
        ],
    }
    session.add(
        *node_from_exchange(
            request,
            answer,
            node_id=node_id,
            capture_level=session.capture_level,
            harness_session_id=None,
            requested_sampling={},
            sampling={"temperature": 1.0},
        )
    )


def agent_rollout() -> Session:
    """Two agent turns, a retried-away answer, and a tool-less side call (a title)."""
    session = Session()
    exchange(session, "a", [1, 2, 3], [4, 5], [-0.1, -0.2])
    exchange(session, "a-retry", [1, 2, 3], [9], [-0.9])
    exchange(session, "b", [1, 2, 3, 4, 5, 6], [7], [-0.3])
    exchange(session, "title", [100, 101], [102], [-0.5], tools=False)
    return session


def test_the_export_document_lists_turns_rows_and_findings() -> None:
    session = agent_rollout()
    document = export_session(session)
    assert json.loads(json.dumps(document)) == document
    assert (document["session_id"], document["metadata"], document["budget_stop_count"]) == (
        "rollout-1",
        {"task": "t1"},
        0,
    )
    assert (document["capture_level"], document["rollout_type"], document["trainable"]) == ("tokens", "train", True)
    assert [t["node_id"] for t in document["turns"]] == ["a", "a-retry", "b", "title"]
    assert [t["discarded"] for t in document["turns"]] == [False, True, False, False]
    assert document["turns"][2] == {
        "node_id": "b", "index": 2, "root_id": "a", "n_sampled": 1, "n_prompt": 6, "n_tools": 1,
        "finish_reason": "stop", "harness_session_id": None, "sampling_params": {"temperature": 1.0},
        "requested_sampling_params": {}, "sampled_logprobs": [-0.3], "discarded": False,
    }  # fmt: skip
    assert document["stats"] == {"n_turns": 4, "n_roots": 3, "n_leaves": 3, "n_forks": 0, "n_discarded": 1}
    assert [(s["role"], s["node_ids"]) for s in document["sequences"]] == [
        ("agent", ["a", "b"]),
        ("auxiliary", ["title"]),
    ]
    agent = document["sequences"][0]
    assert agent["input_ids"] == [1, 2, 3, 4, 5, 6, 7]
    assert agent["loss_mask"] == [0, 0, 0, 1, 1, 0, 1]
    assert (agent["n_trainable"], agent["turn_lengths"], agent["trainable"], agent["validation"]) == (
        3,
        [2, 1],
        True,
        [],
    )
    assert "[WARN] discarded_turns" in "\n".join(document["validation"])


def test_discarded_rows_and_messages_on_request() -> None:
    document = export_session(agent_rollout(), include_discarded=True, include_messages=True)
    assert [s["role"] for s in document["sequences"]] == ["discarded", "agent", "auxiliary"]
    assert document["turns"][0]["messages"] == [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "answer a"},
    ]


def test_an_eval_rollout_trains_nothing_and_has_no_trace() -> None:
    session = agent_rollout()
    session.rollout_type = "eval"
    document = export_session(session)
    assert document["rollout_type"] == "eval" and document["trainable"] is False
    assert all(not any(s["loss_mask"]) and not s["trainable"] for s in document["sequences"])
    for export in (to_trace_entries, to_training_trace):
        with pytest.raises(ValueError, match="captured for evaluation"):
            export(session.graph, document)


def test_a_level_below_tokens_is_an_eval_rollout() -> None:
    assert export_session(agent_rollout(), capture_level="logprobs")["rollout_type"] == "eval"


def test_trace_entries_are_the_agent_turns_with_exact_ids() -> None:
    session = agent_rollout()
    entries = to_trace_entries(session.graph, export_session(session))
    assert [e["metadata"]["node_id"] for e in entries] == ["a", "b"]
    second = entries[1]
    assert (second["prompt_token_ids"], second["completion_token_ids"]) == ([1, 2, 3, 4, 5, 6], [7])
    assert (second["per_token_logps"], second["loss_mask"]) == ([-0.3], [0, 0, 0, 0, 0, 0, 1])
    assert second["request"]["messages"] == [{"role": "user", "content": "b"}]
    assert second["response"] == {
        "choices": [{"message": {"role": "assistant", "content": "answer b"}, "finish_reason": "stop"}]
    }
    assert second["metadata"] == {
        "node_id": "b", "index": 2, "model": "tiny", "n_tools": 1, "harness_session_id": None,
        "sampling_params": {"temperature": 1.0}, "requested_sampling_params": {},
    }  # fmt: skip


def test_a_clean_rollout_is_a_training_trace() -> None:
    session = agent_rollout()
    document = export_session(session)
    trace = to_training_trace(session.graph, document)
    assert [t.node_id for t in trace.turns] == ["a", "b"]
    assert trace.to_trace_entries() == to_trace_entries(session.graph, document)
    assert to_turn_records(session.graph, document) == [
        ([1, 2, 3], [4, 5], [-0.1, -0.2]),
        ([1, 2, 3, 4, 5, 6], [7], [-0.3]),
    ]


def test_a_turn_rejected_at_ingest_blocks_the_training_trace_but_not_the_usable_entries() -> None:
    session = agent_rollout()
    exchange(session, "c", [1, 2, 3, 4, 5, 6, 7, 8], [9, 10], [-0.1])  # one logprob for two ids
    document = export_session(session)
    assert document["trainable"] is False
    assert [e["metadata"]["node_id"] for e in to_trace_entries(session.graph, document)] == ["a", "b"]
    with pytest.raises(ValueError, match=r"\[FATAL\] logprob_misalign: turn c"):
        to_training_trace(session.graph, document)


def test_when_every_turn_was_rejected_the_exports_say_why_instead_of_returning_nothing() -> None:
    session = Session()
    exchange(session, "a", [1, 2], [3, 4], [-0.1])
    exchange(session, "b", [1, 2, 3, 4, 5], [6], [0.5])
    document = export_session(session)
    for export in (to_trace_entries, to_training_trace, to_turn_records):
        with pytest.raises(
            ValueError, match=r"none of the rollout's 2 turns can be trained on \(\[FATAL\] logprob_misalign"
        ):
            export(session.graph, document)


def test_a_rollout_without_turns_has_no_entries_and_no_training_trace() -> None:
    session = Session()
    document = export_session(session)
    assert to_trace_entries(session.graph, document) == []
    with pytest.raises(ValueError, match="no_turns"):
        to_training_trace(session.graph, document)


# --- re-tokenisation skew, with a real tokenizer --------------------------------------------------

TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    pytest.importorskip("transformers")
    spec = importlib.util.spec_from_file_location(
        "trl_grpo_tiny_model", ROOT / "examples" / "trl_grpo" / "tiny_model.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_tokenizer()


def render(tokenizer: Any, messages: List[Dict[str, Any]]) -> List[int]:
    return list(
        tokenizer.apply_chat_template(messages, chat_template=TEMPLATE, add_generation_prompt=True, tokenize=True)[
            "input_ids"
        ]
    )


def conversation(tokenizer: Any, *, drift: bool) -> Session:
    """Two turns whose prompt ids are what an engine with TEMPLATE saw (the second one drifted)."""
    session = Session()
    messages = [{"role": "user", "content": "list files"}]
    sampled = tokenizer.encode("ls\n", add_special_tokens=False)
    exchange(session, "a", render(tokenizer, messages), sampled, [-0.5] * len(sampled), messages=messages)
    messages = [*messages, {"role": "assistant", "content": "ls"}, {"role": "tool", "content": "a.txt"}]
    prompt = render(tokenizer, messages)
    if drift:
        prompt = prompt[:-3] + prompt[-2:]  # the engine saw one token fewer near the end
    exchange(session, "b", prompt, sampled, [-0.5] * len(sampled), messages=messages)
    return session


def test_prompts_rendered_like_the_engine_have_zero_skew(tokenizer: Any) -> None:
    session = conversation(tokenizer, drift=False)
    document = export_session(session)
    assert session.graph.get("b").parent_id == "a"  # the engine's ids do extend each other
    skew = measure_retokenization_skew(session.graph, document, tokenizer, chat_template=TEMPLATE)
    assert {k: skew[k] for k in ("n_turns", "n_errors", "exact_match_frac", "max_abs_delta", "min_prefix_match_frac")} == {
        "n_turns": 2, "n_errors": 0, "exact_match_frac": 1.0, "max_abs_delta": 0, "min_prefix_match_frac": 1.0,
    }  # fmt: skip


def test_a_drifted_prompt_shows_as_skew(tokenizer: Any) -> None:
    session = conversation(tokenizer, drift=True)
    skew = measure_retokenization_skew(session.graph, export_session(session), tokenizer, chat_template=TEMPLATE)
    assert (skew["exact_match_frac"], skew["max_abs_delta"]) == (0.5, 1)
    drifted = skew["turns"][1]
    assert (drifted["node_id"], drifted["exact"], drifted["delta"]) == ("b", False, 1)
    assert drifted["prefix_match_frac"] == (drifted["n_engine"] - 2) / drifted["n_engine"]


def test_a_template_that_cannot_render_a_turn_counts_as_an_error(tokenizer: Any) -> None:
    session = conversation(tokenizer, drift=False)
    strict = "{% if messages|length > 1 %}{{ raise_exception('too long') }}{% endif %}" + TEMPLATE
    skew = measure_retokenization_skew(session.graph, export_session(session), tokenizer, chat_template=strict)
    assert (skew["n_turns"], skew["n_errors"], skew["exact_match_frac"]) == (2, 1, 1.0)
    assert "too long" in skew["turns"][1]["error"]
