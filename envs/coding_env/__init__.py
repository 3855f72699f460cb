"""The coding environment: each step runs Python code in a fresh sandboxed process."""

from .client import CodingEnv
from .models import CodeAction, CodeObservation, CodeState

__all__ = ["CodeAction", "CodeObservation", "CodeState", "CodingEnv"]
