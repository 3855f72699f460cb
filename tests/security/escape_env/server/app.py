"""An environment that executes the code of each action in the server process: hostile on purpose.

Only for the escape tests. The code runs with ``exec``; whatever it leaves in ``result`` comes back
as ``repr`` in the observation, an exception as ``error``. The code sees ``IMPORT_PROBES``: what the
probes of :mod:`probes` got when this module was imported, i.e. with the privileges package code
has at import time.
"""

from __future__ import annotations

import traceback
from typing import Any, Optional

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

try:
    from . import probes
except ImportError:  # served from the package directory as `server.app:app`
    from server import probes  # type: ignore[no-redef]

IMPORT_PROBES = probes.all_probes()


class CodeAction(Action):
    code: str


class CodeObservation(Observation):
    result: str = ""
    error: str = ""


class EscapeEnv(Environment[CodeAction, CodeObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id="escape", step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> CodeObservation:
        return CodeObservation(result="ready")

    def step(self, action: CodeAction, timeout_s: Optional[float] = None, **kwargs: Any) -> CodeObservation:
        self._state.step_count += 1
        scope: dict = {"IMPORT_PROBES": IMPORT_PROBES, "probes": probes}
        try:
            exec(action.code, scope)
        except BaseException as exc:  # report everything, MemoryError included
            return CodeObservation(error=f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=2)}")
        return CodeObservation(result=repr(scope.get("result")))

    @property
    def state(self) -> State:
        return self._state


app = create_app(EscapeEnv, CodeAction, CodeObservation, env_name="escape_env", max_concurrent_envs=8)
