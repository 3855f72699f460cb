"""Run an Inspect AI evaluation as an :class:`~openenv.core.evals.EvalHarness`: :class:`InspectAIHarness`.

Inspect AI (``inspect-ai``, extra ``openenv[evals]``) is imported only when an evaluation runs,
so this module, and ``openenv.core.evals``, import without it.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from .base import EvalHarness

__all__ = ["InspectAIHarness"]

_INSTALL_HINT = "install it with: pip install 'openenv[evals]' (or pip install inspect-ai)"

# eval_parameters passed on to inspect_ai.eval under the same name: these two when non-empty...
_PASSED_IF_TRUTHY = ("task_args", "model_args")
# ...and these when not None.
_PASSED_IF_SET = (
    "max_samples",
    "max_connections",
    "temperature",
    "max_tokens",
    "epochs",
    "solver",
    "scorer",
    "model_base_url",
)
# What to do instead, for a parameter the installed Inspect AI's eval() does not take.
_INSTEAD = {
    "scorer": "give the task its scorer (inspect_ai.task_with(task, scorer=...)) and pass that Task as "
    "eval_parameters['task']",
}


class InspectAIHarness(EvalHarness):
    """Runs one Inspect AI evaluation (``inspect_ai.eval``) and returns its metrics.

    ``run`` evaluates ``eval_parameters["task"]`` (default: ``dataset``: a registered task name,
    a file such as ``"tasks.py@my_task"``, or a ``Task``) with ``eval_parameters["model"]``
    (required, e.g. ``"openai/gpt-4o"``; ``"mockllm/model"`` needs no network). Passed on when
    present: ``task_args``, ``model_args`` (when non-empty), ``max_samples``,
    ``max_connections``, ``temperature``, ``max_tokens``, ``epochs``, ``solver``, ``scorer``,
    ``model_base_url`` (when not None); other keys are left out, as upstream does, with a
    ``UserWarning`` naming them. Logs go to ``log_dir`` when given, else where Inspect AI puts
    them (``INSPECT_LOG_DIR``, ``./logs``).

    The scores are ``{metric name: value}`` over every scorer of every log Inspect AI returns;
    where two metrics share a name the keys are qualified, for all of them alike, by the scorer,
    then also the reducer, the task, the model, as far as it takes to keep them apart (e.g.
    ``"s1/mean"`` and ``"s2/mean"``). A run whose log Inspect AI did not mark ``"success"`` raises
    ``RuntimeError`` naming the task, the error and the log file.
    """

    def __init__(self, *, log_dir: Optional[str] = None) -> None:
        self.log_dir = log_dir

    def run(
        self,
        harness_version: str,
        library_versions: Dict[str, str],
        dataset: str,
        eval_parameters: Dict[str, Any],
    ) -> Dict[str, Any]:
        """Evaluate; return ``{metric: value}``. See the class docstring for the parameters.

        Raises ``ValueError`` (no ``model``, or a parameter this Inspect AI cannot take),
        ``ImportError`` (Inspect AI not installed), ``RuntimeError`` (no log, or a log that is
        not ``"success"``).
        """
        model = eval_parameters.get("model")
        if not model:
            raise ValueError(
                "eval_parameters['model'] is required: the model Inspect AI evaluates, e.g. 'openai/gpt-4o', "
                "or 'mockllm/model' for a run without a model"
            )
        inspect_eval = _inspect_eval()
        options: Dict[str, Any] = {}
        for key in _PASSED_IF_TRUTHY:
            if eval_parameters.get(key):
                options[key] = eval_parameters[key]
        for key in _PASSED_IF_SET:
            if eval_parameters.get(key) is not None:
                options[key] = eval_parameters[key]
        if self.log_dir is not None:
            options["log_dir"] = self.log_dir
        left_out = sorted(set(eval_parameters) - {"model", "task", *_PASSED_IF_TRUTHY, *_PASSED_IF_SET})
        if left_out:
            # Upstream ignores them too (a config must score the same on both); silence hides a typo.
            warnings.warn(
                f"InspectAIHarness does not pass eval_parameters {left_out} to Inspect AI; it passes "
                f"{['model', 'task', *_PASSED_IF_TRUTHY, *_PASSED_IF_SET]}",
                UserWarning,
                stacklevel=2,
            )
        # Refused before anything runs: Inspect AI would take an unknown keyword for a generation
        # option and fail with a message about GenerateConfig, or after the model was loaded.
        refused = sorted(set(options) - _keywords(inspect_eval))
        if refused:
            key = refused[0]
            raise ValueError(
                f"eval_parameters[{key!r}] cannot be passed on: inspect_ai.eval() (inspect-ai "
                f"{_inspect_version()}) takes no {key!r}; " + _INSTEAD.get(key, "remove it")
            )
        task = eval_parameters.get("task", dataset)
        logs = inspect_eval(task, model=model, **options)
        if not logs:
            raise RuntimeError(
                f"Inspect AI returned no logs for task {task!r} with model {model!r}: nothing was evaluated "
                "(is the task name right, and does the task file define it?)"
            )
        for log in logs:
            if log.status != "success":
                error = log.error.message if log.error is not None else "no error recorded"
                raise RuntimeError(
                    f"Inspect AI evaluation of task {log.eval.task!r} failed with status: {log.status} "
                    f"({error}); its log: {log.location or 'not written'}"
                )
        return _scores(logs)


def _inspect_eval() -> Callable[..., List[Any]]:
    try:
        from inspect_ai import eval as inspect_eval
    except ImportError as exc:
        raise ImportError(
            f"inspect-ai is required to run InspectAIHarness but is not installed; {_INSTALL_HINT}"
        ) from exc
    return inspect_eval


def _inspect_version() -> str:
    import inspect_ai

    return str(getattr(inspect_ai, "__version__", "?"))


def _keywords(function: Callable[..., Any]) -> Set[str]:
    """The keyword arguments ``function`` takes; its ``**kwargs`` are Inspect's generation options."""
    parameters = inspect.signature(function).parameters
    names = {name for name, p in parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        from inspect_ai.model import GenerateConfig

        names |= set(GenerateConfig.model_fields)
    return names


# The parts a score's key is made of, from the plainest key to the fullest: the first level at
# which every key differs is used for all of them.
_KEY_LEVELS = (
    ("metric",),
    ("scorer", "metric"),
    ("scorer", "reducer", "metric"),
    ("task", "scorer", "reducer", "metric"),
    ("model", "task", "scorer", "reducer", "metric"),
    ("log", "model", "task", "scorer", "reducer", "metric"),
)


def _scores(logs: Sequence[Any]) -> Dict[str, Any]:
    """Every metric of every log, keyed by its name, qualified only as far as names collide."""
    rows: List[Tuple[Dict[str, Optional[str]], Any]] = []
    for position, log in enumerate(logs):
        if log.results is None:
            continue
        for score in log.results.scores:
            for metric_name, metric in score.metrics.items():
                parts = {
                    "log": str(position),
                    "model": log.eval.model,
                    "task": log.eval.task,
                    "scorer": score.name,
                    "reducer": score.reducer,  # None without epochs: left out of the key
                    "metric": metric_name,
                }
                rows.append((parts, metric.value))
    if not rows:
        return {}
    for level in _KEY_LEVELS:
        keys = ["/".join(parts[name] for name in level if parts[name]) for parts, _ in rows]
        if len(set(keys)) == len(keys):
            return dict(zip(keys, (value for _, value in rows), strict=True))
    # Inspect AI names a task's scorers apart, so the fullest keys differ; if they ever do not,
    # say so rather than let one value overwrite another.
    raise RuntimeError(f"Inspect AI reported two values for the same metric: {[parts for parts, _ in rows]}")
