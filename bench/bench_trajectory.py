"""The cost of recording trajectories (docs/roles.md): steps through the one dispatch, in process
(no sockets: what is measured is the dispatch and the session manager, where the record is kept),
with recording off (``max_trajectory_steps=0``: the observer's counts alone) and on (10000
entries), each in a fresh process, in alternating turns; the garbage collector tuned as the
runner tunes it.

    python bench/bench_trajectory.py [--steps 50000] [--repeats 7] [--reset-every 0]

Reports the process CPU per step of each and the difference (medians of the turns' own), for a
trivial environment on the event loop (``RUNS_ON_EVENT_LOOP``: no worker threads, so the least
noise). ``--reset-every 50`` resets the session every 50 steps (episodes of 50 steps); 0 never
(the record fills to its bound and then drops its oldest entries). Raw figures:
bench/results/trajectory.json.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def one_run(steps: int, entries: int, reset_every: int) -> float:
    """CPU microseconds per step of ``steps`` steps (after a warm-up) in this process."""
    from apps import LoopTrivialEnv, PingAction, PingObservation

    from openenv.core.env_server.dispatch import Call, Op
    from openenv.core.env_server.http_server import HTTPEnvServer
    from openenv.core.env_server.serialization import deserialize_action, observation_message_json
    from openenv.core.env_server.sessions import SessionKind

    gc.freeze()
    gc.set_threshold(10_000, 10, 10)  # as the runner serves (OPENENV_GC_TUNING)
    server = HTTPEnvServer(
        LoopTrivialEnv, PingAction, PingObservation, max_concurrent_envs=2, max_trajectory_steps=entries
    )
    dispatcher = server.dispatcher

    async def run() -> float:
        session = await server.manager.create(SessionKind.SOCKET)
        data = {"message": "hello"}

        async def step() -> None:
            action = deserialize_action(data, PingAction)
            observation_message_json(await dispatcher.run(Call(Op.STEP, (action, None)), session))

        await dispatcher.run(Call(Op.RESET, {}), session)
        for _ in range(2000):
            await step()
        started = time.process_time()
        for i in range(steps):
            if reset_every and i % reset_every == 0:
                observation_message_json(await dispatcher.run(Call(Op.RESET, {}), session))
            await step()
        spent = time.process_time() - started
        await server.manager.shutdown()
        return 1e6 * spent / steps

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--reset-every", type=int, default=0)
    parser.add_argument("--one", nargs=3, type=int, help=argparse.SUPPRESS)  # (a child: steps entries reset_every)
    args = parser.parse_args()
    if args.one:
        print(one_run(*args.one))
        return
    turns = []
    for repeat in range(args.repeats):
        turn = {}
        for entries in (0, 10_000) if repeat % 2 == 0 else (10_000, 0):
            child = [sys.executable, __file__, "--one", str(args.steps), str(entries), str(args.reset_every)]
            turn["on" if entries else "off"] = float(subprocess.check_output(child, cwd=HERE, text=True))
        turns.append(turn)
    off = statistics.median(t["off"] for t in turns)
    on = statistics.median(t["on"] for t in turns)
    extra = sorted(t["on"] - t["off"] for t in turns)
    episodes = f"episodes of {args.reset_every} steps" if args.reset_every else "no reset"
    print(
        f"trivial env on the loop, {episodes}: recording off {off:.2f} us/step, on {on:.2f} us/step: "
        f"+{statistics.median(extra):.2f} us per step (turns {extra[0]:+.2f} to {extra[-1]:+.2f})",
        flush=True,
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "trajectory.json").write_text(json.dumps({"turns": turns, "reset_every": args.reset_every}, indent=2))


if __name__ == "__main__":
    main()
