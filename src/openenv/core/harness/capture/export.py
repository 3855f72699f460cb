"""A captured rollout as data: the export document, trace entries, a training trace.

:func:`export_session` turns a capture session into one JSON document (turns, training rows,
findings); :func:`to_trace_entries`, :func:`to_training_trace` and :func:`to_turn_records` turn
the graph plus that document into what trainers consume; :func:`measure_retokenization_skew`
shows how far a local re-render of the prompts drifts from the ids the engine actually saw.

The session object is duck-typed: ``session_id``, ``metadata``, ``graph`` (a
:class:`~openenv.core.harness.capture.graph.RolloutGraph`), ``budget_stop_count``,
``capture_level``, ``rollout_type`` and ``findings`` (ingest findings).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Set, Tuple

from openenv.core.harness.capture.graph import RolloutGraph, TrainingSequence, TurnNode
from openenv.core.harness.capture.validate import check_rollout, check_sequence
from openenv.core.harness.training import TraceEntry, TrainingTrace

__all__ = [
    "export_session",
    "measure_retokenization_skew",
    "to_trace_entries",
    "to_training_trace",
    "to_turn_records",
]


def _roles(graph: RolloutGraph, rows: List[Tuple[List[TurnNode], TrainingSequence]], training: bool) -> List[str]:
    """``discarded`` for paths ending in a discarded turn; among the rest, the paths with tools
    are the agent's (the others auxiliary: titles, summaries), or, without tools anywhere, every
    path is (under training capture only those with something to train on)."""
    discarded = {n.node_id for n in graph.discarded_nodes()}
    live = [path for path, _ in rows if path[-1].node_id not in discarded]
    any_tools = any(node.n_tools > 0 for path in live for node in path)
    roles = []
    for path, sequence in rows:
        if path[-1].node_id in discarded:
            roles.append("discarded")
        elif any_tools:
            roles.append("agent" if any(node.n_tools > 0 for node in path) else "auxiliary")
        else:
            roles.append("agent" if not training or sequence.n_trainable > 0 else "auxiliary")
    return roles


def _root_ids(graph: RolloutGraph) -> Dict[str, str]:
    roots: Dict[str, str] = {}
    for node in graph.nodes.values():
        chain = []
        current: Optional[TurnNode] = node
        while current is not None and current.node_id not in roots:
            chain.append(current.node_id)
            current = graph.get(current.parent_id) if current.parent_id is not None else None
        root = roots[current.node_id] if current is not None else chain[-1]
        for node_id in chain:
            roots[node_id] = root
    return roots


def export_session(
    session: Any,
    *,
    include_discarded: bool = False,
    include_messages: bool = False,
    capture_level: Optional[str] = None,
) -> Dict[str, Any]:
    """The rollout document of a capture session (JSON-safe).

    ``{"session_id", "metadata", "budget_stop_count", "turns", "stats", "sequences",
    "validation", "trainable", "capture_level", "rollout_type"}``. ``turns`` lists every turn
    (``discarded`` flagged; ``messages`` = request messages + the answer with
    ``include_messages``); ``sequences`` one training row per root-to-leaf path with its ``role``
    (``agent``/``auxiliary``; ``discarded`` rows only with ``include_discarded``). Below level
    tokens or for an eval session (``rollout_type`` ``eval``) every mask is zero and nothing is
    trainable. ``validation`` holds the ingest findings and the rollout check as
    ``[LEVEL] code: detail`` lines. ``capture_level`` defaults to the session's.
    """
    graph: RolloutGraph = session.graph
    level = capture_level or getattr(session, "capture_level", "tokens")
    rollout_type = "eval" if getattr(session, "rollout_type", "train") == "eval" or level != "tokens" else "train"
    training = rollout_type == "train"
    discarded = {n.node_id for n in graph.discarded_nodes()}
    roots = _root_ids(graph)

    turns = []
    for node in graph.nodes.values():
        turn: Dict[str, Any] = {
            "node_id": node.node_id,
            "index": node.index,
            "root_id": roots[node.node_id],
            "n_sampled": len(node.sampled_ids),
            "n_prompt": len(node.prompt_ids),
            "n_tools": node.n_tools,
            "finish_reason": node.finish_reason,
            "harness_session_id": node.harness_session_id,
            "sampling_params": node.sampling_params,
            "requested_sampling_params": node.requested_sampling_params,
            "sampled_logprobs": node.sampled_logprobs,
            "discarded": node.node_id in discarded,
        }
        if include_messages:
            turn["messages"] = [*node.request_messages, node.response_message]
        turns.append(turn)

    rows = [(path, graph.sequence_for(path[-1])) for path in graph.paths()]
    sequences = []
    for (_path, sequence), role in zip(rows, _roles(graph, rows, training), strict=True):
        if role == "discarded" and not include_discarded:
            continue
        if training:
            report = check_sequence(sequence)
            mask, validation = sequence.loss_mask, report.lines()
            trainable = role == "agent" and report.ok
        else:  # evaluation: nothing to train on; logprobs stay for scoring
            mask, validation, trainable = [0] * len(sequence.loss_mask), [], False
        sequences.append(
            {
                "role": role,
                "root_id": sequence.root_id,
                "node_ids": sequence.node_ids,
                "n_turns": sequence.n_turns,
                "prompt_len": sequence.prompt_len,
                "n_trainable": sum(mask),
                "turn_lengths": sequence.turn_lengths,
                "input_ids": sequence.input_ids,
                "loss_mask": mask,
                "logprobs": sequence.logprobs,
                "trainable": trainable,
                "validation": validation,
            }
        )

    validation = [str(f) for f in getattr(session, "findings", [])] + check_rollout(graph).lines()
    return {
        "session_id": session.session_id,
        "metadata": dict(getattr(session, "metadata", {}) or {}),
        "budget_stop_count": getattr(session, "budget_stop_count", 0),
        "turns": turns,
        "stats": graph.stats(),
        "sequences": sequences,
        "validation": validation,
        "trainable": training
        and not any(line.startswith("[FATAL") for line in validation)
        and any(s["trainable"] for s in sequences if s["role"] == "agent"),
        "capture_level": level,
        "rollout_type": rollout_type,
    }


def _refuse_eval(document: Dict[str, Any]) -> None:
    if document.get("rollout_type") == "eval":
        raise ValueError(
            "this rollout was captured for evaluation (purpose eval, or an engine below capture level tokens):"
            " it has no training data"
        )


def _agent_nodes(graph: RolloutGraph, document: Dict[str, Any]) -> Tuple[List[TurnNode], List[TurnNode]]:
    """The agent's turns in arrival order, split into (usable for training, rejected)."""
    agent: Set[str] = {
        node_id for row in document.get("sequences", []) if row.get("role") == "agent" for node_id in row["node_ids"]
    }
    usable, rejected = [], []
    for node in graph.nodes.values():
        if node.node_id in agent:
            (usable if node.prompt_ids and node.logprobs_usable else rejected).append(node)
    return usable, rejected


def _why_nothing(graph: RolloutGraph, document: Dict[str, Any], rejected: List[TurnNode]) -> str:
    fatal = [line for line in document.get("validation", []) if line.startswith("[FATAL")]
    reason = "; ".join(fatal[:5]) + (f"; and {len(fatal) - 5} more" if len(fatal) > 5 else "")
    if not reason:
        reason = (
            f"turns {', '.join(n.node_id for n in rejected[:5])} have no usable logprobs"
            if rejected
            else "no path of the rollout has a token to train on"
        )
    return f"none of the rollout's {len(graph)} turns can be trained on ({reason})"


def _entry(node: TurnNode) -> TraceEntry:
    return TraceEntry(
        request={"messages": node.request_messages, "tools": node.request_tools or []},
        response={"choices": [{"message": node.response_message, "finish_reason": node.finish_reason}]},
        prompt_token_ids=list(node.prompt_ids),
        completion_token_ids=list(node.sampled_ids),
        per_token_logps=[float(v) for v in node.sampled_logprobs or ()],
        loss_mask=[0] * len(node.prompt_ids) + [1] * len(node.sampled_ids),
        metadata={
            "node_id": node.node_id,
            "index": node.index,
            "model": node.model,
            "n_tools": node.n_tools,
            "harness_session_id": node.harness_session_id,
            "sampling_params": node.sampling_params,
            "requested_sampling_params": node.requested_sampling_params,
        },
    )


def to_trace_entries(graph: RolloutGraph, document: Dict[str, Any]) -> List[TraceEntry]:
    """One :class:`TraceEntry` per agent turn with usable logprobs, in arrival order.

    Turns rejected at ingest are skipped (later turns carry them as masked context). Raises
    ``ValueError`` for an eval rollout, and when the rollout has turns but none is usable (naming
    why) rather than answering an empty list. A rollout without turns gives ``[]``.
    """
    _refuse_eval(document)
    usable, rejected = _agent_nodes(graph, document)
    if not usable and len(graph):
        raise ValueError(_why_nothing(graph, document, rejected))
    return [_entry(node) for node in usable]


def to_training_trace(graph: RolloutGraph, document: Dict[str, Any]) -> TrainingTrace:
    """The rollout as a validated :class:`TrainingTrace`, or ``ValueError`` when any of it is
    untrustworthy: an eval rollout, any ``FATAL`` finding (no turns, a turn rejected at ingest),
    or an agent turn without usable logprobs."""
    _refuse_eval(document)
    fatal = [line for line in document.get("validation", []) if line.startswith("[FATAL")]
    usable, rejected = _agent_nodes(graph, document)
    if not usable and len(graph):
        raise ValueError(_why_nothing(graph, document, rejected))
    if fatal:
        raise ValueError(
            f"the rollout has {len(fatal)} fatal finding(s): {'; '.join(fatal[:5])}"
            " (to_trace_entries gives the usable turns alone)"
        )
    if rejected:
        raise ValueError(f"agent turns {', '.join(n.node_id for n in rejected[:5])} have no usable logprobs")
    return TrainingTrace.from_entries(_entry(node) for node in usable)


def to_turn_records(graph: RolloutGraph, document: Dict[str, Any]) -> List[Tuple[List[int], List[int], List[float]]]:
    """``[(prompt_ids, sampled_ids, logprobs)]`` per usable agent turn (see :func:`to_trace_entries`);
    ``ValueError`` where a turn's completion is only partly trainable (the tuple has no mask)."""
    records = []
    for entry in to_trace_entries(graph, document):
        prompt, completion = entry["prompt_token_ids"], entry["completion_token_ids"]
        if not all(entry["loss_mask"][len(prompt) :]):
            raise ValueError(
                f"turn {entry['metadata']['node_id']} is only partly trainable; use to_trace_entries for its mask"
            )
        records.append((prompt, completion, entry["per_token_logps"]))
    return records


def _rendered_ids(rendered: Any) -> List[int]:
    if hasattr(rendered, "keys") and "input_ids" in rendered:
        rendered = rendered["input_ids"]
    if hasattr(rendered, "tolist"):
        rendered = rendered.tolist()
    rendered = list(rendered)
    if rendered and isinstance(rendered[0], (list, tuple)):
        rendered = list(rendered[0])
    return [int(t) for t in rendered]


def _common_prefix(a: List[int], b: List[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    low, high = 0, n  # a[:low] == b[:low], a[:high] != b[:high]
    while high - low > 1:
        mid = (low + high) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid
    return low


def measure_retokenization_skew(
    graph: RolloutGraph,
    document: Dict[str, Any],
    tokenizer: Any,
    *,
    chat_template: Optional[str] = None,
    chat_template_kwargs: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """Render each turn's messages locally with ``tokenizer.apply_chat_template`` and compare with
    the prompt ids the engine saw: ``{n_turns, n_errors, exact_match_frac, max_abs_delta,
    min_prefix_match_frac, turns}``, one ``turns`` item per turn with prompt ids (``node_id,
    n_engine, n_local, delta, exact, prefix_match_frac, error``). A render that raises counts in
    ``n_errors``; the fractions are over the turns that rendered."""
    node_ids = [t["node_id"] for t in document.get("turns", [])] or list(graph.nodes)
    results: List[Dict[str, Any]] = []
    for node_id in node_ids:
        node = graph.get(node_id)
        if node is None or not node.prompt_ids:
            continue
        engine = list(node.prompt_ids)
        try:
            rendered = tokenizer.apply_chat_template(
                node.request_messages,
                tools=node.request_tools or None,
                chat_template=chat_template,
                add_generation_prompt=True,
                tokenize=True,
                **(chat_template_kwargs or {}),
            )
            local = _rendered_ids(rendered)
        except Exception as exc:  # a template that cannot render this turn is itself a finding
            results.append(
                {
                    "node_id": node_id,
                    "n_engine": len(engine),
                    "n_local": None,
                    "delta": None,
                    "exact": False,
                    "prefix_match_frac": None,
                    "error": f"{type(exc).__name__}: {exc}",
                }
            )
            continue
        results.append(
            {
                "node_id": node_id,
                "n_engine": len(engine),
                "n_local": len(local),
                "delta": len(local) - len(engine),
                "exact": local == engine,
                "prefix_match_frac": _common_prefix(local, engine) / len(engine),
                "error": None,
            }
        )
    rendered_ok = [r for r in results if r["error"] is None]
    return {
        "n_turns": len(results),
        "n_errors": len(results) - len(rendered_ok),
        "exact_match_frac": (sum(r["exact"] for r in rendered_ok) / len(rendered_ok)) if rendered_ok else 0.0,
        "max_abs_delta": max((abs(r["delta"]) for r in rendered_ok), default=0),
        "min_prefix_match_frac": min((r["prefix_match_frac"] for r in rendered_ok), default=0.0),
        "turns": results,
    }
