"""Grid World: walk from the top-left corner to the goal in the bottom-right one.

Walls block a move (the agent stays put), pits end the episode. Every move costs
:data:`STEP_REWARD`; the goal pays :data:`GOAL_REWARD`, a pit :data:`PIT_REWARD`. After
``max_steps`` moves the episode is cut off (``truncated``). The walls and pits are drawn from the
reset's seed, always leaving a path to the goal.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any, List, Optional, Set, Tuple
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import EnvironmentMetadata

try:
    from ..models import (
        AGENT,
        CELL_CHARS,
        EMPTY,
        GOAL,
        PIT,
        WALL,
        GridWorldAction,
        GridWorldObservation,
        GridWorldState,
        MoveAction,
    )
except ImportError:  # served from the package directory as `server.app:app`
    from models import (  # type: ignore[no-redef]
        AGENT,
        CELL_CHARS,
        EMPTY,
        GOAL,
        PIT,
        WALL,
        GridWorldAction,
        GridWorldObservation,
        GridWorldState,
        MoveAction,
    )

STEP_REWARD = -0.1
GOAL_REWARD = 1.0
PIT_REWARD = -1.0
MIN_SIZE, MAX_SIZE = 2, 32
_LAYOUT_TRIES = 200

_MOVES = {
    MoveAction.UP.value: (-1, 0),
    MoveAction.DOWN.value: (1, 0),
    MoveAction.LEFT.value: (0, -1),
    MoveAction.RIGHT.value: (0, 1),
}

Cell = Tuple[int, int]


def _move_name(action: Any) -> str:
    value = action.value if isinstance(action, MoveAction) else action
    return str(value).strip().upper()


def _reachable(size: int, blocked: Set[Cell], start: Cell, goal: Cell) -> bool:
    seen, queue = {start}, deque([start])
    while queue:
        x, y = queue.popleft()
        if (x, y) == goal:
            return True
        for dx, dy in _MOVES.values():
            nxt = (x + dx, y + dy)
            if 0 <= nxt[0] < size and 0 <= nxt[1] < size and nxt not in blocked and nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return False


def _layout(rng: random.Random, size: int, num_walls: int, num_pits: int) -> Tuple[Set[Cell], Set[Cell]]:
    """Walls and pits on distinct cells, leaving the corners free and a path between them."""
    start, goal = (0, 0), (size - 1, size - 1)
    free = [(x, y) for x in range(size) for y in range(size) if (x, y) not in (start, goal)]
    if num_walls + num_pits > len(free):
        raise ValueError(
            f"{num_walls} walls and {num_pits} pits do not fit on a {size}x{size} grid "
            f"({len(free)} free cells): lower num_walls or num_pits"
        )
    for _ in range(_LAYOUT_TRIES):
        cells = rng.sample(free, num_walls + num_pits)
        walls, pits = set(cells[:num_walls]), set(cells[num_walls:])
        if _reachable(size, walls | pits, start, goal):
            return walls, pits
    raise ValueError(
        f"no layout of {num_walls} walls and {num_pits} pits on a {size}x{size} grid left a path to the goal "
        f"in {_LAYOUT_TRIES} tries: lower num_walls or num_pits"
    )


class GridWorldEnvironment(Environment[GridWorldAction, GridWorldObservation, GridWorldState]):
    """A seeded grid with walls and pits; ``reset(size=, num_walls=, num_pits=, max_steps=)`` picks
    the layout's parameters (defaults: 5, ``size**2//8``, ``size**2//12``, ``4 * size**2``)."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    SUPPORTS_SNAPSHOT = True  # its state is plain Python data: the default snapshot_state carries it exactly
    RUNS_ON_EVENT_LOOP = True  # short pure-Python calls that never block: spare the thread hand-offs

    def __init__(self) -> None:
        super().__init__()
        self._walls: Set[Cell] = set()
        self._pits: Set[Cell] = set()
        self.reset()

    def reset(
        self,
        seed: Optional[int] = None,
        episode_id: Optional[str] = None,
        size: int = 5,
        num_walls: Optional[int] = None,
        num_pits: Optional[int] = None,
        max_steps: Optional[int] = None,
        **kwargs: Any,
    ) -> GridWorldObservation:
        if not MIN_SIZE <= int(size) <= MAX_SIZE:
            raise ValueError(f"size must be between {MIN_SIZE} and {MAX_SIZE}, got {size}")
        size = int(size)
        walls = size * size // 8 if num_walls is None else int(num_walls)
        pits = size * size // 12 if num_pits is None else int(num_pits)
        limit = 4 * size * size if max_steps is None else int(max_steps)
        if walls < 0 or pits < 0 or limit < 1:
            raise ValueError("num_walls and num_pits must be >= 0 and max_steps >= 1")
        self._walls, self._pits = _layout(random.Random(seed), size, walls, pits)
        self._state = GridWorldState(
            episode_id=episode_id or str(uuid4()),
            step_count=0,
            size=size,
            x=0,
            y=0,
            goal=[size - 1, size - 1],
            walls=sorted([list(c) for c in self._walls]),
            pits=sorted([list(c) for c in self._pits]),
            max_steps=limit,
        )
        goal = f"[{size - 1}, {size - 1}]"
        return self._observe(0.0, f"Welcome to Grid World! Reach the goal at {goal}; avoid the pits (O).")

    def step(self, action: GridWorldAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GridWorldObservation:
        state = self._state
        if state.done:
            return self._observe(0.0, "The episode is over.", error="the episode is over: call reset() to play again")
        name = _move_name(action.action)
        state.step_count += 1
        if name not in _MOVES:
            reward, message = STEP_REWARD, "You stay where you are."
            error = f"unknown action {action.action!r}: use one of UP, DOWN, LEFT, RIGHT"
        else:
            reward, message, error = self._move(name)
        state.total_reward = round(state.total_reward + reward, 6)
        if not state.done and state.step_count >= state.max_steps:
            state.done, state.status = True, "truncated"
            message += f" Out of moves after {state.max_steps} steps."
        return self._observe(reward, message, error=error)

    def _move(self, name: str) -> Tuple[float, str, None]:
        state = self._state
        dx, dy = _MOVES[name]
        x, y = state.x + dx, state.y + dy
        if not (0 <= x < state.size and 0 <= y < state.size):
            return STEP_REWARD, f"Moving {name} would leave the grid; you stay at [{state.x}, {state.y}].", None
        if (x, y) in self._walls:
            return STEP_REWARD, f"A wall blocks {name}; you stay at [{state.x}, {state.y}].", None
        state.x, state.y = x, y
        if (x, y) in self._pits:
            state.done, state.status = True, "fell"
            return PIT_REWARD, f"You fell into a pit at [{x}, {y}].", None
        if [x, y] == state.goal:
            state.done, state.status = True, "won"
            return GOAL_REWARD, "You found the goal!", None
        return STEP_REWARD, f"Moved {name} to [{x}, {y}]. Keep going...", None

    def _board(self) -> List[List[int]]:
        state = self._state
        grid = [[EMPTY] * state.size for _ in range(state.size)]
        for x, y in self._walls:
            grid[x][y] = WALL
        for x, y in self._pits:
            grid[x][y] = PIT
        grid[state.goal[0]][state.goal[1]] = GOAL
        grid[state.x][state.y] = AGENT
        return grid

    def _observe(self, reward: float, message: str, error: Optional[str] = None) -> GridWorldObservation:
        state = self._state
        grid = self._board()
        return GridWorldObservation(
            x=state.x,
            y=state.y,
            message=message,
            grid=grid,
            text="\n".join("".join(CELL_CHARS[cell] for cell in row) for row in grid),
            goal=list(state.goal),
            steps_left=state.max_steps - state.step_count,
            truncated=state.status == "truncated",
            error=error,
            reward=reward,
            done=state.done,
        )

    @property
    def state(self) -> GridWorldState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="grid_world_env",
            description="Walk UP/DOWN/LEFT/RIGHT past walls and pits to the goal of a seeded grid.",
            version="0.1.0",
        )
