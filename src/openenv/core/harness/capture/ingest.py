"""Ingest: one engine call becomes a checked turn of a rollout.

:func:`node_from_exchange` builds the :class:`~openenv.core.harness.capture.graph.TurnNode` for a
request the engine answered, checks it (:mod:`.validate`) and keeps only what may be trained on:
a turn whose ids or logprobs fail the checks stays in the rollout as context, and the findings
say why. The proxy calls it for every answered model call.
"""

from __future__ import annotations

import math
from typing import Any, List, Mapping, Optional, Tuple

from openenv.core.harness.capture.graph import RolloutGraph, TurnNode, system_digest
from openenv.core.harness.capture.validate import FATAL, Finding, check_turn, check_turn_eval

__all__ = ["node_from_exchange"]


def _valid_ids(value: Any) -> bool:
    # at C speed (a turn may carry tens of thousands of ids); bool is no token id
    return isinstance(value, list) and (not value or (set(map(type, value)) == {int} and min(value) >= 0))


def _logprobs_of(choice: Mapping[str, Any]) -> Optional[List[Any]]:
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict) or not isinstance(logprobs.get("content"), list):
        return None
    return [entry.get("logprob") if isinstance(entry, dict) else None for entry in logprobs["content"]]


def node_from_exchange(
    chat_request: Mapping[str, Any],
    engine_response: Mapping[str, Any],
    *,
    node_id: str,
    capture_level: str,
    harness_session_id: Optional[str],
    requested_sampling: Mapping[str, Any],
    sampling: Mapping[str, Any],
    graph: Optional[RolloutGraph] = None,
) -> Tuple[Optional[TurnNode], List[Finding]]:
    """The :class:`TurnNode` for one engine call, and what the checks found. Never raises.

    ``graph``: the rollout the turn will join. Where its prompt starts with the ids of the
    rollout's latest turn, as an agent's next call does, it takes them over (see
    :meth:`RolloutGraph.take_prefix`) and only the ids after them are checked.

    ``chat_request`` is the request the engine received, ``engine_response`` its answer after
    ``upstream.normalize_response``. At level ``tokens`` the turn passes ``check_turn``; on a
    FATAL finding its logprobs are dropped and it stays as context (invalid id lists are dropped
    too, so it links by messages). Other levels run ``check_turn_eval``. An answer without
    choices gives ``(None, [WARN no_choices])``; an unexpected failure ``(None, [FATAL
    capture_ingest_failed])``.
    """
    try:
        choices = engine_response.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return None, [Finding("WARN", "no_choices", f"the engine's answer for {node_id} has no choices")]
        choice = choices[0]
        prompt_ids = engine_response.get("prompt_token_ids")
        if prompt_ids is None:
            prompt_ids = choice.get("prompt_token_ids")
        sampled_ids = choice.get("token_ids")
        prompt_ids = [] if prompt_ids is None else prompt_ids
        sampled_ids = [] if sampled_ids is None else sampled_ids
        logprobs = _logprobs_of(choice) if capture_level != "text" else None
        messages = chat_request.get("messages")
        messages = messages if isinstance(messages, list) else []
        tools = chat_request.get("tools") or None
        message = choice.get("message")
        node = TurnNode(
            node_id=node_id,
            prompt_ids=prompt_ids,
            sampled_ids=sampled_ids,
            sampled_logprobs=logprobs,
            model=engine_response.get("model") if isinstance(engine_response.get("model"), str) else None,
            finish_reason=choice.get("finish_reason"),
            harness_session_id=harness_session_id,
            system_digest=system_digest(messages),
            n_tools=len(tools) if isinstance(tools, list) else 0,
            request_messages=messages,
            request_tools=tools if isinstance(tools, list) else None,
            sampling_params=dict(sampling),
            requested_sampling_params=dict(requested_sampling),
            response_message=message if isinstance(message, dict) else {},
        )
        if capture_level == "tokens":
            report = check_turn(node, checked_prefix=graph.take_prefix(prompt_ids) if graph is not None else 0)
        else:
            report = check_turn_eval(node)
        verified = capture_level == "tokens" and report.ok  # check_turn checked every id and logprob
        if not verified and (not _valid_ids(node.prompt_ids) or not _valid_ids(node.sampled_ids)):
            node.prompt_ids, node.sampled_ids = [], []  # not token ids: useless even as context
        logprobs = node.sampled_logprobs
        if (
            logprobs is not None
            and not verified
            and (not report.ok or not all(type(v) in (int, float) and math.isfinite(v) for v in logprobs))
        ):
            node.sampled_logprobs = None  # kept as context; the finding says why
        return node, list(report.findings)
    except Exception as exc:  # ingest must never take the proxy down; the turn is reported lost
        return None, [Finding(FATAL, "capture_ingest_failed", f"turn {node_id}: {type(exc).__name__}: {exc}")]
