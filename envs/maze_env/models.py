"""What an agent sends to the Maze environment and what it sees back.

Positions are ``[col, row]`` with ``[0, 0]`` at the top-left, as in upstream OpenEnv's maze.
"""

from __future__ import annotations

from typing import List, Optional, Union

from pydantic import Field, StrictInt

from openenv.core.env_server.types import Action, Observation, State

OPEN, WALL, EXIT, AGENT = 0, 1, 2, 3
"""Cell codes of ``MazeObservation.grid``."""

CELL_CHARS = {OPEN: ".", WALL: "#", EXIT: "E", AGENT: "A"}
"""How ``MazeObservation.text`` draws each cell code."""

ACTION_NAMES = ("up", "down", "left", "right")
"""The moves by action id: ``0`` up, ``1`` down, ``2`` left, ``3`` right."""


class MazeAction(Action):
    """One move: its id (0 up, 1 down, 2 left, 3 right) or its name (``"left"``, any case).
    Anything else is answered with an error observation."""

    action: Union[StrictInt, str] = Field(..., description="0 = up, 1 = down, 2 = left, 3 = right (or the word).")


class MazeObservation(Observation):
    """Where the agent is, which moves are open, and the maze as codes and as text.

    ``metadata`` carries, as upstream's does, ``maze`` (0 open, 1 wall), ``status``,
    ``exit_cell`` and ``step``.
    """

    legal_actions: List[int] = Field(default_factory=list, description="Action ids that do not hit a wall.")
    current_position: List[int] = Field(default_factory=list, description="The agent as [col, row].")
    previous_position: List[int] = Field(default_factory=list, description="Where the agent was before this step.")
    grid: List[List[int]] = Field(
        default_factory=list, description="Rows of cell codes: 0 open, 1 wall, 2 exit, 3 agent."
    )
    text: str = Field("", description="The maze drawn with . # E A, one line per row.")
    message: str = Field("", description="What happened, in words.")
    status: str = Field("playing", description="playing, win or lose.")
    total_reward: float = Field(0.0, description="Reward so far in this episode.")
    error: Optional[str] = Field(None, description="Why the move was refused, when it was.")


class MazeState(State):
    """The episode: the maze's size, the agent, the exit and how it is going."""

    done: bool = False
    current_position: List[int] = Field(default_factory=list)
    exit_cell: List[int] = Field(default_factory=list)
    status: str = "playing"
    size: int = 0
    total_reward: float = 0.0
    min_reward: float = 0.0
    """The episode is lost once ``total_reward`` falls below this floor."""
    visited: int = 0
    """How many distinct cells the agent has stood on."""
