"""Server side of the FinQA environment."""

from .finqa_environment import FinQAEnvironment

__all__ = ["FinQAEnvironment"]
