"""A bounded pool of worker threads for the blocking calls of sync environments.

Unlike ``loop.run_in_executor`` it hands results back to the event loop with one wake-up for
however many calls finished meanwhile, its threads are daemons (a hung environment never blocks
interpreter exit), and a call abandoned by a timeout or a cancelled request does not cost the pool
a worker for good: a replacement thread is allowed while the stuck one is busy (up to
``max_stuck`` replacements), and the stuck one retires when its call finally returns.

With ``batch=True`` (``OPENENV_SCHED_BATCH=1``; off by default, as threads and processes a step
starts inherit it) workers run under Linux's ``SCHED_BATCH``: a woken worker does not preempt the
event loop that woke it, which holds the GIL until it next waits anyway. A thread already under
another policy (``chrt``) keeps it. (An eventfd written without the GIL to wake the loop, tried
instead of ``call_soon_threadsafe``, made no difference end to end in ``make bench``.)
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import os
import queue
import threading
from typing import Any, Callable, Deque, Dict, List, Optional

from .exceptions import EnvironmentCallError

_pool_ids = itertools.count(1)
logger = logging.getLogger("openenv.server")


class Job:
    """One call submitted to a :class:`WorkerPool`."""

    __slots__ = (
        "_callbacks",
        "abandoned",
        "args",
        "counted_stuck",
        "delivery",
        "done",
        "fn",
        "future",
        "returned",
        "started",
    )

    def __init__(self, fn: Callable[..., Any], args: tuple, future: asyncio.Future, delivery: _Delivery) -> None:
        self.fn = fn
        self.args = args
        self.future = future
        self.delivery = delivery
        self.started = False  # written by the worker, False -> True only
        self.returned: Optional[tuple] = None  # the worker's (ok, value), kept even if the future was cancelled
        # The rest is only touched on the loop's thread: no locks needed.
        self.abandoned = False
        self.counted_stuck = False
        self.done = False  # the call has returned (or was skipped) and been handed back
        self._callbacks: Optional[List[Callable[[], Any]]] = None

    def add_done_callback(self, callback: Callable[[], Any]) -> None:
        """Call ``callback()`` on the loop once the call has returned (now, if it already has)."""
        if self.done:
            callback()
        elif self._callbacks is None:
            self._callbacks = [callback]
        else:
            self._callbacks.append(callback)

    def when_done(self) -> asyncio.Future:
        """A future, on the submitting loop, resolved once the call has returned (or was skipped);
        cancelling it leaves the call alone."""
        returned = self.future.get_loop().create_future()

        def resolve() -> None:
            if not returned.done():
                returned.set_result(None)

        self.add_done_callback(resolve)
        return returned

    def _finish(self) -> None:
        self.done = True
        ok, value = self.returned  # type: ignore[misc]
        fut = self.future
        if not fut.done():
            if ok:
                fut.set_result(value)
            elif isinstance(value, asyncio.CancelledError):  # skipped: nobody wants a result
                fut.cancel()
            else:
                fut.set_exception(value)  # one a future accepts: see _work
        callbacks, self._callbacks = self._callbacks, None
        for callback in callbacks or ():
            callback()


class _Delivery:
    """Hands finished calls back to one event loop, one wake-up for however many finished meanwhile."""

    __slots__ = ("finished", "loop", "pending", "pool", "scheduled")

    def __init__(self, loop: asyncio.AbstractEventLoop, pool: WorkerPool) -> None:
        self.loop = loop
        self.pool = pool
        self.finished: Deque[Job] = collections.deque()
        self.scheduled = False
        self.pending = 0  # calls submitted and not yet handed back (loop thread only)

    def push(self, job: Job) -> None:  # on a worker thread
        self.finished.append(job)
        if self.scheduled:  # a stale True only means the pending drain picks this one up too
            return
        self.scheduled = True
        try:
            self.loop.call_soon_threadsafe(self.drain)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    def drain(self) -> None:  # on the loop
        self.scheduled = False
        finished = self.finished
        while finished:
            job = finished.popleft()
            self.pending -= 1
            self.pool._inflight -= 1
            try:
                job._finish()
            except Exception:  # a done-callback failed; the other calls still get their results
                logger.exception("delivering a worker result failed")


def _batch_policy() -> None:
    """Run the calling thread under SCHED_BATCH where the OS offers it (see the module's text)."""
    if not hasattr(os, "SCHED_BATCH"):
        return
    with contextlib.suppress(OSError):  # not allowed here (a seccomp profile, say): the default serves too
        if os.sched_getscheduler(0) == os.SCHED_OTHER:  # a policy someone chose (realtime, idle) is kept
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))


class WorkerPool:
    """Runs blocking callables on at most ``max_workers`` daemon threads (plus replacements).

    Bookkeeping happens on the event loop's thread (submitting, abandoning and finishing calls);
    workers only take calls from a queue, run them and hand the outcome back, so a call costs no
    lock in the worker.
    """

    def __init__(
        self, max_workers: int, name: str = "openenv-worker", batch: bool = False, max_stuck: Optional[int] = None
    ) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be >= 1")
        if max_stuck is not None and max_stuck < 0:
            raise ValueError("max_stuck must be >= 0")
        self.max_workers = max_workers
        self.max_stuck = max_workers if max_stuck is None else max_stuck
        """Replacement threads allowed beside threads stuck in abandoned calls (0: none, so a pool
        of one thread stays one thread); beyond that, calls wait for a stuck one to return."""
        self.batch = batch
        self.name = f"{name}-{next(_pool_ids)}"
        self._queue: queue.SimpleQueue[Optional[Job]] = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards threads and stuck
        self.threads = 0
        """Worker threads alive (read-only outside the pool)."""
        self.stuck = 0
        """Workers still busy with calls whose callers gave up on them (read-only outside the pool)."""
        self._inflight = 0  # submitted and not finished (loop thread only)
        self._numbers = itertools.count(1)
        self._closed = False
        self._deliveries: Dict[int, _Delivery] = {}

    @property
    def exhausted(self) -> bool:
        """Every thread the pool may have is stuck in an abandoned call: a new call waits until
        one of those returns."""
        return self.stuck >= self.max_workers + self.max_stuck

    @property
    def backlog(self) -> int:
        """Calls submitted and neither finished nor stuck (running, or waiting in the queue,
        including ones given up on before they started, which are skipped when reached)."""
        return max(0, self._inflight - self.stuck)

    def _allowed(self) -> int:  # under self._lock, or on the loop for a heuristic read
        return self.max_workers + min(self.stuck, self.max_stuck)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Job:
        """Queue ``fn(*args)``; its outcome arrives on ``job.future``, on the calling loop."""
        if self._closed:
            raise RuntimeError("worker pool is shut down")
        loop = asyncio.get_running_loop()
        delivery = self._delivery(loop)
        job = Job(fn, args, loop.create_future(), delivery)
        delivery.pending += 1
        self._inflight += 1
        self._queue.put(job)
        # Another worker when the calls in flight outnumber the workers, within the bound.
        if self._inflight > self.threads and self.threads < self._allowed():
            self._spawn()
        return job

    def _delivery(self, loop: asyncio.AbstractEventLoop) -> _Delivery:
        delivery = self._deliveries.get(id(loop))
        if delivery is None or delivery.loop is not loop:
            for key, old in list(self._deliveries.items()):  # forget loops that have closed
                if old.loop.is_closed():
                    del self._deliveries[key]
            delivery = self._deliveries[id(loop)] = _Delivery(loop, self)
        return delivery

    def _spawn(self) -> None:
        with self._lock:
            if self.threads >= self._allowed():
                return
            self.threads += 1
            number = next(self._numbers)
        threading.Thread(target=self._work, name=f"{self.name}-{number}", daemon=True).start()

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on a worker and return its result. Cancelling the caller abandons the call."""
        job = self.submit(fn, *args)
        try:
            return await job.future
        except asyncio.CancelledError:
            self.abandon(job)
            raise

    def abandon(self, job: Job) -> bool:
        """The caller stopped waiting for ``job``: if it is running, allow a replacement worker.

        Returns whether the call started (it runs on, or ran); one that had not is skipped. Call
        it on the loop's thread."""
        if job.done or job.abandoned:
            return job.started
        job.abandoned = True  # written before `started` and `returned` are read: see _work
        with self._lock:
            started = job.started
            stuck = started and job.returned is None
            if stuck:
                job.counted_stuck = True
                self.stuck += 1
        if stuck and self._inflight > self.threads:
            self._spawn()
        return started

    def _work(self) -> None:
        if self.batch:
            _batch_policy()
        get = self._queue.get
        while True:
            job = get()
            if job is None:  # the pool shuts down
                with self._lock:
                    self.threads -= 1
                return
            # This thread writes `started`, then `returned`, each before it reads `abandoned`;
            # abandon() writes `abandoned` before it reads them. So a call given up on before it
            # starts is skipped or counted stuck (or both), and one given up on while it runs is
            # counted stuck only if it has not returned, in which case this thread sees it below.
            job.started = True
            if job.abandoned or job.future.cancelled():
                outcome: tuple = (False, asyncio.CancelledError())
            else:
                try:
                    outcome = (True, job.fn(*job.args))
                except BaseException as exc:  # delivered to the awaiting coroutine
                    # A future refuses StopIteration, and SystemExit re-raised in a task stops the loop.
                    if isinstance(exc, StopIteration) or not isinstance(exc, Exception):
                        exc = EnvironmentCallError(exc)
                    outcome = (False, exc)
            job.returned = outcome
            retire = False
            if job.abandoned:
                with self._lock:
                    if job.counted_stuck:
                        self.stuck -= 1
                    # A replacement may have taken this thread's place while it was stuck: if so,
                    # retire. A pool of one thread thereby stays one thread (which
                    # REQUIRES_SINGLE_THREAD_EXECUTOR relies on, with max_stuck=0).
                    retire = self.threads > self._allowed()
                    if retire:
                        self.threads -= 1
            job.delivery.push(job)
            del job, outcome  # hold no result while waiting for the next call
            if retire:  # its place was given up above
                return

    def shutdown(self) -> None:
        """Stop idle workers; busy ones exit when their call returns."""
        self._closed = True
        for _ in range(self.threads):
            self._queue.put(None)
        self._deliveries.clear()
