"""The cost of roles: one session stepping a trivial sync env over /ws, on a server with roles
(tokens for the orchestrator and the grader: every step's principal is checked against the table)
beside the same server without (no tokens), in alternating turns in the same run.

    python bench/bench_roles.py [--seconds 2] [--repeats 9]

Reports the server CPU per step and steps/s of each and their ratios (medians of the turns' own
ratios); the goal is at most 3 % more CPU per step. Raw figures: bench/results/roles.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics

from apps import ROLES_TOKEN
from bench_ws import CASES, RESULTS, Server, median_of, pairing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    frame = CASES["sync"][3]
    plain, roles = Server("sync"), Server("sync-roles")
    try:
        headers = {"Authorization": f"Bearer {ROLES_TOKEN}"}
        runs = asyncio.run(pairing(plain, roles, frame, 1, args.seconds, args.repeats, ours_headers=headers))
    finally:
        plain.stop()
        roles.stop()
    row = {"without": median_of(runs["floor"]), "with": median_of(runs["ours"])}
    for key, metric in (("cpu_ratio", "cpu_us_per_step"), ("throughput_ratio", "steps_per_s")):
        ratios = sorted(o[metric] / f[metric] for f, o in zip(runs["floor"], runs["ours"], strict=True))
        row[key] = statistics.median(ratios)
        row[key + "_range"] = [ratios[0], ratios[-1]]
    print(
        f"one session, trivial sync env: without roles {row['without']['cpu_us_per_step']:.1f} us/step "
        f"{row['without']['steps_per_s']:.0f}/s; with roles {row['with']['cpu_us_per_step']:.1f} us/step "
        f"{row['with']['steps_per_s']:.0f}/s: CPU x{row['cpu_ratio']:.3f} "
        f"({row['cpu_ratio_range'][0]:.3f}-{row['cpu_ratio_range'][1]:.3f}), "
        f"throughput x{row['throughput_ratio']:.3f}",
        flush=True,
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "roles.json").write_text(json.dumps(row, indent=2))


if __name__ == "__main__":
    main()
