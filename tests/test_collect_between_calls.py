"""``CollectBetweenCalls``: the capture proxy's garbage-collector policy. No pass runs inside a
call (automatic collection only past the backstop), a pass runs when one is due right after an
answer is sent and freezes what survived, and the periodic full pass frees cyclic garbage that a
freeze held on to. The latency it buys is measured by ``bench/bench_capture.py``."""

from __future__ import annotations

import gc
import weakref
from typing import Any, Dict, Iterator, List

import pytest

from openenv.core.utils import CollectBetweenCalls


class Node:
    pass


@pytest.fixture
def passes() -> Iterator[List[Dict[str, Any]]]:
    seen: List[Dict[str, Any]] = []

    def callback(phase: str, info: Dict[str, Any]) -> None:
        if phase == "start":
            seen.append(dict(info))

    gc.collect()
    gc.callbacks.append(callback)
    try:
        yield seen
    finally:
        gc.callbacks.remove(callback)


def test_no_pass_runs_while_allocating_below_the_backstop(passes):
    with CollectBetweenCalls(young=100, backstop=50_000):
        kept = [[i] for i in range(20_000)]  # 20,000 containers: CPython's default runs ~28 passes here
        assert passes == []
    assert len(kept) == 20_000


def test_after_a_call_the_due_pass_runs_and_its_survivors_are_frozen(passes):
    with CollectBetweenCalls(young=1_000) as collector:
        assert collector.after_call() is None  # nothing due yet
        frozen = gc.get_freeze_count()
        kept = [[i] for i in range(2_000)]
        assert collector.after_call() == 0
        assert [p["generation"] for p in passes] == [0]
        assert gc.get_freeze_count() >= frozen + len(kept)  # the survivors are out of later passes
        assert gc.get_count()[0] < 100
        assert collector.after_call() is None
    assert gc.get_freeze_count() == 0  # leaving the context gives every object back to the collector


def test_the_periodic_full_pass_frees_a_cycle_a_freeze_held(passes):
    with CollectBetweenCalls(young=10, full_every=3) as collector:
        cycle = Node()
        cycle.me = cycle  # type: ignore[attr-defined]
        gone = weakref.ref(cycle)
        kept = [[i] for i in range(20)]  # allocations that stay: a pass is due
        assert collector.after_call() == 0  # the cycle is alive now: frozen
        del cycle
        kept += [[i] for i in range(20)]
        assert collector.after_call() == 0
        assert gone() is not None  # garbage, but frozen: young passes cannot see it
        kept += [[i] for i in range(20)]
        assert collector.after_call() == 2
        assert gone() is None
        assert [p["generation"] for p in passes] == [0, 0, 2]


def test_leaving_restores_the_thresholds():
    before = gc.get_threshold()
    with CollectBetweenCalls(backstop=123_456):
        assert gc.get_threshold()[0] == 123_456
    assert gc.get_threshold() == before
