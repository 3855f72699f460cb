"""A private event loop on a daemon thread (:class:`LoopThread`), for sync code that drives async clients.

Sync calls submit coroutines to it and wait. Because that loop is not the caller's, this works
the same from a plain script, from worker threads (calls are serialised) and from inside a running
event loop such as a Jupyter cell, without deadlock. :class:`~openenv.core.env_client.EnvClient`
runs its sync calls on one; the TRL and Gymnasium vector adapters keep their own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Coroutine, Optional, TypeVar

T = TypeVar("T")

_START_TIMEOUT_S = 5.0
_STOP_TIMEOUT_S = 5.0
_DEL_JOIN_S = 1.0


async def _cancel_others() -> None:
    """Cancel every other task of the running loop and wait (briefly) for them to finish."""
    this = asyncio.current_task()
    others = [task for task in asyncio.all_tasks() if task is not this and not task.done()]
    for task in others:
        task.cancel()
    if others:
        await asyncio.wait(others, timeout=_STOP_TIMEOUT_S - 1)


def _wind_down(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel the tasks still pending on a stopped ``loop`` (a connection's keepalive, when the
    client was dropped without a close) and let them finish before it closes: Python prints "Task
    was destroyed but it is pending!" for each one left."""
    try:
        pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.wait(pending, timeout=_STOP_TIMEOUT_S))
        loop.run_until_complete(loop.shutdown_asyncgens())
    except Exception:  # (a task that would not end: closing the loop regardless)
        pass


class LoopThread:
    """An event loop running forever on its own daemon thread."""

    def __init__(self, name: str = "openenv-sync-client-loop") -> None:
        self.name = name
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self.stopped = False  # stop() was called: it does not start again

    def _ensure_started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is not None and self._thread is not None and self._thread.is_alive():
                return self._loop
            if self.stopped:
                raise RuntimeError("this client was closed (or the client whose session it shares was)")
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def serve() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                try:
                    loop.run_forever()
                finally:
                    _wind_down(loop)
                    loop.close()

            thread = threading.Thread(target=serve, name=self.name, daemon=True)
            thread.start()
            if not ready.wait(_START_TIMEOUT_S):
                raise RuntimeError(f"the client's event loop thread did not start within {_START_TIMEOUT_S:g} s")
            self._loop, self._thread = loop, thread
            return loop

    def in_loop_thread(self) -> bool:
        return self._thread is not None and threading.current_thread() is self._thread

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result (Ctrl-C cancels it)."""
        if self.in_loop_thread():
            coro.close()
            raise RuntimeError(
                "a sync client call was made from its own event loop thread; await the async client instead"
            )
        loop = self._ensure_started()
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result()
        except KeyboardInterrupt:
            future.cancel()
            raise
        except concurrent.futures.CancelledError:
            if self._loop is not loop:  # stop() ended it: the client was closed meanwhile
                from .client_errors import SessionLostError

                raise SessionLostError("the client was closed (from another thread) while this call ran") from None
            raise asyncio.CancelledError() from None

    def stop(self) -> None:
        """Cancel the calls still running on the loop (their callers get an error), then stop it."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
            self.stopped = True
        if loop is None or thread is None:
            return
        on_loop_thread = threading.current_thread() is thread
        if not on_loop_thread:
            try:
                asyncio.run_coroutine_threadsafe(_cancel_others(), loop).result(_STOP_TIMEOUT_S)
            except RuntimeError:  # already closed
                return
            except Exception:  # the calls did not wind down in time: stop the loop regardless
                pass
        try:
            loop.call_soon_threadsafe(loop.stop)
        except RuntimeError:  # already closed
            return
        if not on_loop_thread:
            thread.join(timeout=_STOP_TIMEOUT_S)

    def __del__(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(loop.stop)
            except RuntimeError:
                return
            if thread is not None and thread is not threading.current_thread():
                # (briefly: its wind-down ends the tasks left on the loop, before an exit can cut it short)
                thread.join(_DEL_JOIN_S)


__all__ = ["LoopThread"]
