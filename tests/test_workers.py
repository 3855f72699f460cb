"""The worker pool that runs sync environments: bounded, daemon threads, recovers from stuck calls."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time

import pytest

from openenv.core.env_server.exceptions import EnvironmentCallError
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
    await until(lambda: pool.threads == 1)  # the stuck worker retires once its call returns
    pool.shutdown()


async def test_after_a_stuck_call_a_one_thread_pool_runs_every_call_on_one_thread():
    """REQUIRES_SINGLE_THREAD_EXECUTOR: once the stuck call returns, its thread retires and the
    replacement is the only thread left (a surplus worker that stayed would take calls too)."""
    pool = WorkerPool(1)
    release = threading.Event()
    stuck = asyncio.ensure_future(pool.run(release.wait))
    await until(lambda: pool.threads == 1)
    await asyncio.sleep(0.05)
    stuck.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stuck
    replacement = await asyncio.wait_for(pool.run(lambda: threading.current_thread().name), 2)
    release.set()
    await until(lambda: pool.threads == 1 and pool.stuck == 0)
    names = set()
    for _ in range(40):
        names.add(await asyncio.wait_for(pool.run(lambda: threading.current_thread().name), 2))
        await asyncio.sleep(0.002)
    assert names == {replacement}
    pool.shutdown()


async def _stick(pool: WorkerPool, release: threading.Event) -> None:
    """Start a call that blocks until ``release`` and give up on it once it runs."""
    started = threading.Event()

    def blocked() -> None:
        started.set()
        release.wait()

    call = asyncio.ensure_future(pool.run(blocked))
    await until(started.is_set)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call


async def test_replacements_for_stuck_calls_are_capped_at_max_stuck():
    pool = WorkerPool(2, max_stuck=1)
    release = threading.Event()
    for _ in range(3):  # two workers and the one replacement allowed, all stuck
        await _stick(pool, release)
    assert (pool.threads, pool.stuck, pool.exhausted) == (3, 3, True)
    waiting = [pool.submit(lambda: threading.current_thread().name) for _ in range(5)]
    await asyncio.sleep(0.1)
    assert pool.threads == 3  # no thread for them while every allowed one is stuck
    assert not any(job.done for job in waiting)
    release.set()
    names = [await asyncio.wait_for(job.future, 5) for job in waiting]
    assert len(names) == 5
    await until(lambda: pool.stuck == 0 and pool.threads == 2)
    assert not pool.exhausted
    pool.shutdown()


async def test_a_pool_allowed_no_replacement_stays_one_thread_while_a_call_is_stuck():
    pool = WorkerPool(1, max_stuck=0)
    release = threading.Event()
    first = asyncio.ensure_future(pool.run(lambda: threading.current_thread().name))
    name = await asyncio.wait_for(first, 5)
    await _stick(pool, release)
    assert pool.exhausted and pool.threads == 1
    later = pool.submit(lambda: threading.current_thread().name)
    await asyncio.sleep(0.1)
    assert not later.done and pool.threads == 1
    release.set()
    assert await asyncio.wait_for(later.future, 5) == name
    assert (pool.threads, pool.stuck, pool.exhausted) == (1, 0, False)
    pool.shutdown()


@pytest.mark.parametrize(
    ("raise_it", "name"),
    [(lambda: next(iter(())), "StopIteration"), (lambda: sys.exit(3), "SystemExit")],
    ids=["StopIteration", "SystemExit"],
)
async def test_a_call_raising_what_a_future_cannot_carry_fails_with_a_clear_error(raise_it, name):
    """A future refuses StopIteration, and SystemExit re-raised in a task stops the event loop:
    both reach the caller as EnvironmentCallError (a RuntimeError) naming the original."""
    pool = WorkerPool(1)
    with pytest.raises(EnvironmentCallError, match=f"^{name} raised by the call") as caught:
        await asyncio.wait_for(pool.run(raise_it), 5)
    assert caught.value.name == name
    assert type(caught.value.__cause__).__name__ == name
    assert await asyncio.wait_for(pool.run(lambda: "still serving"), 5) == "still serving"
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


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


needs_proc_fds = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts fds through /proc")


def _loop_factories():
    factories = [asyncio.new_event_loop]
    try:
        import uvloop
    except ImportError:  # uvloop is a server extra; the asyncio loop is still tested
        return factories
    return [*factories, uvloop.new_event_loop]


def run_on(new_loop, coro, timeout: float = 10.0):
    """Run ``coro`` on a fresh loop from ``new_loop`` (bounded), then close the loop."""
    loop = new_loop()
    try:
        return loop.run_until_complete(asyncio.wait_for(coro, timeout))
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def _batch_allowed() -> bool:
    if not hasattr(os, "SCHED_BATCH"):
        return False
    result = []

    def probe() -> None:  # on a throwaway thread, so this thread's policy stays as it is
        try:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
            result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join()
    return result == [True]


@pytest.mark.skipif(not _batch_allowed(), reason="SCHED_BATCH is Linux's, and may be refused here")
async def test_workers_run_under_sched_batch_only_when_asked_and_not_already_set():
    inherited = os.sched_getscheduler(0)
    pool = WorkerPool(1, batch=True)
    expected = os.SCHED_BATCH if inherited == os.SCHED_OTHER else inherited
    assert await pool.run(os.sched_getscheduler, 0) == expected

    def started_thread_policy() -> int:  # threads an environment starts from a step inherit it
        seen = []
        thread = threading.Thread(target=lambda: seen.append(os.sched_getscheduler(0)))
        thread.start()
        thread.join()
        return seen[0]

    assert await pool.run(started_thread_policy) == expected
    assert os.sched_getscheduler(0) == inherited  # the loop's own thread is untouched
    pool.shutdown()
    plain = WorkerPool(1)  # the default: the process's policy is left alone
    assert await plain.run(os.sched_getscheduler, 0) == inherited
    plain.shutdown()


def test_a_worker_keeps_a_policy_chosen_for_it():
    if not hasattr(os, "SCHED_IDLE") or not _batch_allowed():
        pytest.skip("needs Linux scheduling policies")
    result = []

    def serve_from_an_idle_thread() -> None:  # as if the server had been started under `chrt -i`
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        pool = WorkerPool(1, batch=True)
        result.append(run_on(asyncio.new_event_loop, pool.run(os.sched_getscheduler, 0)))
        pool.shutdown()

    thread = threading.Thread(target=serve_from_an_idle_thread)
    thread.start()
    thread.join()
    assert result == [os.SCHED_IDLE]


@pytest.mark.parametrize("new_loop", _loop_factories(), ids=lambda f: f.__module__.split(".")[0])
def test_no_result_is_lost_when_many_finish_at_once(new_loop):
    """Calls finishing together on several workers, round after round: every one is delivered
    (a lost wake-up would hang a round, and the bound turns that into a failure)."""

    async def main() -> None:
        pool = WorkerPool(8)
        for round_ in range(150):
            count = 1 + round_ % 40
            assert await asyncio.wait_for(asyncio.gather(*(pool.run(abs, -n) for n in range(count))), 5) == list(
                range(count)
            )
        pool.shutdown()

    run_on(new_loop, main(), timeout=60)


async def test_a_call_still_running_at_shutdown_is_still_delivered():
    pool = WorkerPool(1)
    gate = threading.Event()
    running = asyncio.ensure_future(pool.run(gate.wait, 5))
    await until(lambda: pool.threads == 1)
    pool.shutdown()
    gate.set()
    assert await asyncio.wait_for(running, 5) is True
    await until(lambda: pool.threads == 0)  # the worker took the shutdown's stop after its call


def test_a_stuck_call_returning_after_its_loop_closed_lets_its_worker_go():
    gate = threading.Event()
    pool = WorkerPool(1)

    async def give_up() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(pool.run(gate.wait, 5), 0.05)  # abandoned, still running
        pool.shutdown()

    run_on(asyncio.new_event_loop, give_up())
    assert pool.stuck == 1
    gate.set()  # the call returns with nobody left to take its result
    deadline = time.monotonic() + 5
    while (pool.stuck or pool.threads) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert (pool.stuck, pool.threads) == (0, 0)
