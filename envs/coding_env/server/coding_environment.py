"""The coding environment: every step runs the agent's Python code in a fresh sandbox.

Each :class:`CodeAction` is executed by :func:`openenv.core.tools.run_python` as a script in a new
sandboxed process: no network, a private ``/workspace`` and ``/tmp``, a read-only system, a
wall-clock timeout that kills the whole process tree, a memory cap and a process cap. Nothing
survives from one step to the next (a persistent interpreter is what ``repl_env`` offers).

Reward: upstream's shaping rules, summed per step. Code matching a "dangerous" pattern
(``import os``, ``import subprocess``, ``eval(``, ``exec(``, ``__import__``, ``open(``) costs
1.0; code of at most 100 characters (stripped) earns 0.1; code that does not parse costs 0.2.
There is no task-correctness reward.

Snapshots (``EnvClient.fork`` / ``snapshot`` / ``restore``) save the episode's state: its seed
and its :class:`CodeState` (step count, last exit code), which together decide each next step's
``random`` seed and ``PYTHONHASHSEED``. No process or file lives between steps, so there is
nothing else to save. The sandbox's configuration (time and memory limits, isolation, packages,
the reward's rules) is the server's and stays the restoring server's.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass, replace
from typing import Any, Dict, Optional, Sequence, Tuple
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import EnvironmentMetadata
from openenv.core.tools import CODE_LIMITS, DEFAULT_MAX_OUTPUT_BYTES, IsolationError, run_python

try:
    from ..models import CodeAction, CodeObservation, CodeState
except ImportError:  # served from the package directory as `server.app:app`
    from models import CodeAction, CodeObservation, CodeState  # type: ignore[no-redef]

SANDBOX_ERROR_EXIT_CODE = -1
"""``exit_code`` of a step whose sandbox could not be set up (the code did not run)."""

DANGEROUS_PATTERNS = (
    r"import\s+os",
    r"import\s+subprocess",
    r"eval\(",
    r"exec\(",
    r"__import__",
    r"open\(",
)


@dataclass(frozen=True)
class ShapingReward:
    """Upstream coding_env's reward shaping: a safety penalty, a brevity bonus, a syntax penalty."""

    safety_penalty: float = -1.0
    concise_bonus: float = 0.1
    concise_max_chars: int = 100
    syntax_penalty: float = -0.2

    def __call__(self, code: str) -> Tuple[float, Optional[str]]:
        """The reward of running ``code``, and the dangerous pattern it matched (if any)."""
        reward = 0.0
        violation = next((p for p in DANGEROUS_PATTERNS if re.search(p, code)), None)
        if violation is not None:
            reward += self.safety_penalty
        if code.strip():
            if len(code.strip()) <= self.concise_max_chars:
                reward += self.concise_bonus
            try:
                ast.parse(code)
            except (SyntaxError, ValueError):  # ValueError: null bytes in the source
                reward += self.syntax_penalty
        return round(reward, 10), violation


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    try:
        return float(raw) if raw else default
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}") from None


def _env_names(name: str) -> Tuple[str, ...]:
    return tuple(part.strip() for part in os.environ.get(name, "").split(",") if part.strip())


class CodingEnvironment(Environment[CodeAction, CodeObservation, CodeState]):
    """Runs each step's code in a fresh sandboxed Python process.

    ``timeout_s`` (``$CODING_TIMEOUT_S``, default 10) bounds each step's wall-clock time; a
    step's own ``timeout_s`` may only lower it. ``memory_mb`` (``$CODING_MEMORY_MB``, default
    512) caps each process's address space; ``max_processes`` (64) caps processes and threads.
    ``isolation`` (``$CODING_ISOLATION``) is ``"sandbox"`` (bubblewrap) or ``"none"`` (a plain
    subprocess with the same limits: development only). The code imports the standard library
    only, plus ``packages`` (``$CODING_PACKAGES``, comma-separated top-level modules, e.g.
    ``numpy``; each shown read-only). With ``reset(seed=s)``, each step's
    process starts with ``random`` seeded from ``(s, step)`` and a fixed ``PYTHONHASHSEED``, so
    the same seed and the same actions give the same episode.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True
    SUPPORTS_SNAPSHOT = True
    SNAPSHOT_EXCLUDE = ("timeout_s", "limits", "max_output_bytes", "isolation", "reward", "packages")
    """The server's configuration, not the session's (see the module docstring)."""

    def __init__(
        self,
        timeout_s: Optional[float] = None,
        memory_mb: Optional[int] = None,
        max_processes: int = 64,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        isolation: Optional[str] = None,
        reward: Optional[ShapingReward] = None,
        packages: Optional[Sequence[str]] = None,
    ) -> None:
        super().__init__()
        self.timeout_s = timeout_s if timeout_s is not None else _env_float("CODING_TIMEOUT_S", 10.0)
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, not {self.timeout_s}")
        memory = memory_mb if memory_mb is not None else int(_env_float("CODING_MEMORY_MB", 512))
        self.limits = replace(CODE_LIMITS, memory_mb=memory, max_processes=max_processes)
        self.max_output_bytes = max_output_bytes
        self.isolation = isolation or os.environ.get("CODING_ISOLATION", "sandbox")
        if self.isolation not in ("sandbox", "none"):
            raise ValueError(f"isolation must be 'sandbox' or 'none', not {self.isolation!r}")
        self.reward = reward or ShapingReward()
        self.packages = tuple(packages if packages is not None else _env_names("CODING_PACKAGES"))
        self._seed: Optional[int] = None
        self._state = CodeState(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> CodeObservation:
        self._seed = seed
        self._state = CodeState(episode_id=episode_id or str(uuid4()), step_count=0, last_exit_code=0)
        return CodeObservation(stdout="", stderr="", exit_code=0, reward=0.0)

    def step(self, action: CodeAction, timeout_s: Optional[float] = None, **kwargs: Any) -> CodeObservation:
        if not isinstance(action, CodeAction):
            return CodeObservation(
                stderr=f"coding_env takes a CodeAction(code=...), not {type(action).__name__}",
                exit_code=SANDBOX_ERROR_EXIT_CODE,
                reward=0.0,
                metadata={"error": "invalid_action"},
            )
        self._state.step_count += 1
        limit = self.timeout_s if timeout_s is None else min(timeout_s, self.timeout_s)
        reward, violation = self.reward(action.code)
        metadata: Dict[str, Any] = {} if violation is None else {"safety_violation": violation}
        try:
            result = run_python(
                action.code,
                timeout_s=limit,
                limits=replace(self.limits, cpu_seconds=int(limit) + 2),
                max_output_bytes=self.max_output_bytes,
                isolation=self.isolation,  # type: ignore[arg-type]
                packages=self.packages,
                **self._seeding(),
            )
            stdout, stderr, exit_code = result.stdout, result.stderr, result.exit_code
        except (IsolationError, OSError) as exc:
            stdout, stderr, exit_code = "", f"[the sandbox could not run the code: {exc}]\n", SANDBOX_ERROR_EXIT_CODE
            metadata["error"] = "sandbox_error"
        self._state.last_exit_code = exit_code
        return CodeObservation(stdout=stdout, stderr=stderr, exit_code=exit_code, reward=reward, metadata=metadata)

    def _seeding(self) -> Dict[str, Any]:
        """Files and environment that make a seeded episode's ``random`` and ``hash`` repeatable."""
        if self._seed is None:
            return {}
        step = self._state.step_count
        hash_seed = (self._seed * 1_000_003 + step) % 2**32
        module = f"import random\nrandom.seed({f'{self._seed}:{step}'!r})\n"
        return {"files": {"sitecustomize.py": module}, "env": {"PYTHONHASHSEED": str(hash_seed)}}

    @property
    def state(self) -> CodeState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="coding_env",
            description="Python code execution: each step runs in a fresh sandboxed process",
            version="0.1.0",
        )


__all__ = [
    "DANGEROUS_PATTERNS",
    "SANDBOX_ERROR_EXIT_CODE",
    "CodingEnvironment",
    "ShapingReward",
]
