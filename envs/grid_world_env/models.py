"""What an agent sends to the Grid World environment and what it sees back.

Positions follow upstream OpenEnv's Grid World: ``x`` is the row (``UP`` lowers it) and ``y`` the
column (``LEFT`` lowers it); ``(0, 0)`` is the top-left corner.
"""

from __future__ import annotations

from enum import Enum
from typing import List, Optional, Union

from pydantic import Field

from openenv.core.env_server.types import Action, Observation, State

EMPTY, WALL, PIT, GOAL, AGENT = 0, 1, 2, 3, 4
"""Cell codes of ``GridWorldObservation.grid``."""

CELL_CHARS = {EMPTY: ".", WALL: "#", PIT: "O", GOAL: "G", AGENT: "A"}
"""How ``GridWorldObservation.text`` draws each cell code."""


class MoveAction(str, Enum):
    """The four moves."""

    UP = "UP"
    DOWN = "DOWN"
    LEFT = "LEFT"
    RIGHT = "RIGHT"


class GridWorldAction(Action):
    """One move. Any string is accepted on the wire (case-insensitive); one that is not a move
    is answered with an error observation."""

    action: Union[MoveAction, str] = Field(..., description="The direction to move: UP, DOWN, LEFT or RIGHT.")


class GridWorldObservation(Observation):
    """The agent's position, the board as codes and as text, and what the last move did."""

    x: int = Field(0, description="Row of the agent (0 = top).")
    y: int = Field(0, description="Column of the agent (0 = left).")
    message: str = Field("", description="What happened, in words.")
    grid: List[List[int]] = Field(
        default_factory=list, description="Rows of cell codes: 0 empty, 1 wall, 2 pit, 3 goal, 4 agent."
    )
    text: str = Field("", description="The board drawn with . # O G A, one line per row.")
    goal: List[int] = Field(default_factory=list, description="The goal as [x, y].")
    steps_left: int = Field(0, description="Moves left before the episode is cut off.")
    truncated: bool = Field(False, description="The episode ended because it ran out of moves.")
    error: Optional[str] = Field(None, description="Why the action was refused, when it was.")


class GridWorldState(State):
    """The episode: layout parameters, where the agent is, and how it is going."""

    size: int = 5
    x: int = 0
    y: int = 0
    goal: List[int] = Field(default_factory=list)
    walls: List[List[int]] = Field(default_factory=list)
    pits: List[List[int]] = Field(default_factory=list)
    max_steps: int = 0
    total_reward: float = 0.0
    done: bool = False
    status: str = "playing"
    """``playing``, ``won`` (reached the goal), ``fell`` (into a pit) or ``truncated``."""
