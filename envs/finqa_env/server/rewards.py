"""Scoring a submitted answer against the ground truth.

* The answer may wrap its value in ``\\boxed{...}``; the box's content is what counts.
* ``number`` and ``percent`` answers: the first number in the answer (``$``, ``,``, ``%`` and
  words around it are ignored) must be within 1% of the truth, or within 0.01. A ``percent`` answer
  may also be given as a fraction (``0.2848`` for ``28.48``).
* ``integer`` answers (years, counts, head counts) must be exact.
* ``text`` answers (a company or segment name) must match, ignoring case, spaces and punctuation.
"""

from __future__ import annotations

import re
from typing import Optional

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_NUMBER = re.compile("[-+\u2212]?\\d[\\d,]*(?:\\.\\d+)?|[-+\u2212]?\\.\\d+")


def extract_answer(text: str) -> str:
    """The content of the last ``\\boxed{...}``, else the whole text, stripped."""
    boxed = _BOXED.findall(text)
    return (boxed[-1] if boxed else text).strip()


def parse_number(text: str) -> Optional[float]:
    """The first number in ``text`` (``-1,234.5`` → -1234.5), or None."""
    match = _NUMBER.search(text)
    if match is None:
        return None
    token = match.group(0).replace(",", "").replace("\u2212", "-")
    try:
        value = float(token)
    except ValueError:
        return None
    if value >= 0 and re.search(r"\(\s*$", text[: match.start()]):  # accounting negative: (12.5)
        value = -value
    return value


def _close(value: float, truth: float) -> bool:
    return abs(value - truth) <= max(0.01 * abs(truth), 0.01)


def _words(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()


def compute_reward(submitted: str, truth: str, answer_type: str = "number") -> float:
    """1.0 when ``submitted`` matches ``truth`` under the rules of the module docstring, else 0.0."""
    answer = extract_answer(submitted)
    if answer_type == "text":
        return float(_words(answer) == _words(truth))
    value, expected = parse_number(answer), float(truth)
    if value is None:
        return 0.0
    if answer_type == "integer":
        return float(value == expected)
    if _close(value, expected):
        return 1.0
    if answer_type == "percent" and "%" not in answer and _close(value * 100, expected):
        return 1.0
    return 0.0
