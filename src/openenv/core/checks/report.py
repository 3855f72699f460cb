"""What a check of an environment found: one :class:`Check` per property, in a :class:`CheckReport`.

Every check ends ``passed``, ``warning``, ``failed`` or ``skipped`` with a sentence saying why. A
report is ``ok`` when no check failed; warnings are soft problems (a trainer can live with them).
By default the check functions raise :class:`EnvCheckError` naming every failed check and issue
each warning as an :class:`EnvCheckWarning`, as Gymnasium's ``check_env`` does; with
``raise_on_failure=False`` they return the report and say nothing.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional

from ..env_server.exceptions import OpenEnvError


class Status(str, Enum):
    PASSED = "passed"
    WARNING = "warning"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass
class Check:
    """The outcome of one check: a stable ``id``, a human ``title``, and why it ended as it did."""

    id: str
    title: str
    status: Status
    detail: str = ""

    @property
    def ok(self) -> bool:
        """False only when the check failed (a warning or a skipped check is ok)."""
        return self.status is not Status.FAILED

    def to_dict(self) -> Dict[str, str]:
        return {"id": self.id, "title": self.title, "status": self.status.value, "detail": self.detail}


@dataclass
class CheckReport:
    """Every check run on one ``target``: an environment (``kind="environment"``), a package
    directory (``"package"``) or a running server (``"url"``); ``ok`` when none failed."""

    target: str
    kind: str
    name: Optional[str] = None
    checks: List[Check] = field(default_factory=list)

    def add(self, id: str, title: str, status: Status, detail: str = "") -> Check:
        check = Check(id, title, status, detail)
        self.checks.append(check)
        return check

    def get(self, id: str) -> Optional[Check]:
        """The check ``id``, or None when it was not run."""
        return next((c for c in self.checks if c.id == id), None)

    @property
    def ok(self) -> bool:
        return not any(c.status is Status.FAILED for c in self.checks)

    @property
    def failed(self) -> List[Check]:
        return [c for c in self.checks if c.status is Status.FAILED]

    @property
    def warnings(self) -> List[Check]:
        return [c for c in self.checks if c.status is Status.WARNING]

    def counts(self) -> Dict[str, int]:
        return {s.value: sum(c.status is s for c in self.checks) for s in Status}

    def to_dict(self) -> Dict[str, Any]:
        """The report as JSON data (``openenv validate --json`` prints it)."""
        return {
            "target": self.target,
            "kind": self.kind,
            "name": self.name,
            "passed": self.ok,
            "summary": self.counts(),
            "checks": [c.to_dict() for c in self.checks],
        }

    def finish(self, raise_on_failure: bool) -> CheckReport:
        """The report; with ``raise_on_failure``, each warning issued as an
        :class:`EnvCheckWarning` and :class:`EnvCheckError` raised when a check failed."""
        if not raise_on_failure:
            return self
        for check in self.warnings:
            warnings.warn(f"{self.name or self.target}: {check.id}: {check.detail}", EnvCheckWarning, stacklevel=3)
        if not self.ok:
            raise EnvCheckError(self)
        return self


class EnvCheckError(OpenEnvError):
    """An environment, package or server failed checks. The message names every failed check and
    what was wrong; ``report`` is the whole :class:`CheckReport` (``report.failed`` those checks)."""

    def __init__(self, report: CheckReport) -> None:
        self.report = report
        failed = report.failed
        lines = [f"{report.name or report.target} failed {len(failed)} check{'s' if len(failed) != 1 else ''}:"]
        lines += [f"- {c.id} ({c.title}): {c.detail}" for c in failed]
        super().__init__("\n".join(lines))


class EnvCheckWarning(UserWarning):
    """A soft problem found by a check (the environment works, but not as well as it could)."""
