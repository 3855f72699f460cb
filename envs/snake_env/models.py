"""What an agent sends to the Snake environment and what it sees back.

Cells are addressed ``[row, col]`` with ``[0, 0]`` at the top-left.
"""

from __future__ import annotations

from typing import List, Optional, Union

from pydantic import Field, StrictInt

from openenv.core.env_server.types import Action, Observation, State

EMPTY, FRUIT, BODY, HEAD = 0, 1, 2, 3
"""Cell codes of ``SnakeObservation.grid``."""

CELL_CHARS = {EMPTY: ".", FRUIT: "*", BODY: "o", HEAD: "@"}
"""How ``SnakeObservation.text`` draws each cell code."""

CHANNELS = ("fruit", "body", "head")
"""The channels of ``SnakeObservation.observation``, in order."""


class SnakeAction(Action):
    """Where to steer the snake.

    With ``observer="snake"`` (the default), an int is relative to the heading: ``0`` straight
    on, ``1`` turn left, ``2`` turn right. With ``observer="human"`` it is absolute: ``0`` no
    change, ``1`` left, ``2`` right, ``3`` down, ``4`` up. Words work in both modes: ``"up"``,
    ``"down"``, ``"left"``, ``"right"`` (absolute), ``"straight"``, ``"turn_left"``, ``"turn_right"``.
    """

    action: Union[StrictInt, str] = Field(
        ..., description="0 straight, 1 turn left, 2 turn right (observer 'snake'); or a word such as 'up'."
    )


class SnakeObservation(Observation):
    """The board as codes, as channels and as text, and the episode's counters."""

    grid: List[List[int]] = Field(
        default_factory=list, description="Rows of cell codes: 0 empty, 1 fruit, 2 body, 3 head."
    )
    observation: List[List[List[float]]] = Field(
        default_factory=list, description="Height x width x 3 one-hot channels: fruit, body, head."
    )
    episode_score: float = Field(0.0, description="Reward so far in this episode.")
    episode_steps: int = Field(0, description="Moves made in this episode.")
    episode_fruits: int = Field(0, description="Fruit eaten in this episode.")
    episode_kills: int = Field(0, description="Always 0: there is one snake.")
    alive: bool = Field(True, description="False once the snake hit a wall or itself.")
    text: str = Field("", description="The board drawn with . * o @, one line per row.")
    direction: str = Field("right", description="The snake's heading: up, down, left or right.")
    message: str = Field("", description="What happened, in words.")
    error: Optional[str] = Field(None, description="Why the action was refused, when it was.")


class SnakeState(State):
    """The episode: the board's size, the snake (head first), the fruit and the counters."""

    height: int = 20
    width: int = 20
    observer: str = "snake"
    direction: str = "right"
    snake: List[List[int]] = Field(default_factory=list)
    fruit: Optional[List[int]] = None
    alive: bool = True
    done: bool = False
    status: str = "playing"
    """``playing``, ``dead``, ``won`` (the snake fills the board) or ``truncated``."""
    score: float = 0.0
    fruits: int = 0
    max_episode_steps: int = 1000
