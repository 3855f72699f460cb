"""Summarise the results of ``drive.py`` runs as a matrix (used by ``scripts/interop.sh``).

    python matrix.py RESULTS_DIR

``RESULTS_DIR`` holds ``servers.tsv`` (one line per server: ``core<TAB>kind<TAB>status<TAB>detail``,
status ``up``, ``failed`` or ``skipped``) and one ``<server core>__<kind>__<client core>.json``
per driver run. Prints the matrix (rows: server core x env kind; columns: client core; cells:
passed/total), every FAIL with its details and the notes, and exits 1 if anything failed.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

CORES = ("ours", "upstream")
KINDS = ("typed", "mcp", "template", "echo")
MAX_LEAVES = 8


UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _normal(value: Any) -> Any:
    """Values that differ from run to run (uuids) do not count as differences."""
    return json.loads(UUID.sub("<uuid>", json.dumps(value, sort_keys=True)))


def _short(value: Any, limit: int = 400) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[:limit] + "..."


ABSENT = "<absent>"


def _leaf_diffs(a: Any, b: Any, path: str = "") -> List[Tuple[str, Any, Any]]:
    """Where two JSON values differ: (path, ours, upstream) for each differing leaf."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: List[Tuple[str, Any, Any]] = []
        for key in sorted(a.keys() | b.keys()):
            out += _leaf_diffs(a.get(key, ABSENT), b.get(key, ABSENT), f"{path}.{key}" if path else str(key))
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            out += _leaf_diffs(x, y, f"{path}[{i}]")
        return out
    return [] if a == b else [(path or "(value)", a, b)]


def compare_servers(results_dir: Path) -> List[str]:
    """What the ours server sent that upstream's did not, per env kind, client and captured item."""
    found: Dict[Tuple[str, str, str, str], List[str]] = {}
    for kind in KINDS:
        for client in CORES:
            ours_path = results_dir / f"ours__{kind}__{client}.json"
            theirs_path = results_dir / f"upstream__{kind}__{client}.json"
            if not (ours_path.exists() and theirs_path.exists()):
                continue
            ours = json.loads(ours_path.read_text()).get("captures", {})
            theirs = json.loads(theirs_path.read_text()).get("captures", {})
            for key in sorted(ours.keys() & theirs.keys()):
                every = _leaf_diffs(_normal(ours[key]), _normal(theirs[key]))
                # docstrings in JSON schemas are cosmetic: counted, not listed
                leaves = [d for d in every if not d[0].endswith("description")]
                cosmetic = len(every) - len(leaves)
                if every:
                    shown = [f"{p}: ours={_short(x, 120)} upstream={_short(y, 120)}" for p, x, y in leaves[:MAX_LEAVES]]
                    if len(leaves) > MAX_LEAVES:
                        shown.append(f"... and {len(leaves) - MAX_LEAVES} more")
                    if cosmetic:
                        shown.append(f"{cosmetic} schema 'description' strings differ (absent or reworded in ours)")
                    found.setdefault((kind, key, "\n      ".join(shown)), []).append(client)
    return [
        f"[{kind}] {key} (seen by client {'+'.join(clients)}):\n      {text}"
        for (kind, key, text), clients in found.items()
    ]


def main() -> int:
    results_dir = Path(sys.argv[1])
    servers: Dict[Tuple[str, str], Tuple[str, str]] = {}
    for line in (results_dir / "servers.tsv").read_text().splitlines():
        if line.strip():
            core, kind, status, detail = [*line.split("\t"), "", "", ""][:4]
            servers[(core, kind)] = (status, detail)

    versions = {}
    for path in results_dir.glob("*.json"):
        data = json.loads(path.read_text())
        versions[path.stem.split("__")[2]] = data.get("client", "")

    failed = False
    fails: List[str] = []
    notes: Dict[str, List[str]] = {}
    header = ["server core", "env kind"] + [f"client: {c} ({versions.get(c, '?')})" for c in CORES]
    rows: List[List[str]] = []
    for core in CORES:
        for kind in KINDS:
            status, detail = servers.get((core, kind), ("skipped", "not run"))
            row = [f"{core}", kind]
            for client in CORES:
                if status != "up":
                    row.append("skipped" if status == "skipped" else "SERVER FAILED")
                    continue
                path = results_dir / f"{core}__{kind}__{client}.json"
                if not path.exists():
                    row.append("NO RESULT")
                    fails.append(
                        f"[{client} client -> {core} server, {kind}] the driver left no result (crashed or timed out)"
                    )
                    failed = True
                    continue
                data = json.loads(path.read_text())
                results: List[Dict[str, Any]] = data["results"]
                passed = sum(1 for r in results if r["ok"])
                mark = "" if passed == len(results) else "  <-- FAIL"
                control = " (control)" if client == core else ""
                row.append(f"{passed}/{len(results)}{control}{mark}")
                for r in results:
                    if not r["ok"]:
                        failed = True
                        fails.append(f"[{client} client -> {core} server, {kind}] {r['name']}: {r['detail']}")
                for note in data.get("notes", []):
                    notes.setdefault(note, []).append(f"{client}->{core}/{kind}")
            if status == "failed":
                failed = True
                fails.append(f"[{core} server, {kind}] server did not start: {detail}")
            elif status == "skipped" and detail:
                row[1] += f" ({detail})"
            rows.append(row)

    diffs = compare_servers(results_dir)

    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: List[str]) -> str:
        return " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))

    print()
    print("Interop matrix: checks passed/total per (server core x env kind) and client core")
    print(line(header))
    print("-+-".join("-" * w for w in widths))
    for row in rows:
        print(line(row))
    print()
    if fails:
        print(f"FAILURES ({len(fails)}):")
        for text in fails:
            print(f"  - {text}")
        print()
    if notes:
        print("NOTES (compatible differences, cells client->server/kind):")
        for text, cells in notes.items():
            print(f"  - {text}  [{', '.join(cells)}]")
        print()
    if diffs:
        print("DIFFERENCES between the two server cores (same env, same client; informational):")
        for text in diffs:
            print(f"  - {text}")
        print()
    print("RESULT:", "FAIL" if failed else "PASS")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
