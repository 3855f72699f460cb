"""A bounded pool of worker threads for the blocking calls of sync environments.

Unlike ``loop.run_in_executor`` it hands results back to the event loop with a single
``call_soon_threadsafe``, its threads are daemons (a hung environment never blocks interpreter
exit), and a call abandoned by a timeout or a cancelled request does not cost the pool a worker
for good: a replacement thread is allowed while the stuck one is busy, and the stuck one retires
when its call finally returns.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import queue
import threading
from typing import Any, Callable, Deque, Dict, List, Optional

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
        "outcome",
        "pool",
        "returned",
        "started",
    )

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple,
        future: asyncio.Future,
        delivery: _Delivery,
        pool: WorkerPool,
    ) -> None:
        self.fn = fn
        self.args = args
        self.future = future
        self.delivery = delivery
        self.pool = pool
        self.started = False  # written by the worker, False -> True only
        self.returned: Optional[tuple] = None  # the worker's (ok, value), read on the loop after delivery
        # The rest is only touched on the loop's thread: no locks needed.
        self.abandoned = False
        self.counted_stuck = False
        self.done = False  # the call has returned (or was skipped)
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
        pool = self.pool
        pool._inflight -= 1
        if self.counted_stuck:
            pool._stuck -= 1
        fut = self.future
        if not fut.done():
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)
        callbacks, self._callbacks = self._callbacks, None
        for callback in callbacks or ():
            callback()


class _Delivery:
    """Hands finished calls back to one event loop, one wake-up for however many finished meanwhile."""

    __slots__ = ("finished", "loop", "scheduled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.finished: Deque[Job] = collections.deque()
        self.scheduled = False

    def push(self, job: Job) -> None:  # on a worker thread
        self.finished.append(job)
        if not self.scheduled:  # a stale True only means the pending drain picks this one up too
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
            try:
                job._finish(*job.returned)  # type: ignore[misc]
            except Exception:  # a done-callback failed; the other calls still get their results
                logger.exception("delivering a worker result failed")


class WorkerPool:
    """Runs blocking callables on at most ``max_workers`` daemon threads (plus replacements).

    Bookkeeping happens on the event loop's thread (submitting, abandoning and finishing calls);
    workers only take calls from a queue, run them and hand the outcome back, so a call costs no
    lock in the worker.
    """

    def __init__(self, max_workers: int, name: str = "openenv-worker") -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be >= 1")
        self.max_workers = max_workers
        self.name = f"{name}-{next(_pool_ids)}"
        self._queue: queue.SimpleQueue[Optional[Job]] = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards _threads
        self._threads = 0
        self._inflight = 0  # submitted and not finished (loop thread only)
        self._stuck = 0
        self._spawned = 0
        self._closed = False
        self._deliveries: Dict[int, _Delivery] = {}

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
        job = Job(fn, args, loop.create_future(), self._delivery(loop), self)
        self._inflight += 1
        self._queue.put(job)
        # Another worker when the calls in flight outnumber the workers, within the bound.
        if self._inflight > self._threads and self._threads < self.max_workers + self._stuck:
            self._spawn()
        return job

    def _delivery(self, loop: asyncio.AbstractEventLoop) -> _Delivery:
        delivery = self._deliveries.get(id(loop))
        if delivery is None or delivery.loop is not loop:
            for key, old in list(self._deliveries.items()):  # forget loops that have closed
                if old.loop.is_closed():
                    del self._deliveries[key]
            delivery = self._deliveries[id(loop)] = _Delivery(loop)
        return delivery

    def _spawn(self) -> None:
        with self._lock:
            if self._threads >= self.max_workers + self._stuck:
                return
            self._threads += 1
            self._spawned += 1
            number = self._spawned
        threading.Thread(target=self._work, name=f"{self.name}-{number}", daemon=True).start()

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on a worker and return its result. Cancelling the caller abandons the call."""
        job = self.submit(fn, *args)
        try:
            return await job.future
        except asyncio.CancelledError:
            self.abandon(job)
            raise

    def abandon(self, job: Job) -> None:
        """The caller stopped waiting for ``job``: if it is running, allow a replacement worker.

        Call it on the loop's thread."""
        if job.abandoned or job.done:
            return
        job.abandoned = True
        if job.started:
            job.counted_stuck = True
            self._stuck += 1
            if self._inflight > self._threads:
                self._spawn()

    def _work(self) -> None:
        get = self._queue.get
        while True:
            job = get()
            if job is None:
                break
            if job.future.cancelled():
                outcome: tuple = (False, asyncio.CancelledError())
            else:
                job.started = True
                try:
                    outcome = (True, job.fn(*job.args))
                except BaseException as exc:  # delivered to the awaiting coroutine
                    outcome = (False, exc)
            job.returned = outcome
            job.delivery.push(job)
            del job, outcome
            if self._threads > self.max_workers + self._stuck:  # a replacement is no longer needed
                with self._lock:
                    if self._threads > self.max_workers + self._stuck:
                        self._threads -= 1
                        return
        with self._lock:
            self._threads -= 1

    def shutdown(self) -> None:
        """Stop idle workers; busy ones exit when their call returns."""
        self._closed = True
        for _ in range(self._threads):
            self._queue.put(None)
