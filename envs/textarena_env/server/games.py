"""The games: Wordle, GuessTheNumber and Mastermind, written for textarena_env (no TextArena needed).

A :class:`Game` knows its rules only: the prompt, how to read a move, and what a move reveals.
Turns, invalid moves, rewards and messages are the environment's business
(see ``textarena_environment.py``).
"""

from __future__ import annotations

import random
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, List, Tuple, Type

WORDS_FILE = Path(__file__).resolve().parent.parent / "data" / "wordle_words.txt"
_BRACKETED = re.compile(r"\[([^\[\]]*)\]")


class InvalidMove(ValueError):
    """The message is not a legal move; the text says why and what a legal one looks like."""


@dataclass
class Outcome:
    """What one legal move revealed."""

    feedback: str
    signals: Dict[str, float]
    won: bool = False


@dataclass
class Game(ABC):
    """One game in progress. ``rng`` draws the secret; ``max_turns`` bounds the legal moves."""

    rng: random.Random
    max_turns: int
    moves: List[str] = field(default_factory=list)

    env_id = ""
    default_max_turns = 10

    @abstractmethod
    def prompt(self) -> str:
        """The instructions shown at the start."""

    @abstractmethod
    def play(self, message: str) -> Outcome:
        """Apply the move in ``message``; raises :class:`InvalidMove` for an illegal one."""

    @abstractmethod
    def secret(self) -> str:
        """The answer, revealed when the game ends."""

    @abstractmethod
    def progress(self) -> float:
        """How close the best move so far came to winning, in [0, 1]."""

    def snapshot(self) -> Dict[str, Any]:
        """Public state of the game (never the secret)."""
        return {"moves": list(self.moves), "turns_left": self.max_turns - len(self.moves)}


def bracketed(message: str, example: str) -> str:
    """The text of the last ``[...]`` in ``message``."""
    found = _BRACKETED.findall(message)
    if not found:
        raise InvalidMove(f"no move found: put your move in square brackets, e.g. {example}")
    return found[-1].strip()


@lru_cache(maxsize=1)
def wordle_words() -> Tuple[str, ...]:
    """The shipped word list: lower-case five-letter words, one per line (``#`` starts a comment)."""
    lines = WORDS_FILE.read_text(encoding="utf-8").splitlines()
    return tuple(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def wordle_marks(guess: str, target: str) -> str:
    """Wordle's marks for ``guess``: G right letter and place, Y letter elsewhere, X absent.

    A letter that occurs in the guess more often than in the target is marked Y only as many
    times as the target has it left over after the greens.
    """
    marks = ["X"] * len(guess)
    left: Dict[str, int] = {}
    for i, (g, t) in enumerate(zip(guess, target, strict=True)):
        if g == t:
            marks[i] = "G"
        else:
            left[t] = left.get(t, 0) + 1
    for i, g in enumerate(guess):
        if marks[i] == "X" and left.get(g, 0) > 0:
            marks[i] = "Y"
            left[g] -= 1
    return "".join(marks)


@dataclass
class Wordle(Game):
    env_id = "Wordle-v0"
    default_max_turns = 6
    target: str = ""
    best_greens: int = 0

    def __post_init__(self) -> None:
        self.target = self.rng.choice(wordle_words())

    def prompt(self) -> str:
        return (
            "You are playing Wordle. Guess the secret five-letter English word.\n"
            f"You have {self.max_turns} guesses. Write each guess in square brackets, e.g. [crane].\n"
            "After each guess you get one mark per letter: G = right letter in the right place, "
            "Y = the letter is in the word but elsewhere, X = the letter is not in the word."
        )

    def play(self, message: str) -> Outcome:
        guess = bracketed(message, "[crane]").lower()
        if len(guess) != 5 or not guess.isascii() or not guess.isalpha():
            raise InvalidMove(f"'{guess}' is not a five-letter word: guess e.g. [crane]")
        if guess in self.moves:
            raise InvalidMove(f"you already guessed '{guess}': guess a different word")
        self.moves.append(guess)
        marks = wordle_marks(guess, self.target)
        greens, yellows = marks.count("G"), marks.count("Y")
        self.best_greens = max(self.best_greens, greens)
        won = guess == self.target
        feedback = f"{' '.join(guess.upper())}\n{' '.join(marks)}"
        if not won:
            feedback += f"\nYou have {self.max_turns - len(self.moves)} guesses left."
        signals = {
            "wordle.greens": greens / 5,
            "wordle.yellows": yellows / 5,
            "wordle.repetitions": 1.0,
            "wordle.correct": float(won),
        }
        return Outcome(feedback, signals, won)

    def secret(self) -> str:
        return self.target

    def progress(self) -> float:
        return self.best_greens / 5


@dataclass
class GuessTheNumber(Game):
    env_id = "GuessTheNumber-v0"
    default_max_turns = 10
    low: int = 1
    high: int = 20
    target: int = 0
    best_distance: int = -1

    def __post_init__(self) -> None:
        self.target = self.rng.randint(self.low, self.high)

    def prompt(self) -> str:
        return (
            f"You are playing Guess The Number. The secret is a whole number from {self.low} to {self.high}.\n"
            f"You have {self.max_turns} guesses. Write each guess in square brackets, e.g. [10].\n"
            "After each guess you are told whether the secret is higher or lower."
        )

    def play(self, message: str) -> Outcome:
        text = bracketed(message, "[10]")
        if not re.fullmatch(r"[+-]?\d{1,9}", text):
            raise InvalidMove(f"'{text}' is not a whole number: guess e.g. [10]")
        guess = int(text)
        if not self.low <= guess <= self.high:
            raise InvalidMove(f"{guess} is outside {self.low}..{self.high}: guess a number in that range")
        if str(guess) in self.moves:
            raise InvalidMove(f"you already guessed {guess}: guess a different number")
        self.moves.append(str(guess))
        distance = abs(guess - self.target)
        self.best_distance = distance if self.best_distance < 0 else min(self.best_distance, distance)
        won = distance == 0
        if won:
            feedback = f"{guess} is right!"
        else:
            direction = "higher" if self.target > guess else "lower"
            feedback = f"The secret is {direction} than {guess}. {self.max_turns - len(self.moves)} guesses left."
        signals = {
            "guess_the_number.closeness": 1 - distance / (self.high - self.low),
            "guess_the_number.correct": float(won),
        }
        return Outcome(feedback, signals, won)

    def secret(self) -> str:
        return str(self.target)

    def progress(self) -> float:
        if self.best_distance < 0:
            return 0.0
        return 1 - self.best_distance / (self.high - self.low)


@dataclass
class Mastermind(Game):
    env_id = "Mastermind-v0"
    default_max_turns = 12
    code_length: int = 4
    num_digits: int = 6
    code: Tuple[int, ...] = ()
    best_blacks: int = 0

    def __post_init__(self) -> None:
        self.code = tuple(self.rng.sample(range(1, self.num_digits + 1), self.code_length))

    def prompt(self) -> str:
        return (
            f"You are playing Mastermind. The secret code is {self.code_length} different digits, "
            f"each from 1 to {self.num_digits}.\n"
            f"You have {self.max_turns} guesses. Write each guess in square brackets, e.g. [1 2 3 4].\n"
            "After each guess you get black pegs (right digit in the right place) and white pegs "
            "(right digit in the wrong place)."
        )

    def play(self, message: str) -> Outcome:
        example = "[" + " ".join(str(d) for d in range(1, self.code_length + 1)) + "]"
        text = bracketed(message, example)
        parts = text.replace(",", " ").split()
        if len(parts) == 1:
            parts = list(parts[0])
        if len(parts) != self.code_length or not all(p.isdigit() and 1 <= int(p) <= self.num_digits for p in parts):
            raise InvalidMove(
                f"'{text}' is not {self.code_length} digits from 1 to {self.num_digits}: guess e.g. {example}"
            )
        guess = tuple(int(p) for p in parts)
        key = " ".join(parts)
        if key in self.moves:
            raise InvalidMove(f"you already guessed [{key}]: guess a different code")
        self.moves.append(key)
        blacks = sum(g == c for g, c in zip(guess, self.code, strict=True))
        common = sum(min(guess.count(d), self.code.count(d)) for d in set(guess))
        whites = common - blacks
        self.best_blacks = max(self.best_blacks, blacks)
        won = blacks == self.code_length
        feedback = f"[{key}]: {blacks} black, {whites} white."
        if not won:
            feedback += f" {self.max_turns - len(self.moves)} guesses left."
        signals = {
            "mastermind.blacks": blacks / self.code_length,
            "mastermind.whites": whites / self.code_length,
            "mastermind.correct": float(won),
        }
        return Outcome(feedback, signals, won)

    def secret(self) -> str:
        return " ".join(str(d) for d in self.code)

    def progress(self) -> float:
        return self.best_blacks / self.code_length


GAMES: Dict[str, Type[Game]] = {cls.env_id: cls for cls in (Wordle, GuessTheNumber, Mastermind)}


def game_class(name: str) -> Type[Game]:
    """The game called ``name``: its ``env_id`` (``"Wordle-v0"``) or a looser spelling (``"wordle"``,
    ``"guess_the_number"``); raises ``ValueError`` naming the games there are."""
    wanted = re.sub(r"[-_ ]|v0$", "", name.strip().lower().removesuffix("-v0"))
    for env_id, cls in GAMES.items():
        if env_id.lower().removesuffix("-v0") == wanted:
            return cls
    raise ValueError(f"unknown game {name!r}: choose one of {', '.join(GAMES)}")
