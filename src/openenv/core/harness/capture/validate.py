"""Checks on captured turns, training sequences and whole rollouts.

Each check returns a :class:`Report` of :class:`Finding` s. A ``FATAL`` finding means the data
cannot be trained on as it is (a turn's logprobs are dropped at ingest, a rollout refuses to become
a :class:`~openenv.core.harness.training.TrainingTrace`); a ``WARN`` is worth a look but harmless.
Findings render as ``[LEVEL] code: detail``, the form rollout documents carry them in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Iterator, List

from openenv.core.harness.training import training_turn_problems, validate_training_turn

if TYPE_CHECKING:  # pragma: no cover
    from openenv.core.harness.capture.graph import RolloutGraph, TrainingSequence, TurnNode

__all__ = [
    "FATAL",
    "WARN",
    "Finding",
    "Report",
    "check_rollout",
    "check_sequence",
    "check_turn",
    "check_turn_eval",
    "validate_training_turn",
]

FATAL = "FATAL"
WARN = "WARN"


@dataclass(frozen=True)
class Finding:
    """One thing a check found: ``level`` (``FATAL``/``WARN``), a stable ``code``, a ``detail``."""

    level: str
    code: str
    detail: str = ""

    def __str__(self) -> str:
        return f"[{self.level}] {self.code}: {self.detail}"

    @property
    def fatal(self) -> bool:
        return self.level == FATAL

    def to_dict(self) -> Dict[str, str]:
        return {"level": self.level, "code": self.code, "detail": self.detail}

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> Finding:
        return cls(level=str(data["level"]), code=str(data["code"]), detail=str(data.get("detail", "")))


@dataclass
class Report:
    """The findings of one or more checks; ``ok`` when none is ``FATAL``."""

    findings: List[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(f.fatal for f in self.findings)

    @property
    def fatal(self) -> List[Finding]:
        return [f for f in self.findings if f.fatal]

    def add(self, level: str, code: str, detail: str = "") -> None:
        self.findings.append(Finding(level, code, detail))

    def extend(self, other: Report | List[Finding]) -> None:
        self.findings.extend(other.findings if isinstance(other, Report) else other)

    def lines(self) -> List[str]:
        """The findings rendered ``[LEVEL] code: detail``."""
        return [str(f) for f in self.findings]

    def __iter__(self) -> Iterator[Finding]:
        return iter(self.findings)

    def __str__(self) -> str:
        return "\n".join(self.lines()) if self.findings else "ok"


def _turn_warnings(node: TurnNode, report: Report) -> None:
    if not node.sampled_ids:
        report.add(WARN, "no_sampled_ids", f"turn {node.node_id} has no sampled token ids")
    if node.finish_reason == "length":
        report.add(WARN, "truncated_turn", f"turn {node.node_id} stopped at its output cap (finish_reason length)")


def check_turn(node: TurnNode, *, checked_prefix: int = 0) -> Report:
    """A turn captured at level tokens. FATAL: ``invalid_token_id``, ``invalid_logprob``,
    ``positive_logprob``, ``no_prompt_ids``, ``no_logprobs``, ``logprob_misalign``; WARN:
    ``no_sampled_ids``, ``truncated_turn``. ``checked_prefix``: leading prompt ids known good."""
    report = Report()
    problems = training_turn_problems(
        node.prompt_ids, node.sampled_ids, node.sampled_logprobs, checked_prefix=checked_prefix
    )
    for code, detail in problems:
        report.add(FATAL, code, f"turn {node.node_id}: {detail}")
    _turn_warnings(node, report)
    return report


def check_turn_eval(node: TurnNode) -> Report:
    """A turn captured below level tokens (or for evaluation): nothing is trained, so what
    :func:`check_turn` calls fatal is only a warning here, and missing ids/logprobs are expected."""
    report = Report()
    expected = {"no_prompt_ids", "no_logprobs"} | (set() if node.sampled_ids else {"logprob_misalign"})
    for code, detail in training_turn_problems(node.prompt_ids, node.sampled_ids, node.sampled_logprobs):
        if code not in expected:
            report.add(WARN, code, f"turn {node.node_id}: {detail}")
    if node.finish_reason == "length":
        report.add(WARN, "truncated_turn", f"turn {node.node_id} stopped at its output cap (finish_reason length)")
    return report


def check_sequence(sequence: TrainingSequence) -> Report:
    """A training row. FATAL: ``nothing_trainable`` (no mask 1), ``masked_has_logprob`` (a
    logprob where the mask is 0), ``empty_response`` (its last turn sampled nothing)."""
    report = Report()
    if not any(sequence.loss_mask):
        report.add(
            FATAL, "nothing_trainable", f"the sequence ending at {sequence.node_ids[-1:]} has no trainable token"
        )
    for i, (mask, logprob) in enumerate(zip(sequence.loss_mask, sequence.logprobs, strict=False)):
        if not mask and logprob != 0.0:
            report.add(FATAL, "masked_has_logprob", f"position {i} is masked but carries logprob {logprob}")
            break
    if sequence.turn_lengths and sequence.turn_lengths[-1] == 0:
        report.add(FATAL, "empty_response", f"the last turn {sequence.node_ids[-1]} sampled no tokens")
    return report


def check_rollout(graph: RolloutGraph) -> Report:
    """A whole rollout. FATAL: ``no_turns``. WARN: ``per_turn_capture_only`` (turns not linked by
    token prefix: each is trainable alone, not as one sequence), ``multiple_roots``,
    ``degenerate_rollout`` (no turn sampled anything), ``discarded_turns``."""
    report = Report()
    nodes = list(graph.nodes.values())
    if not nodes:
        report.add(FATAL, "no_turns", "the rollout has no captured model call")
        return report
    roots = graph.roots()
    if len(nodes) > 1 and len(roots) == len(nodes):
        report.add(
            WARN,
            "per_turn_capture_only",
            f"none of the {len(nodes)} turns extends another's tokens (the harness re-renders its history?)",
        )
    elif len(roots) > 1:
        report.add(WARN, "multiple_roots", f"{len(roots)} independent conversations (sub-agents or restarts)")
    if not any(node.sampled_ids for node in nodes):
        report.add(WARN, "degenerate_rollout", "no turn sampled a token")
    discarded = graph.discarded_nodes()
    if discarded:
        report.add(
            WARN, "discarded_turns", f"{len(discarded)} turns were abandoned by the harness (retried or branched away)"
        )
    return report
