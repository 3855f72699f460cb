"""Snake: steer a snake around a walled grid, eat fruit, do not bite yourself.

Each step moves the snake one cell. Eating the fruit grows it by one and pays ``fruit``; hitting
the edge or its own body kills it (``lose``) and ends the episode; filling the whole board pays
``win``; every step alive pays ``time``. Defaults: fruit +1, lose -1, win +100, time 0. The
fruit's cells are drawn from the reset's seed, so the same seed and actions replay the same game.
An action that is not a move (or would reverse the snake onto itself) is answered with ``error``
and the snake goes straight on.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any, Deque, Dict, Optional, Set, Tuple
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import EnvironmentMetadata

try:
    from ..models import BODY, CELL_CHARS, EMPTY, FRUIT, HEAD, SnakeAction, SnakeObservation, SnakeState
except ImportError:  # served from the package directory as `server.app:app`
    from models import (  # type: ignore[no-redef]
        BODY,
        CELL_CHARS,
        EMPTY,
        FRUIT,
        HEAD,
        SnakeAction,
        SnakeObservation,
        SnakeState,
    )

DEFAULT_REWARDS: Dict[str, float] = {"fruit": 1.0, "kill": 0.0, "lose": -1.0, "win": 100.0, "time": 0.0}
MIN_SIDE, MAX_SIDE = 4, 64
OBSERVERS = ("snake", "human")

HEADINGS = ("up", "right", "down", "left")  # clockwise: a right turn is +1
_VECTORS = {"up": (-1, 0), "right": (0, 1), "down": (1, 0), "left": (0, -1)}
_HUMAN = {1: "left", 2: "right", 3: "down", 4: "up"}  # observer="human"; 0 keeps the heading
_WORDS = {"straight": 0, "noop": 0, "forward": 0, "turn_left": 1, "turn_right": 2}

_ONE_HOT = {EMPTY: [0.0, 0.0, 0.0], FRUIT: [1.0, 0.0, 0.0], BODY: [0.0, 1.0, 0.0], HEAD: [0.0, 0.0, 1.0]}

Cell = Tuple[int, int]


def _turn(heading: str, turns: int) -> str:
    return HEADINGS[(HEADINGS.index(heading) + turns) % 4]


class SnakeEnvironment(Environment[SnakeAction, SnakeObservation, SnakeState]):
    """One snake on a ``height`` x ``width`` board. The constructor's arguments are the defaults of
    every episode; ``reset`` takes the same names to change them for one episode."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    SUPPORTS_SNAPSHOT = True  # its state is plain Python data: the default snapshot_state carries it exactly
    RUNS_ON_EVENT_LOOP = True  # short pure-Python calls that never block: spare the thread hand-offs

    def __init__(
        self,
        height: int = 20,
        width: int = 20,
        snake_length: int = 3,
        observer: str = "snake",
        max_episode_steps: int = 1000,
        reward_dict: Optional[Dict[str, float]] = None,
    ) -> None:
        super().__init__()
        self._defaults = dict(
            height=height,
            width=width,
            snake_length=snake_length,
            observer=observer,
            max_episode_steps=max_episode_steps,
            reward_dict=reward_dict,
        )
        self._snake: Deque[Cell] = deque()
        self._body: Set[Cell] = set()
        self._rng = random.Random()
        self.reset()

    def reset(
        self,
        seed: Optional[int] = None,
        episode_id: Optional[str] = None,
        height: Optional[int] = None,
        width: Optional[int] = None,
        snake_length: Optional[int] = None,
        observer: Optional[str] = None,
        max_episode_steps: Optional[int] = None,
        reward_dict: Optional[Dict[str, float]] = None,
        **kwargs: Any,
    ) -> SnakeObservation:
        given = dict(
            height=height,
            width=width,
            snake_length=snake_length,
            observer=observer,
            max_episode_steps=max_episode_steps,
            reward_dict=reward_dict,
        )
        options = {k: (self._defaults[k] if v is None else v) for k, v in given.items()}
        h, w, length = int(options["height"]), int(options["width"]), int(options["snake_length"])
        if not (MIN_SIDE <= h <= MAX_SIDE and MIN_SIDE <= w <= MAX_SIDE):
            raise ValueError(f"height and width must be between {MIN_SIDE} and {MAX_SIDE}, got {h} x {w}")
        if not 1 <= length <= w // 2 + 1:
            raise ValueError(f"snake_length must be between 1 and {w // 2 + 1} on a board {w} wide, got {length}")
        if options["observer"] not in OBSERVERS:
            raise ValueError(f"observer must be 'snake' or 'human', got {options['observer']!r}")
        if int(options["max_episode_steps"]) < 1:
            raise ValueError("max_episode_steps must be >= 1")
        unknown = set(options["reward_dict"] or {}) - set(DEFAULT_REWARDS)
        if unknown:
            raise ValueError(f"unknown reward_dict keys {sorted(unknown)}: use {sorted(DEFAULT_REWARDS)}")
        self._rewards = {**DEFAULT_REWARDS, **{k: float(v) for k, v in (options["reward_dict"] or {}).items()}}
        self._rng = random.Random(seed)
        row, col = h // 2, w // 2
        self._snake = deque((row, col - i) for i in range(length))
        self._body = set(self._snake)
        self._state = SnakeState(
            episode_id=episode_id or str(uuid4()),
            step_count=0,
            height=h,
            width=w,
            observer=options["observer"],
            direction="right",
            max_episode_steps=int(options["max_episode_steps"]),
        )
        self._place_fruit()
        self._sync()
        return self._observe(0.0, "Eat the fruit (*); the edges and your own body (o) are deadly.")

    def step(self, action: SnakeAction, timeout_s: Optional[float] = None, **kwargs: Any) -> SnakeObservation:
        state = self._state
        if state.done:
            return self._observe(0.0, "The game is over.", error="the episode is over: call reset() to play again")
        heading, error = self._heading(action.action)
        state.direction = heading
        reward, message = self._advance()
        state.step_count += 1
        state.score = round(state.score + reward, 6)
        if not state.done and state.step_count >= state.max_episode_steps:
            state.done, state.status = True, "truncated"
            message += f" Time is up after {state.max_episode_steps} steps."
        self._sync()
        return self._observe(reward, message, error=error)

    def _heading(self, value: Any) -> Tuple[str, Optional[str]]:
        """The new heading for an action, and an error when the action is not a legal move."""
        current = self._state.direction
        human = self._state.observer == "human"
        word = str(value).strip().lower() if isinstance(value, str) else None
        if word is not None and word.lstrip("-").isdigit():
            value, word = int(word), None
        if isinstance(value, int) and not isinstance(value, bool):
            if human and value in _HUMAN:
                target = _HUMAN[value]
            elif value in (0, 1, 2) and not human:
                return _turn(current, (0, -1, 1)[value]), None
            elif value == 0:
                return current, None
            else:
                choices = "0 (no change), 1 left, 2 right, 3 down, 4 up" if human else "0 straight, 1 left, 2 right"
                return current, f"unknown action {value!r}: with observer={self._state.observer!r} use {choices}"
        elif word in _WORDS:
            return _turn(current, (0, -1, 1)[_WORDS[word]]), None
        elif word in _VECTORS:
            target = word
        else:
            return current, (
                f"unknown action {value!r}: use an int, or one of up, down, left, right, straight, "
                "turn_left, turn_right"
            )
        if target == _turn(current, 2) and len(self._snake) > 1:
            return current, f"cannot reverse from {current} to {target}: the snake goes straight on"
        return target, None

    def _advance(self) -> Tuple[float, str]:
        state = self._state
        dr, dc = _VECTORS[state.direction]
        head = self._snake[0]
        new = (head[0] + dr, head[1] + dc)
        eats = state.fruit is not None and list(new) == state.fruit
        tail = self._snake[-1]
        inside = 0 <= new[0] < state.height and 0 <= new[1] < state.width
        if not inside or (new in self._body and (eats or new != tail)):
            state.alive, state.done, state.status = False, True, "dead"
            what = "the edge" if not inside else "its own body"
            return self._rewards["lose"], f"The snake ran into {what} at {list(new)} and died."
        self._snake.appendleft(new)
        self._body.add(new)
        reward = self._rewards["time"]
        if eats:
            state.fruits += 1
            reward += self._rewards["fruit"]
            message = f"Yum! The snake ate the fruit at {list(new)} and is now {len(self._snake)} long."
            self._place_fruit()
            if state.fruit is None:
                state.done, state.status = True, "won"
                return reward + self._rewards["win"], message + " The board is full: you win!"
            return reward, message
        self._snake.pop()
        if tail != new:
            self._body.discard(tail)
        return reward, f"The snake moved {state.direction} to {list(new)}."

    def _place_fruit(self) -> None:
        state = self._state
        free = [(r, c) for r in range(state.height) for c in range(state.width) if (r, c) not in self._body]
        state.fruit = list(self._rng.choice(free)) if free else None

    def _sync(self) -> None:
        self._state.snake = [list(cell) for cell in self._snake]

    def _observe(self, reward: float, message: str, error: Optional[str] = None) -> SnakeObservation:
        state = self._state
        grid = [[EMPTY] * state.width for _ in range(state.height)]
        if state.fruit is not None:
            grid[state.fruit[0]][state.fruit[1]] = FRUIT
        for r, c in self._snake:
            grid[r][c] = BODY
        head = self._snake[0]
        grid[head[0]][head[1]] = HEAD
        return SnakeObservation(
            grid=grid,
            observation=[[_ONE_HOT[cell] for cell in row] for row in grid],  # validation copies the lists
            episode_score=state.score,
            episode_steps=state.step_count,
            episode_fruits=state.fruits,
            episode_kills=0,
            alive=state.alive,
            text="\n".join("".join(CELL_CHARS[cell] for cell in row) for row in grid),
            direction=state.direction,
            message=message,
            error=error,
            reward=reward,
            done=state.done,
        )

    @property
    def state(self) -> SnakeState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="snake_env",
            description="Classic single-player snake on a grid with seeded fruit.",
            version="0.1.0",
        )
