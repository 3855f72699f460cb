"""The figures of an evaluation and the report a person reads (``report.html``, ``summary.json``).

:func:`summarize` turns the rollout records of ``openenv eval`` (one dict per rollout, the last
one of each id) into figures; :func:`render_html` draws them as one self-contained HTML page (no
script, no external file; the charts are inline SVG); :func:`summary_lines` is the short text the
command prints.

What is counted where: a rollout is ``ok`` (it ended and the environment gave a reward),
``unscored`` (it ended without one: the model never acted, say) or ``failed`` (an error stopped
it: a timeout, the environment server gone, the model endpoint failing). The success rate is
over the rollouts that ended (ok and unscored; an unscored one is not a success), with a Wilson
95% interval; the mean reward is over the scored ones, with a Student-t 95% interval. Failed
rollouts are in neither: they are listed by cause, because they say something about the
machinery, not the model.
"""

from __future__ import annotations

import html
import json
import math
import statistics
from collections import Counter, OrderedDict
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

__all__ = [
    "Z95",
    "mean_interval",
    "render_html",
    "student_t_cdf",
    "summarize",
    "summary_lines",
    "t_quantile",
    "wilson_interval",
]

Z95 = 1.959963984540054
"""The standard normal's 97.5% quantile: a two-sided 95% interval."""


# --- statistics ---------------------------------------------------------------------------------


def wilson_interval(successes: int, n: int, z: float = Z95) -> Optional[Tuple[float, float]]:
    """Wilson's score interval for a rate of ``successes`` out of ``n`` (``None`` when ``n`` is 0).

    Unlike the normal approximation it stays within [0, 1] and is not empty at 0 or n successes."""
    if n <= 0:
        return None
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be within 0..{n}, got {successes}")
    p = successes / n
    z2 = z * z
    denominator = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularised incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 400):
        m2 = 2 * m
        step = m * (b - m) * x / ((a + m2 - 1) * (a + m2))
        d = 1.0 + step * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + step / c if abs(c) > tiny else 1.0 + step / tiny
        result *= d * c
        step = -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1))
        d = 1.0 + step * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + step / c if abs(c) > tiny else 1.0 + step / tiny
        delta = d * c
        result *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return result


def _regularized_beta(a: float, b: float, x: float) -> float:
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(log_front)
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1 - x) / b


def student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    tail = 0.5 * _regularized_beta(df / 2, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on the CDF)."""
    if not 0 < p < 1:
        raise ValueError(f"p must be within (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    low, high = 0.0, 1.0
    while student_t_cdf(high, df) < p:
        high *= 2
    for _ in range(200):
        middle = (low + high) / 2
        if student_t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
        if high - low < 1e-12 * max(1.0, high):
            break
    return (low + high) / 2


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> Optional[Dict[str, Any]]:
    """``{"n", "mean", "std", "ci"}`` of ``values``: ``ci`` the Student-t interval of the mean
    (``None`` for a single value, whose spread is unknown); ``None`` for no values."""
    values = [float(v) for v in values]
    n = len(values)
    if n == 0:
        return None
    mean = statistics.fsum(values) / n
    if n == 1:
        return {"n": 1, "mean": mean, "std": None, "ci": None}
    std = statistics.stdev(values)
    half = t_quantile(0.5 + confidence / 2, n - 1) * std / math.sqrt(n)
    return {"n": n, "mean": mean, "std": std, "ci": [mean - half, mean + half]}


def _percentile(values: Sequence[float], q: float) -> Optional[float]:
    """The ``q`` quantile (0..1) by linear interpolation between the closest ranks."""
    ordered = sorted(values)
    if not ordered:
        return None
    position = (len(ordered) - 1) * q
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


# --- the figures --------------------------------------------------------------------------------


def latest_records(records: Iterable[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """The last record of each episode id, in the order the ids first appeared (a resumed run that
    played a rollout again supersedes the earlier attempt)."""
    latest: OrderedDict[str, Dict[str, Any]] = OrderedDict()
    for record in records:
        latest[str(record.get("episode_id"))] = dict(record)
    return list(latest.values())


def _status(record: Mapping[str, Any]) -> str:
    status = record.get("status")
    if status in ("ok", "unscored", "failed"):
        return str(status)
    return "ok" if isinstance(record.get("reward"), (int, float)) else "unscored"


def _tokens(record: Mapping[str, Any]) -> Optional[Tuple[int, int]]:
    tokens = record.get("tokens")
    if not isinstance(tokens, Mapping):
        return None
    prompt, completion = tokens.get("prompt"), tokens.get("completion")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    return prompt, completion


def _token_figures(records: Sequence[Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    counted = [t for t in (_tokens(r) for r in records) if t is not None]
    if not counted:
        return None
    totals = [p + c for p, c in counted]
    return {
        "n": len(counted),
        "mean_prompt": statistics.fmean(p for p, _ in counted),
        "mean_completion": statistics.fmean(c for _, c in counted),
        "mean_total": statistics.fmean(totals),
        "median_total": _percentile(totals, 0.5),
        "max_total": max(totals),
        "sum_total": sum(totals),
    }


def _rate(successes: int, n: int) -> Dict[str, Any]:
    interval = wilson_interval(successes, n)
    return {
        "successes": successes,
        "n": n,
        "rate": successes / n if n else None,
        "ci": list(interval) if interval else None,
    }


def summarize(
    records: Iterable[Mapping[str, Any]],
    *,
    success_threshold: float = 1.0,
    settings: Optional[Mapping[str, Any]] = None,
    run: Optional[Mapping[str, Any]] = None,
) -> Dict[str, Any]:
    """The figures of an evaluation (see the module docstring) from its rollout records.

    A rollout succeeds when its reward is at least ``success_threshold``. ``settings`` (how the
    rollouts were made) and ``run`` (``wall_s``, ``rollouts`` of the last invocation) are copied
    in; ``run`` gains ``rollouts_per_s``."""
    rows = latest_records(records)
    by_status = Counter(_status(r) for r in rows)
    ended = [r for r in rows if _status(r) != "failed"]
    scored = [r for r in rows if _status(r) == "ok"]
    rewards = [float(r["reward"]) for r in scored]
    successes = sum(1 for r in scored if float(r["reward"]) >= success_threshold)

    failures: Dict[str, Dict[str, Any]] = {}
    for record in rows:
        if _status(record) != "failed":
            continue
        error = record.get("error") if isinstance(record.get("error"), Mapping) else {}
        cause = str(error.get("cause") or "unknown")
        entry = failures.setdefault(cause, {"count": 0, "example": str(error.get("message") or ""), "episodes": []})
        entry["count"] += 1
        if len(entry["episodes"]) < 5:
            entry["episodes"].append(record.get("episode_id"))
    failures = dict(sorted(failures.items(), key=lambda item: (-item[1]["count"], item[0])))

    tasks: OrderedDict[Any, List[Dict[str, Any]]] = OrderedDict()
    for record in rows:
        tasks.setdefault(_task_key(record.get("task")), []).append(record)
    per_task = []
    for task, group in sorted(tasks.items(), key=lambda item: _sort_key(item[0])):
        task_ended = [r for r in group if _status(r) != "failed"]
        task_rewards = [float(r["reward"]) for r in group if _status(r) == "ok"]
        task_successes = sum(1 for r in task_rewards if r >= success_threshold)
        tokens = _token_figures(group)
        per_task.append(
            {
                "task": task,
                "rollouts": len(group),
                "ended": len(task_ended),
                "failed": len(group) - len(task_ended),
                "success": _rate(task_successes, len(task_ended)),
                "reward": mean_interval(task_rewards),
                "mean_tokens": tokens["mean_total"] if tokens else None,
            }
        )

    durations = [
        float(r["timings"]["total_s"])
        for r in rows
        if isinstance(r.get("timings"), Mapping) and isinstance(r["timings"].get("total_s"), (int, float))
    ]
    run_figures = dict(run or {})
    if run_figures.get("wall_s") and run_figures.get("rollouts") is not None:
        run_figures["rollouts_per_s"] = (
            run_figures["rollouts"] / run_figures["wall_s"] if run_figures["wall_s"] else None
        )
    return {
        "rollouts": len(rows),
        "ok": by_status.get("ok", 0),
        "unscored": by_status.get("unscored", 0),
        "failed": by_status.get("failed", 0),
        "success_threshold": success_threshold,
        "success": _rate(successes, len(ended)),
        "reward": mean_interval(rewards),
        "reward_range": [min(rewards), max(rewards)] if rewards else None,
        "tokens": _token_figures(rows),
        "token_totals": [p + c for p, c in (t for t in (_tokens(r) for r in rows) if t is not None)],
        "failures": failures,
        "tasks": per_task,
        "rollout_seconds": {
            "mean": statistics.fmean(durations) if durations else None,
            "p50": _percentile(durations, 0.5),
            "p95": _percentile(durations, 0.95),
            "max": max(durations) if durations else None,
        },
        "run": run_figures,
        "settings": dict(settings or {}),
    }


def _task_key(task: Any) -> Any:
    return task if isinstance(task, (int, str)) or task is None else str(task)


def _sort_key(task: Any) -> Tuple[int, Any]:
    if isinstance(task, int):
        return (0, task)
    return (1, str(task))


# --- text ----------------------------------------------------------------------------------------


def _num(value: Optional[float], digits: int = 3) -> str:
    """A figure for a reader: 3 significant digits below 1000, whole numbers with thousands separators above."""
    if value is None:
        return "n/a"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    text = f"{value:.{digits}g}"
    return "0" if text == "-0" else text


def _pct(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _ci(interval: Optional[Sequence[float]], as_pct: bool = False) -> str:
    if not interval:
        return ""
    low, high = interval
    if as_pct:
        return f" [{100 * low:.1f}%, {100 * high:.1f}%]"
    return f" [{_num(low)}, {_num(high)}]"


def summary_lines(summary: Mapping[str, Any]) -> List[str]:
    """A few lines for a terminal: counts, success rate and mean reward with their 95% intervals,
    tokens, failures by cause, speed."""
    success = summary["success"]
    reward = summary["reward"]
    lines = [
        f"{summary['rollouts']} rollouts: {summary['ok']} scored, {summary['unscored']} unscored, "
        f"{summary['failed']} failed",
        f"success rate (reward >= {summary['success_threshold']:g}): {_pct(success['rate'])}"
        f"{_ci(success['ci'], as_pct=True)} ({success['successes']}/{success['n']}, 95% Wilson)",
    ]
    if reward:
        lines.append(f"mean reward: {_num(reward['mean'])}{_ci(reward['ci'])} (n={reward['n']}, 95% t)")
    else:
        lines.append("mean reward: n/a (no rollout was scored)")
    tokens = summary.get("tokens")
    if tokens:
        lines.append(
            f"tokens per rollout: {_num(tokens['mean_total'])} mean ({_num(tokens['mean_prompt'])} prompt, "
            f"{_num(tokens['mean_completion'])} completion), max {tokens['max_total']}"
        )
    for cause, entry in summary["failures"].items():
        example = entry["example"]
        example = example if len(example) <= 160 else example[:157] + "..."
        lines.append(f"failed ({cause}): {entry['count']}, e.g. {example}")
    run = summary.get("run") or {}
    if run.get("wall_s"):
        lines.append(
            f"this run: {run.get('rollouts', 0)} rollouts in {run['wall_s']:.1f} s "
            f"({_num(run.get('rollouts_per_s'))} rollouts/s, concurrency {run.get('concurrency', '?')})"
        )
    return lines


# --- HTML ----------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1100px;
color:#1d1d1f;padding:0 1rem}
h1{font-size:1.5rem;margin-bottom:.2rem}h2{font-size:1.15rem;margin-top:2rem;border-bottom:1px solid #ddd}
.sub{color:#666;margin-top:0}.cards{display:flex;flex-wrap:wrap;gap:1rem;margin:1rem 0}
.card{border:1px solid #ddd;border-radius:8px;padding:.7rem 1rem;min-width:180px}
.card .v{font-size:1.5rem;font-weight:600}.card .k{color:#666;font-size:.85rem}
table{border-collapse:collapse;font-size:.88rem;margin:.5rem 0}
th,td{border-bottom:1px solid #eee;padding:.25rem .6rem;text-align:right}
th{background:#f6f6f6}td.l,th.l{text-align:left}.bad{color:#b00020}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:.82rem}
pre{background:#f6f6f6;padding:.6rem;overflow-x:auto}svg{max-width:100%;height:auto}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _bar_chart(
    labels: Sequence[str],
    values: Sequence[Optional[float]],
    *,
    title: str,
    y_label: str,
    errors: Optional[Sequence[Optional[Sequence[float]]]] = None,
    colors: Optional[Sequence[str]] = None,
    width: int = 1000,
    height: int = 300,
    y_range: Optional[Tuple[float, float]] = None,
) -> str:
    """An inline SVG bar chart: one bar per label (a missing value draws none), optional error
    bars (``[low, high]`` per bar), axis ticks and a title."""
    left, right, top, bottom = 60, 15, 30, 45
    plot_w, plot_h = width - left - right, height - top - bottom
    points = [v for v in values if v is not None]
    for interval in errors or []:
        if interval:
            points.extend(interval)
    if y_range is not None:
        points.extend(y_range)
    ticks = _nice_ticks(min([0.0, *points]), max([0.0, *points]))
    low, high = ticks[0], ticks[-1]

    def y(value: float) -> float:
        return top + plot_h * (high - value) / (high - low)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" role="img" aria-label="{_e(title)}">',
        f'<text x="{left}" y="18" font-size="14" font-weight="600">{_e(title)}</text>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#888"/>',
        f'<line x1="{left}" y1="{y(0):.1f}" x2="{left + plot_w}" y2="{y(0):.1f}" stroke="#888"/>',
        f'<text x="14" y="{top + plot_h / 2:.0f}" font-size="11" transform="rotate(-90 14 {top + plot_h / 2:.0f})" '
        f'text-anchor="middle">{_e(y_label)}</text>',
    ]
    for tick in ticks:
        parts.append(
            f'<line x1="{left - 4}" y1="{y(tick):.1f}" x2="{left + plot_w}" y2="{y(tick):.1f}" stroke="#eee"/>'
            f'<text x="{left - 6}" y="{y(tick) + 4:.1f}" font-size="10" text-anchor="end">{_e(_num(tick))}</text>'
        )
    count = max(1, len(labels))
    slot = plot_w / count
    bar = max(1.0, slot * 0.75)
    every = max(1, math.ceil(count / 40))  # at most ~40 labels under the axis
    for index, label in enumerate(labels):
        x = left + slot * index + (slot - bar) / 2
        value = values[index]
        color = colors[index] if colors else "#4e79a7"
        if value is not None:
            y0, y1 = sorted((y(0), y(value)))
            parts.append(
                f'<rect x="{x:.1f}" y="{y0:.1f}" width="{bar:.1f}" height="{max(0.5, y1 - y0):.1f}" fill="{color}">'
                f"<title>{_e(label)}: {_e(_num(value))}</title></rect>"
            )
        interval = errors[index] if errors else None
        if interval:
            centre = x + bar / 2
            parts.append(
                f'<line x1="{centre:.1f}" y1="{y(interval[0]):.1f}" x2="{centre:.1f}" y2="{y(interval[1]):.1f}" '
                f'stroke="#222"/>'
            )
        if index % every == 0:
            parts.append(
                f'<text x="{x + bar / 2:.1f}" y="{top + plot_h + 14}" font-size="9" text-anchor="middle">'
                f"{_e(label)}</text>"
            )
    parts.append("</svg>")
    return "".join(parts)


def _nice_ticks(low: float, high: float, count: int = 5) -> List[float]:
    """Round tick values (steps of 1, 2, 2.5 or 5 times a power of ten) covering [low, high]."""
    if high <= low:
        high = low + 1.0
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    start = math.floor(low / step + 1e-9) * step
    ticks = [start]
    while ticks[-1] < high - 1e-9 * step:
        ticks.append(round(start + step * len(ticks), 12))
    return ticks


def _histogram(values: Sequence[float], *, title: str, x_label: str, bins: int = 20) -> str:
    if not values:
        return ""
    low, high = min(values), max(values)
    if high == low:
        edges = [low, low + 1]
        counts = [len(values)]
    else:
        width = (high - low) / bins
        edges = [low + width * i for i in range(bins + 1)]
        counts = [0] * bins
        for value in values:
            counts[min(bins - 1, int((value - low) / width))] += 1
    labels = [_num(edges[i], 3) for i in range(len(counts))]
    return _bar_chart(labels, counts, title=title, y_label=f"rollouts (by {x_label})", height=240)


def _card(key: str, value: str, note: str = "") -> str:
    extra = f'<div class="k">{_e(note)}</div>' if note else ""
    return f'<div class="card"><div class="k">{_e(key)}</div><div class="v">{_e(value)}</div>{extra}</div>'


def render_html(summary: Mapping[str, Any], *, title: Optional[str] = None) -> str:
    """The report page: headline figures, a per-task chart and table, tokens, failures by cause,
    and the settings. Self-contained: inline CSS and SVG, no script."""
    settings = summary.get("settings") or {}
    run = summary.get("run") or {}
    success, reward, tokens = summary["success"], summary["reward"], summary.get("tokens")
    heading = (
        title or f"Evaluation of {settings.get('model') or 'a model'} on {settings.get('env') or 'an environment'}"
    )
    out = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        f"<title>{_e(heading)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(heading)}</h1>",
        f'<p class="sub">{_e(summary["rollouts"])} rollouts over {_e(len(summary["tasks"]))} tasks'
        f"{_e(' · ' + str(settings.get('created_at'))) if settings.get('created_at') else ''}</p>",
        '<div class="cards">',
        _card(
            f"success rate (reward ≥ {summary['success_threshold']:g})",
            _pct(success["rate"]),
            f"95% CI{_ci(success['ci'], as_pct=True)} (Wilson), {success['successes']}/{success['n']}",
        ),
        _card(
            "mean reward",
            _num(reward["mean"]) if reward else "n/a",
            f"95% CI{_ci(reward['ci'])} (t), n={reward['n']}" if reward else "no rollout was scored",
        ),
        _card(
            "tokens per rollout",
            _num(tokens["mean_total"]) if tokens else "n/a",
            f"{_num(tokens['mean_prompt'])} prompt + {_num(tokens['mean_completion'])} completion" if tokens else "",
        ),
        _card(
            "rollouts",
            f"{summary['ok']} / {summary['unscored']} / {summary['failed']}",
            "scored / unscored / failed",
        ),
    ]
    if run.get("wall_s"):
        out.append(
            _card(
                "this run",
                f"{_num(run.get('rollouts_per_s'))} rollouts/s",
                f"{run.get('rollouts', 0)} in {run['wall_s']:.1f} s at concurrency {run.get('concurrency', '?')}",
            )
        )
    out.append("</div>")

    tasks = summary["tasks"]
    if tasks:
        labels = [str(t["task"]) for t in tasks]
        means = [t["reward"]["mean"] if t["reward"] else None for t in tasks]
        errors = [t["reward"]["ci"] if t["reward"] else None for t in tasks]
        threshold = summary["success_threshold"]
        colors = ["#59a14f" if m is not None and m >= threshold else "#4e79a7" for m in means]
        out.append("<h2>Reward per task</h2>")
        out.append(
            _bar_chart(labels, means, errors=errors, colors=colors, title="Mean reward per task", y_label="reward")
        )
        out.append(
            "<p class=sub>Bars: mean reward of the task's scored rollouts (green: at or above the success "
            "threshold); whiskers: the 95% t interval when the task has two or more.</p>"
        )
        rates = [t["success"]["rate"] for t in tasks]
        out.append(
            _bar_chart(
                labels,
                rates,
                errors=[t["success"]["ci"] for t in tasks],
                title="Success rate per task",
                y_label="success rate",
                height=240,
                y_range=(0.0, 1.0),
            )
        )
        out.append("<p class=sub>Whiskers: the 95% Wilson interval of the task's rate.</p>")
    totals = summary.get("token_totals") or []
    if totals:
        out.append(_histogram(totals, title="Tokens per rollout", x_label="total tokens"))

    out.append("<h2>Failures by cause</h2>")
    if summary["failures"]:
        out.append('<table><tr><th class="l">cause</th><th>rollouts</th><th class="l">example</th></tr>')
        for cause, entry in summary["failures"].items():
            out.append(
                f'<tr><td class="l bad">{_e(cause)}</td><td>{entry["count"]}</td>'
                f'<td class="l"><code>{_e(entry["example"][:400])}</code><br>'
                f"<small>{_e(', '.join(str(e) for e in entry['episodes']))}</small></td></tr>"
            )
        out.append("</table>")
    else:
        out.append("<p>None.</p>")

    out.append("<h2>Per task</h2>")
    out.append(
        '<table><tr><th class="l">task</th><th>rollouts</th><th>failed</th><th>success rate</th>'
        "<th>95% CI (Wilson)</th><th>mean reward</th><th>95% CI (t)</th><th>tokens / rollout</th></tr>"
    )
    for task in tasks:
        rate, task_reward = task["success"], task["reward"]
        out.append(
            f'<tr><td class="l">{_e(task["task"])}</td><td>{task["rollouts"]}</td>'
            f"<td{' class=bad' if task['failed'] else ''}>{task['failed']}</td>"
            f"<td>{_e(_pct(rate['rate']))} ({rate['successes']}/{rate['n']})</td>"
            f"<td>{_e(_ci(rate['ci'], as_pct=True).strip())}</td>"
            f"<td>{_e(_num(task_reward['mean']) if task_reward else 'n/a')}</td>"
            f"<td>{_e(_ci(task_reward['ci']).strip() if task_reward else '')}</td>"
            f"<td>{_e(_num(task['mean_tokens']))}</td></tr>"
        )
    out.append("</table>")

    seconds = summary.get("rollout_seconds") or {}
    out.append("<h2>Time</h2>")
    out.append(
        f"<p>Per rollout: mean {_e(_num(seconds.get('mean')))} s, median {_e(_num(seconds.get('p50')))} s, "
        f"95th percentile {_e(_num(seconds.get('p95')))} s, longest {_e(_num(seconds.get('max')))} s.</p>"
    )
    out.append("<h2>Settings</h2>")
    out.append(f"<pre>{_e(json.dumps(settings, indent=2, sort_keys=True, default=str))}</pre>")
    out.append(
        "<p class=sub>Success rate: over the rollouts that ended (scored and unscored). Mean reward: over "
        "the scored ones. Failed rollouts count in neither.</p></body></html>"
    )
    return "\n".join(out)
