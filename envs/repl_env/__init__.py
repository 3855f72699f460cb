"""The REPL environment: a persistent sandboxed Python interpreter per session, with a task."""

from .client import REPLEnv
from .models import CodeBlockResult, REPLAction, REPLObservation, REPLState

__all__ = ["CodeBlockResult", "REPLAction", "REPLEnv", "REPLObservation", "REPLState"]
