"""``LLMJudge``: a rubric that asks a language model for the score."""

from __future__ import annotations

import logging
import math
import re
import string
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from .base import Rubric

if TYPE_CHECKING:  # pragma: no cover
    from ..llm_client import LLMClient

logger = logging.getLogger(__name__)

_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"
# A number not glued to what comes before it: "0-1" reads as 0 and 1, not 0 and -1.
_LOOSE_NUMBER = re.compile(rf"(?<![\w.]){_NUMBER}")
_TAG = re.compile(rf"<score>\s*({_NUMBER})\s*(?:(?:/|out of)\s*({_NUMBER})\s*)?</score>", re.IGNORECASE)
_JSON = re.compile(rf"[\"']score[\"']\s*:\s*[\"']?({_NUMBER})", re.IGNORECASE)
_LABEL = re.compile(
    rf"\b(?:final\s+)?(?:score|rating|grade)\b[\s*_]*(?::|=|\bis\b)[\s*_]*({_NUMBER})"
    rf"(?:\s*(?:/|\bout of\b)\s*({_NUMBER}))?",
    re.IGNORECASE,
)
_FRACTION = re.compile(rf"(?<![\w.])({_NUMBER})\s*(?:/|\bout of\b)\s*({_NUMBER})", re.IGNORECASE)

ON_ERROR = ("raise", "default")


class LLMJudge(Rubric):
    """Scores a step by asking an LLM (any :class:`LLMClient`, e.g. an OpenAI-compatible server).

    ``prompt_template`` is filled with ``{action}`` and ``{observation}`` (their ``str()``); other
    literal braces must be doubled (``{{``). The reply is read as follows, first rule that
    matches wins (within a rule the last occurrence counts, as judges state their verdict last):

    1. ``score_pattern`` when given: its first match (first capture group if it has one), as
       upstream OpenEnv; nothing else is tried.
    2. a ``<score>0.8</score>`` tag (``<score>7/10</score>`` too);
    3. a JSON field ``"score": 0.5``;
    4. a label: ``Score: 7``, ``Rating = 7/10``, ``**Final score:** 8 out of 10``;
    5. a bare fraction ``8/10`` or ``8 out of 10``;
    6. the last number in the reply that lies within ``score_range`` (so a rubric echoed before
       the verdict, such as "on a 0-1 scale", does not win as upstream's first-number rule lets it).

    ``score_range=(lo, hi)`` is the scale the prompt asks for (default ``(0, 1)``). A fraction
    ``a/b`` means ``a/b`` of the way from ``lo`` to ``hi``; any other value is clamped into the
    range. With ``normalize=True`` (default) the score is then mapped to ``[0, 1]`` as
    ``(value - lo) / (hi - lo)``; with ``normalize=False`` it stays on the ``[lo, hi]`` scale.
    With ``normalize=False`` and no ``score_range`` there is no scale to keep to, as in upstream
    OpenEnv: the number read is the score (``Score: 7`` scores 7.0, ``score_pattern``'s match
    likewise), rule 6 takes the last number of the reply, and only fractions read as ``a/b``.

    When nothing parses the score is ``default_score`` (returned as given), ``parse_failures``
    grows and ``last_error`` says why. When the request fails (endpoint down, HTTP error,
    timeout), ``on_error="raise"`` (default) lets the exception through, so the step fails
    visibly rather than training on a made-up reward; ``on_error="default"`` returns
    ``default_score``, counts ``request_errors`` and records ``last_error`` instead.
    ``last_reply`` holds the latest reply text.
    """

    def __init__(
        self,
        prompt_template: str,
        client: LLMClient,
        *,
        score_pattern: Optional[str] = None,
        default_score: float = 0.0,
        normalize: bool = True,
        score_range: Optional[Tuple[float, float]] = None,
        on_error: str = "raise",
    ) -> None:
        super().__init__()
        _check_template(prompt_template)
        self._range_given = score_range is not None  # (without one, normalize=False bounds nothing)
        lo, hi = (float(x) for x in (score_range if score_range is not None else (0.0, 1.0)))
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"score_range must be two finite numbers (lo, hi) with lo < hi, got {score_range!r}")
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be 'raise' or 'default', got {on_error!r}")
        self.prompt_template = prompt_template
        self.client = client
        self.score_pattern = score_pattern
        self._pattern = re.compile(score_pattern) if score_pattern is not None else None
        self.default_score = default_score
        self.normalize = normalize
        self.score_range = (lo, hi)
        self.on_error = on_error
        self.last_reply: Optional[str] = None
        self.last_error: Optional[str] = None
        self.parse_failures = 0
        self.request_errors = 0

    def render_prompt(self, action: Any, observation: Any) -> str:
        """The prompt sent for this step."""
        return self.prompt_template.format(action=action, observation=observation)

    async def forward(self, action: Any, observation: Any) -> float:
        self.last_reply, self.last_error = None, None
        try:
            reply = await self.client.complete(self.render_prompt(action, observation))
        except Exception as exc:
            if self.on_error == "raise":
                raise
            self.request_errors += 1
            self.last_error = f"request failed: {type(exc).__name__}: {exc}"
            logger.warning("LLMJudge: %s; scoring %s", self.last_error, self.default_score)
            return self.default_score
        self.last_reply = reply
        score = self.parse_score(reply)
        if score is None:
            self.parse_failures += 1
            self.last_error = f"no score found in the reply: {reply[:200]!r}"
            logger.warning("LLMJudge: %s; scoring %s", self.last_error, self.default_score)
            return self.default_score
        return score

    def parse_score(self, reply: str) -> Optional[float]:
        """The score a reply gives, by the rules in the class docstring; ``None`` if none."""
        lo, hi = self.score_range
        bounded = self.normalize or self._range_given
        value: Optional[float] = None
        if self._pattern is not None:
            match = self._pattern.search(reply)
            if match is not None:  # its first group that took part in the match, else the whole match
                text = next((group for group in match.groups() if group is not None), match.group(0))
                value = _to_float(text)
                if bounded:
                    value = _clamp(value, lo, hi)
        else:
            value = self._read(reply, bounded)
        if value is None:
            return None
        return (value - lo) / (hi - lo) if self.normalize else value

    def _read(self, reply: str, bounded: bool) -> Optional[float]:
        lo, hi = self.score_range
        for pattern in (_TAG, _JSON, _LABEL, _FRACTION):
            for match in reversed(list(pattern.finditer(reply))):
                value = self._value(match, bounded)
                if value is not None:
                    return value
        for match in reversed(list(_LOOSE_NUMBER.finditer(reply))):
            number = _to_float(match.group(0))
            if number is not None and (not bounded or lo <= number <= hi):
                return number
        return None

    def _value(self, match: re.Match, bounded: bool) -> Optional[float]:
        lo, hi = self.score_range
        number = _to_float(match.group(1))
        if number is None:
            return None
        if match.re.groups >= 2 and match.group(2) is not None:
            total = _to_float(match.group(2))
            if total is None or total <= 0:
                return None
            number = lo + (number / total) * (hi - lo)
        return _clamp(number, lo, hi) if bounded else number

    def state_dict(self) -> Dict[str, Any]:
        return {
            "prompt_template": self.prompt_template,
            "score_pattern": self.score_pattern,
            "default_score": self.default_score,
            "normalize": self.normalize,
            "score_range": list(self.score_range) if self._range_given else None,
            "on_error": self.on_error,
            **super().state_dict(),
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        template = state.get("prompt_template", self.prompt_template)
        _check_template(template)
        pattern = state.get("score_pattern", self.score_pattern)
        given = state.get("score_range", list(self.score_range) if self._range_given else None)
        lo, hi = (float(x) for x in (given if given is not None else (0.0, 1.0)))
        if not lo < hi:
            raise ValueError(f"score_range must have lo < hi, got {(lo, hi)}")
        on_error = state.get("on_error", self.on_error)
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be 'raise' or 'default', got {on_error!r}")
        self.prompt_template, self.score_range, self.on_error = template, (lo, hi), on_error
        self._range_given = given is not None
        self.score_pattern = pattern
        self._pattern = re.compile(pattern) if pattern is not None else None
        self.default_score = state.get("default_score", self.default_score)
        self.normalize = bool(state.get("normalize", self.normalize))
        super().load_state_dict(state)


def _check_template(template: str) -> None:
    try:
        fields: List[str] = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        raise ValueError(f"bad prompt_template ({exc}): write literal braces as '{{{{' and '}}}}'") from None
    unknown = sorted({f for f in fields if f.split(".")[0].split("[")[0] not in ("action", "observation")})
    if unknown:
        raise ValueError(
            f"prompt_template may only use {{action}} and {{observation}}, found {unknown}: "
            "write literal braces as '{{' and '}}'"
        )


def _to_float(text: str) -> Optional[float]:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _clamp(value: Optional[float], lo: float, hi: float) -> Optional[float]:
    return None if value is None else min(max(value, lo), hi)
