"""A bounded pool of worker threads for the blocking calls of sync environments.

Unlike ``loop.run_in_executor`` it hands results back to the event loop with a single
``call_soon_threadsafe``, its threads are daemons (a hung environment never blocks interpreter
exit), and a call abandoned by a timeout or a cancelled request does not cost the pool a worker
for good: a replacement thread is allowed while the stuck one is busy, and the stuck one retires
when its call finally returns.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from typing import Any, Callable, List, Optional

_pool_ids = itertools.count(1)


class Job:
    """One call submitted to a :class:`WorkerPool`."""

    __slots__ = (
        "_callbacks",
        "abandoned",
        "args",
        "counted_stuck",
        "done",
        "fn",
        "future",
        "loop",
        "outcome",
        "returned",
        "started",
    )

    def __init__(
        self, fn: Callable[..., Any], args: tuple, future: asyncio.Future, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.fn = fn
        self.args = args
        self.future = future
        self.loop = loop
        self.started = False  # written by the worker (False -> True only), read under the pool lock
        self.abandoned = False  # written on the loop
        self.counted_stuck = False  # guarded by the pool's lock
        self.returned = False  # guarded by the pool's lock: the worker is done with the call
        self.done = False  # written on the loop, once the call has returned (or was skipped)
        self.outcome: Optional[tuple] = None  # (ok, value), kept even when the future was cancelled
        self._callbacks: Optional[List[Callable[[], Any]]] = None

    def add_done_callback(self, callback: Callable[[], Any]) -> None:
        """Call ``callback()`` on the loop once the call has returned (now, if it already has)."""
        if self.done:
            callback()
        elif self._callbacks is None:
            self._callbacks = [callback]
        else:
            self._callbacks.append(callback)

    def _finish(self, ok: bool, value: Any) -> None:
        self.done = True
        self.outcome = (ok, value)
        fut = self.future
        if not fut.done():
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)
        callbacks, self._callbacks = self._callbacks, None
        for callback in callbacks or ():
            callback()


class WorkerPool:
    """Runs blocking callables on at most ``max_workers`` daemon threads (plus replacements)."""

    def __init__(self, max_workers: int, name: str = "openenv-worker") -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be >= 1")
        self.max_workers = max_workers
        self.name = f"{name}-{next(_pool_ids)}"
        self._queue: queue.SimpleQueue[Optional[Job]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._pending = 0
        self._stuck = 0
        self._closed = False

    @property
    def threads(self) -> int:
        return self._threads

    @property
    def stuck(self) -> int:
        """Workers still busy with calls whose callers gave up on them."""
        return self._stuck

    def submit(self, fn: Callable[..., Any], *args: Any) -> Job:
        """Queue ``fn(*args)``; its outcome arrives on ``job.future``, on the calling loop."""
        if self._closed:
            raise RuntimeError("worker pool is shut down")
        loop = asyncio.get_running_loop()
        job = Job(fn, args, loop.create_future(), loop)
        with self._lock:
            self._pending += 1
            spawn = self._pending > self._idle and self._threads < self.max_workers + self._stuck
            if spawn:
                self._threads += 1
                number = self._threads
        self._queue.put(job)
        if spawn:
            threading.Thread(target=self._work, name=f"{self.name}-{number}", daemon=True).start()
        return job

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on a worker and return its result. Cancelling the caller abandons the call."""
        job = self.submit(fn, *args)
        try:
            return await job.future
        except asyncio.CancelledError:
            self.abandon(job)
            raise

    def abandon(self, job: Job) -> None:
        """The caller stopped waiting for ``job``: if it is running, allow a replacement worker."""
        if job.abandoned or job.done:
            return
        job.abandoned = True
        with self._lock:
            if job.started and not job.returned and not job.counted_stuck:
                job.counted_stuck = True
                self._stuck += 1

    def _work(self) -> None:
        get = self._queue.get
        lock = self._lock
        with lock:
            self._idle += 1
        while True:
            job = get()
            with lock:
                self._idle -= 1
                self._pending -= 1
            if job is None:
                with lock:
                    self._threads -= 1
                return
            if job.future.cancelled():
                outcome: tuple = (False, asyncio.CancelledError())
            else:
                job.started = True
                try:
                    outcome = (True, job.fn(*job.args))
                except BaseException as exc:  # delivered to the awaiting coroutine
                    outcome = (False, exc)
            with lock:
                job.returned = True
                if job.counted_stuck:
                    self._stuck -= 1
                retire = self._closed or self._threads > self.max_workers + self._stuck
                if retire:
                    self._threads -= 1
                else:
                    self._idle += 1
            # Wake the loop last: it then finds the GIL free instead of waiting for it.
            try:
                job.loop.call_soon_threadsafe(job._finish, *outcome)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass
            del job, outcome
            if retire:
                return

    def shutdown(self) -> None:
        """Stop idle workers; busy ones exit when their call returns."""
        with self._lock:
            self._closed = True
            count = self._threads
            self._pending += count
        for _ in range(count):
            self._queue.put(None)
