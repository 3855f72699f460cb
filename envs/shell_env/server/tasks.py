"""Tasks shipped as data: an instruction, the files the work directory starts with, a check."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

TASKS_FILE = Path(__file__).resolve().parent / "tasks.json"


@dataclass(frozen=True)
class Task:
    """One task. ``check`` is a bash command run in the work directory: exit status 0 means solved.

    ``setup`` (optional) is a bash command run once after the files are written (it may build
    state that files alone cannot, such as a git history). It ships with the package and is
    trusted: it runs in the work directory without a sandbox of its own. ``check`` runs sandboxed.
    """

    id: str
    instruction: str
    check: str
    files: Dict[str, str] = field(default_factory=dict)
    executable: Tuple[str, ...] = ()
    setup: Optional[str] = None

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> Task:
        unknown = set(data) - {"id", "instruction", "check", "files", "executable", "setup"}
        if unknown:
            raise ValueError(f"task {data.get('id')!r} has unknown keys {sorted(unknown)}")
        return cls(
            id=data["id"],
            instruction=data["instruction"],
            check=data["check"],
            files=dict(data.get("files") or {}),
            executable=tuple(data.get("executable") or ()),
            setup=data.get("setup"),
        )


def load_tasks(path: Path = TASKS_FILE) -> List[Task]:
    """The tasks of a JSON file ``{"tasks": [...]}``, in file order; ids must be unique."""
    tasks = [Task.from_dict(entry) for entry in json.loads(path.read_text())["tasks"]]
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate task ids in {path}")
    return tasks


def pick_task(tasks: Sequence[Task], seed: Optional[int], task_id: Optional[str], fallback: int) -> Task:
    """``task_id`` if given, else task number ``seed % len(tasks)``, else task number ``fallback``."""
    if task_id is not None:
        for task in tasks:
            if task.id == task_id:
                return task
        raise ValueError(f"unknown task_id {task_id!r}; known: {', '.join(t.id for t in tasks)}")
    index = seed if seed is not None else fallback
    return tasks[index % len(tasks)]
