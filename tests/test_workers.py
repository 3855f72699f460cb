"""The worker pool that runs sync environments: bounded, daemon threads, recovers from stuck calls."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from openenv.core.env_server.workers import WorkerPool

from .conftest import until


async def test_results_and_exceptions_come_back_to_the_caller():
    pool = WorkerPool(2)
    assert await pool.run(lambda a, b: a + b, 2, 3) == 5
    with pytest.raises(ZeroDivisionError):
        await pool.run(lambda: 1 / 0)
    pool.shutdown()


async def test_never_more_threads_than_max_workers():
    pool = WorkerPool(3)
    peak = 0
    running = 0
    lock = threading.Lock()

    def work() -> None:
        nonlocal peak, running
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.02)
        with lock:
            running -= 1

    await asyncio.gather(*(pool.run(work) for _ in range(30)))
    assert peak <= 3
    assert pool.threads <= 3
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith(pool.name))
    pool.shutdown()


async def test_a_stuck_call_gets_a_replacement_worker_and_retires_later():
    pool = WorkerPool(1)
    release = threading.Event()
    stuck = asyncio.ensure_future(pool.run(release.wait))
    await until(lambda: pool.threads == 1)
    await asyncio.sleep(0.05)
    stuck.cancel()  # the caller gives up (a timeout or a dropped client)
    with pytest.raises(asyncio.CancelledError):
        await stuck
    assert pool.stuck == 1
    # the pool still serves: a replacement thread runs the next call
    assert await asyncio.wait_for(pool.run(lambda: "served"), 2) == "served"
    assert pool.threads == 2
    release.set()
    await until(lambda: pool.stuck == 0)
    await asyncio.wait_for(pool.run(lambda: None), 2)  # a finishing worker notices the surplus
    await until(lambda: pool.threads == 1)
    pool.shutdown()


async def test_abandoning_a_call_that_already_returned_counts_nothing():
    pool = WorkerPool(1)
    for _ in range(50):
        job = pool.submit(lambda: None)
        await asyncio.sleep(0)  # let it run; its result may not be delivered yet
        time.sleep(0.001)
        pool.abandon(job)
        await asyncio.sleep(0.01)
    await until(lambda: pool.stuck == 0)
    pool.shutdown()


async def test_cancelled_before_start_is_skipped_and_still_reports_done():
    pool = WorkerPool(1)
    gate = threading.Event()
    first = asyncio.ensure_future(pool.run(gate.wait))
    second = pool.submit(lambda: pytest.fail("must not run"))
    done = []
    second.add_done_callback(lambda: done.append(True))
    second.future.cancel()
    gate.set()
    await first
    await until(lambda: done == [True])
    assert pool.stuck == 0
    pool.shutdown()


async def test_shutdown_refuses_new_work():
    pool = WorkerPool(1)
    await pool.run(lambda: None)
    pool.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(lambda: None)
