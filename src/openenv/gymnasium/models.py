"""What a client sends to a served Gymnasium environment and what it gets back.

Values travel in the JSON form of :mod:`openenv.gymnasium.spaces`: an int for ``Discrete``,
nested lists for ``Box``, ``MultiDiscrete`` and ``MultiBinary``, an object for ``Dict``, a list
for ``Tuple``. The spaces themselves come with every reset observation, described the same way.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from pydantic import Field

from openenv.core.env_server.types import Action, Observation, State


class GymnasiumAction(Action):
    """One action of the served environment's action space, in JSON form."""

    action: Any = Field(
        ...,
        description="The action: an int (Discrete), nested lists (Box, MultiDiscrete, MultiBinary), "
        "an object (Dict) or a list (Tuple).",
        # Any JSON value but null; its space, known at reset, is checked by the server.
        json_schema_extra={"type": ["integer", "number", "string", "boolean", "array", "object"]},
    )


class GymnasiumObservation(Observation):
    """What Gymnasium's ``reset`` or ``step`` returned: ``observation`` in JSON form, ``terminated``,
    ``truncated`` and ``info`` (``reward`` and ``done = terminated or truncated`` as always). A
    reset observation also names the environment and describes its spaces."""

    observation: Any = Field(None, description="The observation in JSON form.")
    terminated: bool = Field(False, description="The episode reached a terminal state.")
    truncated: bool = Field(False, description="The episode was cut off (a time limit).")
    info: Dict[str, Any] = Field(default_factory=dict, description="Gymnasium's info dict (arrays as lists).")
    env_id: Optional[str] = Field(None, description="The Gymnasium id served (reset observations only).")
    action_space: Optional[Dict[str, Any]] = Field(None, description="The action space (reset observations only).")
    observation_space: Optional[Dict[str, Any]] = Field(
        None, description="The observation space (reset observations only)."
    )


class GymnasiumState(State):
    """The session's environment and episode."""

    env_id: Optional[str] = None
    make_kwargs: Dict[str, Any] = Field(default_factory=dict)
    seed: Optional[int] = None
    total_reward: float = 0.0
    done: bool = False
