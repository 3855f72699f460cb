"""What the proxy asks of the engine, and how it reads the answer (pure functions, no I/O).

* :data:`CAPTURE_LEVELS`: what an engine can give. ``tokens``: prompt ids, sampled ids and
  logprobs (vLLM/SGLang with ``return_token_ids``), trainable. ``logprobs``: logprobs only.
  ``text``: nothing but the text.
* :func:`training_sampling` / :func:`evaluation_sampling`: the sampling a session pins.
* :func:`prepare_request` turns the agent's chat request into the engine request for a level;
  :func:`normalize_response` gives vLLM's and SGLang's answers one shape.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Tuple

__all__ = [
    "CAPTURE_LEVELS",
    "CONSTRAINING_FIELDS",
    "NON_POLICY_SAMPLING",
    "evaluation_sampling",
    "normalize_response",
    "prepare_request",
    "rollout_type_for",
    "training_sampling",
]

CAPTURE_LEVELS: Tuple[str, ...] = ("tokens", "logprobs", "text")

# The sampling knobs besides temperature, at the values that leave the model's distribution
# untouched. A training policy samples from the full vocabulary, so at level tokens these are
# set explicitly: an engine may otherwise apply the model's generation_config defaults (vLLM does).
NON_POLICY_SAMPLING: Dict[str, float | int] = {
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
}

# Request fields that constrain which tokens may be sampled; a training policy refuses them,
# since the sampled ids would no longer come from the policy the logprobs describe.
CONSTRAINING_FIELDS: Tuple[str, ...] = (
    "logit_bias",
    "allowed_token_ids",
    "bad_words",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_decoding_backend",
    "grammar",
    "json_schema",
)


def _number(value: Any) -> bool:
    return type(value) in (int, float)


def _neutral(key: str, value: Any) -> bool:
    """Whether ``value`` leaves the distribution as ``NON_POLICY_SAMPLING[key]`` does."""
    if value is None:
        return True  # not set: the engine's own neutral default
    if not _number(value):
        return False
    if key == "top_k":
        return value in (0, -1)
    return value == NON_POLICY_SAMPLING[key]


def training_sampling(sampling: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """Validate a training policy: a finite positive temperature over the full vocabulary.

    ``None`` (or ``{}``): no policy, returns ``{}``. Otherwise only ``temperature`` and the keys of
    :data:`NON_POLICY_SAMPLING` are allowed, each of those at its neutral value (``top_k`` 0 or -1,
    ``None`` = unset), so TRL's defaults pass. Returns the full pinned policy:
    ``{"temperature": float, **NON_POLICY_SAMPLING}``. Raises ``ValueError`` otherwise.
    """
    if sampling is None:
        return {}
    if not isinstance(sampling, Mapping):
        raise ValueError(f"training sampling must be a dict, not {type(sampling).__name__}")
    if not sampling:
        return {}
    unknown = sorted(set(sampling) - {"temperature", *NON_POLICY_SAMPLING})
    if unknown:
        raise ValueError(
            f"unsupported training sampling fields: {', '.join(map(str, unknown))} (allowed: temperature,"
            f" {', '.join(NON_POLICY_SAMPLING)})"
        )
    temperature = sampling.get("temperature")
    if not _number(temperature) or not math.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"training sampling requires a finite temperature > 0, not {temperature!r}")
    for key, neutral in NON_POLICY_SAMPLING.items():
        if key in sampling and not _neutral(key, sampling[key]):
            raise ValueError(
                f"training sampling requires {key}={neutral} (got {sampling[key]!r}): the policy samples"
                " from the full vocabulary"
            )
    return {"temperature": float(temperature), **NON_POLICY_SAMPLING}


def evaluation_sampling(sampling: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """Validate an eval session's sampling: ``temperature`` in [0, 2], ``top_p`` in (0, 1],
    ``top_k`` -1 or >= 1; nothing else. ``None`` returns ``{}``; raises ``ValueError``."""
    if sampling is None:
        return {}
    if not isinstance(sampling, Mapping):
        raise ValueError(f"eval sampling must be a dict, not {type(sampling).__name__}")
    unknown = sorted(set(sampling) - {"temperature", "top_p", "top_k"})
    if unknown:
        raise ValueError(
            f"unsupported eval sampling fields: {', '.join(map(str, unknown))} (allowed: temperature, top_p, top_k)"
        )
    result: Dict[str, Any] = {}
    if "temperature" in sampling:
        value = sampling["temperature"]
        if not _number(value) or not 0 <= value <= 2:
            raise ValueError(f"eval sampling requires temperature in [0, 2], not {value!r}")
        result["temperature"] = float(value)
    if "top_p" in sampling:
        value = sampling["top_p"]
        if not _number(value) or not 0 < value <= 1:
            raise ValueError(f"eval sampling requires top_p in (0, 1], not {value!r}")
        result["top_p"] = float(value)
    if "top_k" in sampling:
        value = sampling["top_k"]
        if type(value) is not int or not (value == -1 or value >= 1):
            raise ValueError(f"eval sampling requires top_k = -1 or an integer >= 1, not {value!r}")
        result["top_k"] = value
    return result


def rollout_type_for(purpose: str, level: str) -> str:
    """``"eval"`` for purpose eval or a level below tokens, else ``"train"``.

    Raises ``ValueError`` for purpose ``train`` at a level that cannot train, or unknown values."""
    if purpose not in ("auto", "eval", "train"):
        raise ValueError(f"purpose must be auto, eval or train, not {purpose!r}")
    if level not in CAPTURE_LEVELS:
        raise ValueError(f"capture level must be one of {', '.join(CAPTURE_LEVELS)}, not {level!r}")
    if purpose == "train" and level != "tokens":
        raise ValueError(
            f"a training rollout needs capture level tokens (prompt and sampled ids with logprobs); the engine"
            f" gives {level!r}"
        )
    return "eval" if purpose == "eval" or level != "tokens" else "train"


def _constraining(request: Mapping[str, Any]) -> List[str]:
    found = [name for name in CONSTRAINING_FIELDS if request.get(name) not in (None, {}, [], "")]
    found += sorted(k for k in request if k.startswith("guided_") and k not in found and request[k] is not None)
    response_format = request.get("response_format")
    if isinstance(response_format, Mapping) and response_format.get("type") not in (None, "text"):
        found.append("response_format")
    choice = request.get("tool_choice")
    if choice == "required" or isinstance(choice, Mapping):
        found.append("tool_choice")
    min_tokens = request.get("min_tokens")
    if _number(min_tokens) and min_tokens > 0:
        found.append("min_tokens")
    return found


def _messages_for(messages: Any, capture_level: str) -> Any:
    """Messages with ``reasoning_content`` renamed ``reasoning`` (token engines) or dropped (text);
    unchanged messages are shared, changed ones copied."""
    if not isinstance(messages, list):
        return messages
    out = []
    changed = False
    for message in messages:
        if isinstance(message, dict) and "reasoning_content" in message:
            message = dict(message)
            reasoning = message.pop("reasoning_content")
            if capture_level != "text" and reasoning is not None and "reasoning" not in message:
                message["reasoning"] = reasoning
            changed = True
        out.append(message)
    return out if changed else messages


def prepare_request(
    request: Mapping[str, Any],
    *,
    capture_level: str,
    policy: Optional[Mapping[str, Any]] = None,
    eval_sampling: Optional[Mapping[str, Any]] = None,
) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """The engine request for ``request`` (a chat-completions body) at ``capture_level``.

    Returns ``(engine_request, overridden)``; ``request`` is not modified. ``overridden`` maps each
    sampling knob the agent had set and this call changed to the value the agent asked for, so the
    change can be recorded (never silent).

    * ``tokens``: ``logprobs=true``, ``return_token_ids=true``, and every knob of
      :data:`NON_POLICY_SAMPLING` set to its neutral value (``top_k`` 0 counts as neutral and is
      not reported); ``logprobs``: ``logprobs=true``; ``text``: nothing added.
    * Non-text levels set ``top_logprobs=0`` when absent or null and rename message
      ``reasoning_content`` to ``reasoning``; ``text`` drops ``reasoning_content``.
    * ``eval_sampling`` (from :func:`evaluation_sampling`) is merged first and its knobs are kept
      at level tokens: the session pinned them.
    * ``policy`` (from :func:`training_sampling`, level tokens only) refuses logit-constraining
      fields (:data:`CONSTRAINING_FIELDS`, non-text ``response_format``, forced ``tool_choice``,
      ``min_tokens``) and then overwrites the knobs.

    Raises ``ValueError`` (answered 400) for an unknown level, a policy below level tokens, or a
    constraining field under a policy.
    """
    if capture_level not in CAPTURE_LEVELS:
        raise ValueError(f"capture level must be one of {', '.join(CAPTURE_LEVELS)}, not {capture_level!r}")
    engine: Dict[str, Any] = dict(request)
    overridden: Dict[str, Any] = {}

    def pin(key: str, value: Any, *, report: bool = True) -> None:
        if key in request and request[key] is not None and request[key] != value and report:
            overridden.setdefault(key, request[key])
        engine[key] = value

    pinned = set()
    for key, value in (eval_sampling or {}).items():
        pin(key, value)
        pinned.add(key)
    if policy:
        if capture_level != "tokens":
            raise ValueError(
                f"this session's training policy needs an engine at capture level tokens; this one gives {capture_level!r}"
            )
        constraining = _constraining(request)
        if constraining:
            raise ValueError(
                f"this rollout samples with a training policy over the full vocabulary; {', '.join(constraining)}"
                " would constrain it (drop them, or make the session without 'sampling')"
            )
        for key, value in policy.items():
            pin(key, value)
            pinned.add(key)
    if capture_level == "tokens":
        engine["logprobs"] = True
        engine["return_token_ids"] = True
        for key, neutral in NON_POLICY_SAMPLING.items():
            if key not in pinned:
                pin(key, neutral, report=not _neutral(key, request.get(key)))
    elif capture_level == "logprobs":
        engine["logprobs"] = True
    if capture_level != "text" and engine.get("top_logprobs") is None:
        engine["top_logprobs"] = 0
    if "messages" in engine:
        engine["messages"] = _messages_for(engine["messages"], capture_level)
    return engine, overridden


def _aligned_logprobs(choice: Dict[str, Any], copy: bool = True) -> Optional[Dict[str, Any]]:
    """The choice's logprobs, each entry given its ``token_id`` when they line up with
    ``token_ids``; ``None`` when an entry names a different id than the one at its position.
    ``copy=False`` writes ``token_id`` into the entries themselves."""
    logprobs = choice.get("logprobs")
    ids = choice.get("token_ids")
    if not isinstance(logprobs, dict) or not isinstance(ids, list):
        return logprobs
    content = logprobs.get("content")
    if not isinstance(content, list) or len(content) != len(ids):
        return logprobs  # misaligned counts: left for check_turn to report
    if not all(type(entry) is dict for entry in content):
        return logprobs
    for entry, token_id in zip(content, ids, strict=True):
        token = entry.get("token")
        if type(token) is str and token.startswith("token_id:") and token[9:] != str(token_id):
            try:
                if int(token[9:]) != token_id:
                    return None
            except ValueError:
                return None
    if copy:
        return {
            **logprobs,
            "content": [{**entry, "token_id": token_id} for entry, token_id in zip(content, ids, strict=True)],
        }
    for entry, token_id in zip(content, ids, strict=True):
        entry["token_id"] = token_id
    return logprobs


def normalize_response(response: Mapping[str, Any], *, copy: bool = True) -> Dict[str, Any]:
    """One shape for vLLM's and SGLang's chat completions (``response`` is not modified unless
    ``copy=False``, which saves copying each logprob entry where the caller owns the answer).

    ``choices[0].prompt_token_ids`` (SGLang) is hoisted to the top when missing there (vLLM);
    ``message.reasoning`` becomes ``reasoning_content``; when ``token_ids`` and
    ``logprobs.content`` have equal length, each entry gets its ``token_id``, and an entry whose
    ``token`` reads ``token_id:<n>`` for another id drops that choice's logprobs.
    """
    out: Dict[str, Any] = dict(response)
    choices = response.get("choices")
    if not isinstance(choices, list):
        return out
    new_choices = []
    for choice in choices:
        if not isinstance(choice, dict):
            new_choices.append(choice)
            continue
        choice = dict(choice)
        message = choice.get("message")
        if isinstance(message, dict) and "reasoning" in message:
            message = dict(message)
            reasoning = message.pop("reasoning")
            if message.get("reasoning_content") is None:
                message["reasoning_content"] = reasoning
            choice["message"] = message
        if "logprobs" in choice:
            choice["logprobs"] = _aligned_logprobs(choice, copy)
        new_choices.append(choice)
    out["choices"] = new_choices
    if out.get("prompt_token_ids") is None and new_choices and isinstance(new_choices[0], dict):
        hoisted = new_choices[0].get("prompt_token_ids")
        if hoisted is not None:
            out["prompt_token_ids"] = hoisted
    return out
