"""Server-side exceptions."""

from __future__ import annotations

from typing import Optional


class OpenEnvError(Exception):
    """Base of OpenEnv's server-side exceptions."""


class ConcurrencyConfigurationError(OpenEnvError):
    """More than one session was asked of an environment that does not support it."""

    def __init__(self, environment_name: str, max_concurrent_envs: int, message: Optional[str] = None) -> None:
        self.environment_name = environment_name
        self.max_concurrent_envs = max_concurrent_envs
        if message is None:
            message = (
                f"Environment '{environment_name}' is not marked as safe for concurrent sessions "
                f"(SUPPORTS_CONCURRENT_SESSIONS = False), but max_concurrent_envs={max_concurrent_envs}. "
                "Set SUPPORTS_CONCURRENT_SESSIONS = True on the class if its instances share no "
                "state, or use max_concurrent_envs=1."
            )
        self.message = message
        super().__init__(message)


class SessionCapacityError(OpenEnvError):
    """The server already holds as many sessions as it may."""

    def __init__(self, active_sessions: int, max_sessions: int, message: Optional[str] = None) -> None:
        self.active_sessions = active_sessions
        self.max_sessions = max_sessions
        if message is None:
            message = (
                f"Server at capacity: {active_sessions}/{max_sessions} sessions active. Cannot accept new connections."
            )
        self.message = message
        super().__init__(message)


class SessionNotFoundError(OpenEnvError):
    def __init__(self, session_id: str, message: Optional[str] = None) -> None:
        self.session_id = session_id
        self.message = message or f"Unknown session_id: {session_id}"
        super().__init__(self.message)


class SessionCreationError(OpenEnvError):
    def __init__(self, reason: str, message: Optional[str] = None) -> None:
        self.reason = reason
        self.message = message or f"Failed to create session: {reason}"
        super().__init__(self.message)


class EnvironmentFactoryError(OpenEnvError):
    """The environment factory raised while building a session's environment."""

    def __init__(self, factory_name: str, message: Optional[str] = None) -> None:
        self.factory_name = factory_name
        self.message = message or f"Environment factory '{factory_name}' failed to create instance."
        super().__init__(self.message)


class StepTimeoutError(OpenEnvError, TimeoutError):
    """An environment call ran past the server's step timeout."""

    def __init__(self, operation: str, timeout_s: float) -> None:
        self.operation = operation
        self.timeout_s = timeout_s
        self.message = (
            f"{operation} did not finish within the server's step timeout of {timeout_s:g} s; "
            "the environment instance was discarded: call reset() to start a new episode"
        )
        super().__init__(self.message)


class WorkersStuckError(StepTimeoutError):
    """A call was not started: no worker thread came free for it. Either it waited past the step
    timeout (``waited``), or every thread the pool may use is stuck in an earlier call that was
    given up on (past the step timeout, or its client left) and too many calls already wait, so it
    is refused at once rather than queued. Answered like a timeout; the environment is untouched.
    With no step timeout, a call waits for a worker as long as it takes (up to that queue bound)."""

    def __init__(self, operation: str, timeout_s: Optional[float], stuck: int, waited: bool = False) -> None:
        self.operation = operation
        self.timeout_s = timeout_s  # type: ignore[assignment]
        self.stuck = stuck
        if waited:
            detail = f"no worker thread came free within the step timeout of {timeout_s:g} s"
        else:
            detail = "every worker thread is stuck in an earlier call that was given up on, and others already wait"
        self.message = (
            f"{operation} was not started: {detail} ({stuck} stuck; does the environment hang?); "
            "the environment was not touched: try again later"
        )
        Exception.__init__(self, self.message)


class EnvironmentResultError(OpenEnvError, TypeError):
    """An environment method returned a value of the wrong kind for its route (a Task API
    method's list or count, say): answered as an execution error, in OpenEnv's own words."""


class EnvironmentCallError(RuntimeError):
    """A call in the pool raised what an awaiting coroutine cannot be handed as it is:
    ``StopIteration`` (a future refuses it) or a ``BaseException`` that is not an ``Exception``
    (``SystemExit`` from a library calling ``sys.exit()``, say, which would stop the event loop);
    also a pydantic ``ValidationError`` raised inside the environment (a bad observation, say),
    which would otherwise be reported as the client's invalid input. ``name`` is the original
    exception's type name; it is also ``__cause__``."""

    def __init__(self, original: BaseException) -> None:
        self.name = type(original).__name__
        detail = str(original)
        super().__init__(f"{self.name} raised by the call" + (f": {detail}" if detail else ""))
        self.__cause__ = original
