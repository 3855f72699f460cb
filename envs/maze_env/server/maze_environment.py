"""Maze: find the exit of a maze generated from the reset's seed.

The maze is a ``size`` x ``size`` grid (``size`` odd) carved by a randomized depth-first search:
cells sit on even coordinates, walls between them, so every open cell is reachable and there is
exactly one path between two cells. The agent starts at ``[0, 0]``; the exit is the opposite
corner. Rewards follow upstream OpenEnv's maze: a move costs :data:`MOVE_REWARD`, a move onto a
cell already visited :data:`REVISIT_REWARD`, a move into a wall or off the maze (or an action that
is not a move) :data:`INVALID_REWARD`; the exit pays :data:`EXIT_REWARD`. The episode is lost
once the total falls below ``-0.5 * size**2``.
"""

from __future__ import annotations

import random
from typing import Any, List, Optional, Set, Tuple
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import EnvironmentMetadata

try:
    from ..models import ACTION_NAMES, AGENT, CELL_CHARS, EXIT, OPEN, WALL, MazeAction, MazeObservation, MazeState
except ImportError:  # served from the package directory as `server.app:app`
    from models import (  # type: ignore[no-redef]
        ACTION_NAMES,
        AGENT,
        CELL_CHARS,
        EXIT,
        OPEN,
        WALL,
        MazeAction,
        MazeObservation,
        MazeState,
    )

MOVE_REWARD = -0.05
REVISIT_REWARD = -0.25
INVALID_REWARD = -0.75
EXIT_REWARD = 10.0
MIN_SIZE, MAX_SIZE, DEFAULT_SIZE = 3, 51, 9

_STEPS = ((0, -1), (0, 1), (-1, 0), (1, 0))  # (dcol, drow) by action id: up, down, left, right

Cell = Tuple[int, int]  # (col, row)


def generate_maze(size: int, rng: random.Random) -> List[List[int]]:
    """Rows of 0 (open) and 1 (wall): a perfect maze carved by randomized depth-first search."""
    maze = [[WALL] * size for _ in range(size)]
    maze[0][0] = OPEN
    stack: List[Cell] = [(0, 0)]
    while stack:
        col, row = stack[-1]
        options = [
            (col + 2 * dc, row + 2 * dr)
            for dc, dr in _STEPS
            if 0 <= col + 2 * dc < size and 0 <= row + 2 * dr < size and maze[row + 2 * dr][col + 2 * dc] == WALL
        ]
        if not options:
            stack.pop()
            continue
        ncol, nrow = rng.choice(options)
        maze[(row + nrow) // 2][(col + ncol) // 2] = OPEN
        maze[nrow][ncol] = OPEN
        stack.append((ncol, nrow))
    return maze


def _action_id(value: Any) -> Optional[int]:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value < len(ACTION_NAMES) else None
    text = str(value).strip().lower()
    if text in ACTION_NAMES:
        return ACTION_NAMES.index(text)
    if text.isdigit() and int(text) < len(ACTION_NAMES):
        return int(text)
    return None


class MazeEnvironment(Environment[MazeAction, MazeObservation, MazeState]):
    """A seeded maze; ``reset(seed=..., size=9)`` picks it (``size`` odd, 3 to 51)."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    SUPPORTS_SNAPSHOT = True  # its state is plain Python data: the default snapshot_state carries it exactly
    RUNS_ON_EVENT_LOOP = True  # short pure-Python calls that never block: spare the thread hand-offs

    def __init__(self) -> None:
        super().__init__()
        self._maze: List[List[int]] = []
        self._visited: Set[Cell] = set()
        self._previous: Cell = (0, 0)
        self.reset()

    def reset(
        self,
        seed: Optional[int] = None,
        episode_id: Optional[str] = None,
        size: int = DEFAULT_SIZE,
        **kwargs: Any,
    ) -> MazeObservation:
        size = int(size)
        if not MIN_SIZE <= size <= MAX_SIZE or size % 2 == 0:
            raise ValueError(
                f"size must be odd and between {MIN_SIZE} and {MAX_SIZE} (cells sit on even coordinates, "
                f"walls between them), got {size}"
            )
        self._maze = generate_maze(size, random.Random(seed))
        self._visited = {(0, 0)}
        self._previous = (0, 0)
        self._state = MazeState(
            episode_id=episode_id or str(uuid4()),
            step_count=0,
            current_position=[0, 0],
            exit_cell=[size - 1, size - 1],
            size=size,
            min_reward=-0.5 * size * size,
            visited=1,
        )
        return self._observe(0.0, f"Find the exit at [{size - 1}, {size - 1}] (E). You are at [0, 0] (A).")

    def step(self, action: MazeAction, timeout_s: Optional[float] = None, **kwargs: Any) -> MazeObservation:
        state = self._state
        if state.done:
            return self._observe(0.0, "The episode is over.", error="the episode is over: call reset() to play again")
        state.step_count += 1
        here: Cell = (state.current_position[0], state.current_position[1])
        self._previous = here
        move = _action_id(action.action)
        error: Optional[str] = None
        if move is None:
            reward, message = INVALID_REWARD, "You stay where you are."
            error = f"unknown action {action.action!r}: use 0 (up), 1 (down), 2 (left) or 3 (right)"
        else:
            name = ACTION_NAMES[move]
            target = (here[0] + _STEPS[move][0], here[1] + _STEPS[move][1])
            if not self._open(target):
                reward, message = INVALID_REWARD, f"You stay at [{here[0]}, {here[1]}]."
                blocker = "a wall" if self._inside(target) else "the edge of the maze"
                error = f"cannot move {name} from [{here[0]}, {here[1]}]: {blocker} is in the way"
            else:
                state.current_position = list(target)
                if list(target) == state.exit_cell:
                    reward, message = EXIT_REWARD, "You found the exit!"
                    state.status = "win"
                elif target in self._visited:
                    reward, message = REVISIT_REWARD, f"Moved {name} to [{target[0]}, {target[1]}] (visited before)."
                else:
                    reward, message = MOVE_REWARD, f"Moved {name} to [{target[0]}, {target[1]}]."
                self._visited.add(target)
                state.visited = len(self._visited)
        state.total_reward = round(state.total_reward + reward, 6)
        if state.status == "playing" and state.total_reward < state.min_reward:
            state.status = "lose"
            message += f" Your total reward fell below {state.min_reward:g}: you lose."
        state.done = state.status != "playing"
        return self._observe(reward, message, error=error)

    def _inside(self, cell: Cell) -> bool:
        return 0 <= cell[0] < self._state.size and 0 <= cell[1] < self._state.size

    def _open(self, cell: Cell) -> bool:
        return self._inside(cell) and self._maze[cell[1]][cell[0]] == OPEN

    def _legal_actions(self) -> List[int]:
        col, row = self._state.current_position
        return [i for i, (dc, dr) in enumerate(_STEPS) if self._open((col + dc, row + dr))]

    def _observe(self, reward: float, message: str, error: Optional[str] = None) -> MazeObservation:
        state = self._state
        grid = [list(row) for row in self._maze]
        exit_col, exit_row = state.exit_cell
        grid[exit_row][exit_col] = EXIT
        col, row = state.current_position
        grid[row][col] = AGENT
        return MazeObservation(
            legal_actions=[] if state.done else self._legal_actions(),
            current_position=list(state.current_position),
            previous_position=list(self._previous),
            grid=grid,
            text="\n".join("".join(CELL_CHARS[cell] for cell in line) for line in grid),
            message=message,
            status=state.status,
            total_reward=state.total_reward,
            error=error,
            reward=reward,
            done=state.done,
            metadata={
                "maze": [list(line) for line in self._maze],
                "status": state.status,
                "exit_cell": list(state.exit_cell),
                "step": state.step_count,
            },
        )

    @property
    def state(self) -> MazeState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="maze_env",
            description="Find the exit of a maze generated from the seed; size chosen at reset.",
            version="0.1.0",
        )
