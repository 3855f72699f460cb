"""Collecting rollouts to disk: upstream OpenEnv 0.10's ``openenv.core.harness.collect``.

``openenv collect`` (and code of its own) plays episodes of an environment with a harness and a
model, and writes one JSON line per kept episode to ``results.jsonl`` beside a ``metadata.json``
that says how they were made; :func:`push_to_hf_hub` publishes the directory as a Hugging Face
dataset. The pieces:

* :class:`EpisodeRecord`: one episode as written (messages, reward, tool trace, metrics);
* :class:`RolloutSerializer`: the directory (``results.jsonl``, ``metadata.json``), appended to
  line by line so that a run can stop anywhere and be resumed;
* :class:`CollectRunner`: plays ``num_episodes`` episodes (ids ``<prefix>-<6 digits>``), skipping
  those already on disk when resuming, and returns a :class:`CollectResult`;
* :func:`build_model_step`: a :class:`~openenv.core.harness.rollout.ModelStep` over any
  :class:`~openenv.core.llm_client.LLMClient`;
* :func:`build_dataset_readme` and :func:`push_to_hf_hub`: the dataset card and the upload.

Beyond upstream: a torn last line (a run killed while writing) is dropped, not a reason to refuse
the whole file; :meth:`RolloutSerializer.ensure_metadata` keeps a resumed run's ``metadata.json``
as the first run wrote it and refuses to mix episodes made with other settings (upstream rewrites
it on every run); nothing here reads a generic ``API_KEY`` (the command names the variable).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Union

from .rollout import (
    HarnessAdapter,
    HarnessRolloutResult,
    HarnessRunLimits,
    ModelStep,
    ModelStepResult,
    ResourceSessionFactory,
    VerifyResult,
    _final_state,
    _resolve_env_reward,
)
from .tools import tool_name

__all__ = [
    "CollectResult",
    "CollectRunner",
    "EpisodeRecord",
    "RolloutSerializer",
    "build_dataset_readme",
    "build_model_step",
    "jsonable",
    "push_to_hf_hub",
]

logger = logging.getLogger("openenv.harness.collect")

RESULTS_FILE = "results.jsonl"
METADATA_FILE = "metadata.json"
README_FILE = "README.md"
FORWARDED_SAMPLING = ("temperature", "max_tokens", "top_p")
"""The sampling options :func:`build_model_step` hands to the LLM client; others are dropped with a warning."""


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON data: pydantic models dumped, dataclasses as dicts, sets and tuples
    as lists, non-finite floats as ``None`` (JSON has no NaN), anything else unknown as its text."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [jsonable(v) for v in items]
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        return jsonable(dump())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _tool_trace_dicts(rollout: HarnessRolloutResult) -> List[Dict[str, Any]]:
    return [
        {
            "tool_name": entry.tool_name,
            "arguments": jsonable(entry.arguments),
            "result": {
                "data": jsonable(entry.result.data),
                "done": bool(entry.result.done),
                "metadata": jsonable(entry.result.metadata),
                "error": entry.result.error,
            },
        }
        for entry in rollout.tool_trace
    ]


@dataclass
class EpisodeRecord:
    """One collected episode, as one line of ``results.jsonl`` (:meth:`to_dict`).

    ``reward`` is the environment's (see :func:`~openenv.core.harness.rollout._resolve_env_reward`),
    ``tool_trace`` every tool call with its result, ``metrics`` the harness's (turns, tool calls,
    why it stopped), ``verify_metrics`` and ``artifacts`` what the session's ``verify`` said,
    ``task`` what the episode was given, ``extra`` anything the caller adds."""

    episode_id: str
    messages: List[Dict[str, Any]]
    reward: Optional[float]
    done: bool
    tool_trace: List[Dict[str, Any]]
    metrics: Dict[str, Any]
    verify_metrics: Dict[str, Any]
    artifacts: Dict[str, Any]
    task: Any = None
    extra: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_rollout(
        cls,
        episode_id: str,
        rollout: HarnessRolloutResult,
        verify: VerifyResult,
        task: Any = None,
        extra: Optional[Dict[str, Any]] = None,
    ) -> EpisodeRecord:
        """The record of a finished rollout. ``ValueError`` when the environment produced no reward,
        or ``verify`` disagrees with the one the rollout's tool calls reported."""
        reward = _resolve_env_reward(rollout, verify)
        return cls(
            episode_id=episode_id,
            messages=jsonable(rollout.messages),
            reward=float(reward),
            done=bool(rollout.done or verify.done),
            tool_trace=_tool_trace_dicts(rollout),
            metrics=jsonable(rollout.metrics),
            verify_metrics=jsonable(verify.metrics),
            artifacts=jsonable(verify.artifacts),
            task=jsonable(task),
            extra=jsonable(dict(extra or {})),
        )

    def to_dict(self) -> Dict[str, Any]:
        """The record as JSON-safe data (what :meth:`RolloutSerializer.write_episode` writes)."""
        return {
            "episode_id": self.episode_id,
            "messages": jsonable(self.messages),
            "reward": None if self.reward is None else jsonable(float(self.reward)),
            "done": bool(self.done),
            "tool_trace": jsonable(self.tool_trace),
            "metrics": jsonable(self.metrics),
            "verify_metrics": jsonable(self.verify_metrics),
            "artifacts": jsonable(self.artifacts),
            "task": jsonable(self.task),
            "extra": jsonable(self.extra),
        }


def _utc_stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


class RolloutSerializer:
    """The output directory of a collection: ``results.jsonl`` (one episode a line, appended and
    flushed one by one) and ``metadata.json``.

    A run killed while writing leaves at most a torn last line (no newline at its end): readers
    skip it and the next write cuts it off. Any other line that is not a JSON object with an
    ``episode_id`` is a ``ValueError``: the file is not one this wrote, and resuming over it would
    lose data."""

    def __init__(self, output_dir: Union[str, os.PathLike]) -> None:
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)

    @property
    def results_path(self) -> Path:
        return self.output_dir / RESULTS_FILE

    @property
    def metadata_path(self) -> Path:
        return self.output_dir / METADATA_FILE

    # --- reading ------------------------------------------------------------------------------

    def _complete_lines(self) -> List[tuple]:
        """``(line number, text)`` of every complete line (the torn last one left out)."""
        try:
            data = self.results_path.read_bytes()
        except FileNotFoundError:
            return []
        lines = data.split(b"\n")
        torn = lines.pop()  # after the last newline: empty, or a line cut short by a kill
        if torn.strip():
            logger.warning("%s ends in a torn line (%d bytes), left out", self.results_path, len(torn))
        return [(n, line.decode("utf-8", errors="replace")) for n, line in enumerate(lines, start=1) if line.strip()]

    def read_records(self) -> List[Dict[str, Any]]:
        """Every record on disk, in the order written (a resumed run may repeat an id: the last wins)."""
        records = []
        for number, text in self._complete_lines():
            try:
                record = json.loads(text)
            except ValueError as exc:
                raise ValueError(f"{self.results_path}:{number}: not JSON ({exc})") from None
            if not isinstance(record, dict) or not isinstance(record.get("episode_id"), str):
                raise ValueError(f"{self.results_path}:{number}: not an episode record (no episode_id)")
            records.append(record)
        return records

    def collected_episode_ids(self) -> Set[str]:
        """The ids of the episodes on disk."""
        return {record["episode_id"] for record in self.read_records()}

    def read_metadata(self) -> Optional[Dict[str, Any]]:
        """``metadata.json``, or ``None`` when there is none."""
        try:
            data = json.loads(self.metadata_path.read_text())
        except FileNotFoundError:
            return None
        except ValueError as exc:
            raise ValueError(f"{self.metadata_path} is not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{self.metadata_path} is not a JSON object")
        return data

    # --- writing ------------------------------------------------------------------------------

    def _cut_torn_line(self) -> None:
        try:
            with open(self.results_path, "rb+") as handle:
                data = handle.read()
                end = data.rfind(b"\n") + 1
                if end != len(data):
                    handle.truncate(end)
        except FileNotFoundError:
            pass

    def write_line(self, record: Mapping[str, Any]) -> None:
        """Append one record (a JSON object with an ``episode_id``) and flush it to the file."""
        if not isinstance(record.get("episode_id"), str):
            raise ValueError("a record needs an episode_id (str)")
        line = json.dumps(jsonable(record), ensure_ascii=False, separators=(",", ":"))
        self._cut_torn_line()
        with open(self.results_path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def write_episode(self, record: Union[EpisodeRecord, Mapping[str, Any]]) -> None:
        """Append ``record`` (an :class:`EpisodeRecord`, or its dict) to ``results.jsonl``."""
        self.write_line(record.to_dict() if isinstance(record, EpisodeRecord) else record)

    def write_metadata(self, metadata: Mapping[str, Any]) -> None:
        """Write ``metadata.json`` whole (a new file renamed over the old: never half written)."""
        text = json.dumps(jsonable(metadata), indent=2, sort_keys=True) + "\n"
        handle, temporary = tempfile.mkstemp(prefix=".metadata.", dir=self.output_dir)
        try:
            with os.fdopen(handle, "w") as out:
                out.write(text)
            os.chmod(temporary, 0o644)  # (mkstemp makes it 0600; results.jsonl beside it is readable too)
            os.replace(temporary, self.metadata_path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    def ensure_metadata(self, metadata: Mapping[str, Any], *, ignore: Iterable[str] = ()) -> Dict[str, Any]:
        """The run's ``metadata.json``: written when there is none; otherwise kept as it is (a resumed
        run does not rewrite how the first one was made) and returned. ``ValueError`` when the file on
        disk says other settings, keys in ``ignore`` aside (episodes made otherwise must not mix)."""
        existing = self.read_metadata()
        if existing is None:
            self.write_metadata(metadata)
            return dict(jsonable(metadata))
        skip = set(ignore)
        wanted = jsonable(metadata)
        differ = sorted(k for k in set(wanted) | set(existing) if k not in skip and wanted.get(k) != existing.get(k))
        if differ:
            said = "; ".join(f"{k}: {existing.get(k)!r} on disk, {wanted.get(k)!r} now" for k in differ)
            raise ValueError(f"{self.output_dir} holds episodes made with other settings ({said})")
        return existing

    def backup_results(self) -> Optional[Path]:
        """Move ``results.jsonl`` aside as ``results.<UTC stamp>.bak.jsonl``; the new name, or ``None``."""
        if not self.results_path.exists():
            return None
        target = self.output_dir / f"results.{_utc_stamp()}.bak.jsonl"
        counter = 1
        while target.exists():
            target = self.output_dir / f"results.{_utc_stamp()}-{counter}.bak.jsonl"
            counter += 1
        os.replace(self.results_path, target)
        return target


@dataclass
class CollectResult:
    """What :meth:`CollectRunner.run` did: episodes written, skipped (on disk already), dropped
    (``should_keep`` said no) and failed; the ids written; their mean reward and the share of them
    with a reward above 0 (both 0.0 when none was written)."""

    num_collected: int
    num_skipped: int
    num_dropped: int
    num_failed: int
    episode_ids: List[str]
    avg_reward: float
    success_rate: float


class CollectRunner:
    """Plays episodes of ``session_factory``'s environment with ``harness_adapter`` and writes them.

    Episode ``i`` (0-based) is ``<prefix>-<i, 6 digits>``, made by
    ``session_factory.create(task, seed=i, episode_id=...)`` with ``task`` the ``i``-th of
    ``tasks`` (cycled; ``None`` without tasks), run white-box with the model step and ``limits``,
    verified, and written unless ``should_keep(record)`` says no. A session is closed whatever
    happened; a failing episode is counted and logged, and the run goes on."""

    def __init__(
        self,
        *,
        session_factory: ResourceSessionFactory[Any],
        harness_adapter: HarnessAdapter,
        serializer: RolloutSerializer,
        tasks: Optional[Sequence[Any]] = None,
        limits: Optional[HarnessRunLimits] = None,
    ) -> None:
        self.session_factory = session_factory
        self.harness_adapter = harness_adapter
        self.serializer = serializer
        self.tasks = list(tasks) if tasks is not None else None
        self.limits = limits

    def _task(self, index: int) -> Any:
        if not self.tasks:
            return None
        return self.tasks[index % len(self.tasks)]

    def run(
        self,
        *,
        model_step: ModelStep,
        num_episodes: int,
        episode_id_prefix: str = "ep",
        resume: bool = True,
        should_keep: Optional[Callable[[EpisodeRecord], bool]] = None,
    ) -> CollectResult:
        """Play episodes ``0 .. num_episodes - 1``. With ``resume``, an id already on disk is skipped
        (its task is still used up, so the others keep theirs); without, the old ``results.jsonl``
        is moved aside first (``results.<stamp>.bak.jsonl``, with a ``RuntimeWarning``)."""
        if type(num_episodes) is not int or num_episodes < 0:
            raise ValueError(f"num_episodes must be a whole number >= 0, got {num_episodes!r}")
        if resume:
            done = self.serializer.collected_episode_ids()
        else:
            done = set()
            moved = self.serializer.backup_results()
            if moved is not None:
                warnings.warn(f"resume=False: the earlier results were moved to {moved}", RuntimeWarning, stacklevel=2)
        collected: List[str] = []
        rewards: List[float] = []
        skipped = dropped = failed = 0
        for index in range(num_episodes):
            episode_id = f"{episode_id_prefix}-{index:06d}"
            task = self._task(index)
            if episode_id in done:
                skipped += 1
                continue
            record = self._play(model_step, index, episode_id, task)
            if record is None:
                failed += 1
                continue
            if should_keep is not None and not should_keep(record):
                dropped += 1
                continue
            self.serializer.write_episode(record)
            collected.append(episode_id)
            rewards.append(float(record.reward or 0.0))
        return CollectResult(
            num_collected=len(collected),
            num_skipped=skipped,
            num_dropped=dropped,
            num_failed=failed,
            episode_ids=collected,
            avg_reward=sum(rewards) / len(rewards) if rewards else 0.0,
            success_rate=sum(1 for r in rewards if r > 0) / len(rewards) if rewards else 0.0,
        )

    def _play(self, model_step: ModelStep, index: int, episode_id: str, task: Any) -> Optional[EpisodeRecord]:
        session = None
        try:
            session = self.session_factory.create(task, seed=index, episode_id=episode_id)
            rollout = self.harness_adapter.run_white_box(model_step, session, self.limits)
            verify = session.verify(rollout.messages, _final_state(rollout))
            return EpisodeRecord.from_rollout(episode_id, rollout, verify, task=task)
        except Exception:
            logger.warning("episode %s failed; not written", episode_id, exc_info=True)
            return None
        finally:
            if session is not None:
                try:
                    session.close()
                except Exception:
                    logger.warning("closing the session of %s failed", episode_id, exc_info=True)


def _tool_dict(tool: Any) -> Dict[str, Any]:
    """A tool as an LLM client takes it: ``{"name", "description", "inputSchema"}``."""
    if isinstance(tool, Mapping):
        schema = tool.get("inputSchema", tool.get("input_schema")) or {}
        return {"name": tool_name(tool), "description": tool.get("description") or "", "inputSchema": schema}
    return {
        "name": tool_name(tool),
        "description": getattr(tool, "description", "") or "",
        "inputSchema": getattr(tool, "input_schema", None) or {},
    }


def build_model_step(llm_client: Any, *, system_prompt: Optional[str] = None) -> ModelStep:
    """A model step that asks ``llm_client`` (an :class:`~openenv.core.llm_client.LLMClient`) for
    each turn: ``system_prompt`` goes first when the conversation has no system message, tools are
    handed over as ``{"name", "description", "inputSchema"}``, and of the sampling options only
    ``temperature``, ``max_tokens`` and ``top_p`` are forwarded (any other is dropped, with a
    ``RuntimeWarning``). The reply carries no token ids: an LLM client does not return them."""
    from openenv.core.utils import run_async_safely

    def step(messages: List[Dict[str, Any]], tools: List[Any], sampling: Dict[str, Any]) -> ModelStepResult:
        conversation = list(messages)
        if system_prompt and not any(m.get("role") == "system" for m in conversation):
            conversation.insert(0, {"role": "system", "content": system_prompt})
        dropped = sorted(k for k in sampling if k not in FORWARDED_SAMPLING)
        if dropped:
            warnings.warn(
                f"sampling options {', '.join(dropped)} are not forwarded to the LLM client "
                f"(only {', '.join(FORWARDED_SAMPLING)})",
                RuntimeWarning,
                stacklevel=2,
            )
        options = {k: sampling[k] for k in FORWARDED_SAMPLING if k in sampling}
        response = run_async_safely(
            llm_client.complete_with_tools(conversation, [_tool_dict(t) for t in tools], **options)
        )
        return ModelStepResult(response=response)

    return step


def build_dataset_readme(output_dir: Union[str, os.PathLike]) -> str:
    """The dataset card of a collection directory: Hugging Face front matter (``results.jsonl`` as
    the train split), how the episodes were made (``metadata.json``) and their count and rewards."""
    serializer = RolloutSerializer(output_dir)
    records = serializer.read_records() if serializer.results_path.exists() else []
    metadata = serializer.read_metadata() or {}
    rewards = [float(r["reward"]) for r in records if isinstance(r.get("reward"), (int, float))]
    lines = [
        "---",
        "configs:",
        "- config_name: default",
        "  data_files:",
        "  - split: train",
        f"    path: {RESULTS_FILE}",
        "tags:",
        "- openenv",
        "- rollouts",
        "---",
        "",
        f"# Rollouts of {metadata.get('env', 'an OpenEnv environment')}",
        "",
        f"{len(records)} episode(s) collected with `openenv collect` (one JSON object per line in `{RESULTS_FILE}`:"
        " messages, reward, tool trace, metrics).",
        "",
    ]
    if rewards:
        mean = sum(rewards) / len(rewards)
        positive = sum(1 for r in rewards if r > 0)
        lines += [f"Mean reward {mean:.4g}; {positive} of {len(rewards)} with a reward above 0.", ""]
    if metadata:
        lines += ["## How they were made", "", "```json", json.dumps(metadata, indent=2, sort_keys=True), "```", ""]
    return "\n".join(lines)


def push_to_hf_hub(
    output_dir: Union[str, os.PathLike],
    repo_id: str,
    *,
    private: bool = False,
    commit_message: Optional[str] = None,
    token: Optional[str] = None,
) -> str:
    """Upload a collection directory (``results.jsonl``, ``metadata.json`` and a generated
    ``README.md``) to the Hugging Face dataset ``repo_id`` (created if missing); the dataset's URL.

    ``FileNotFoundError`` when the directory has no ``results.jsonl``. Credentials: ``token``, else
    what ``huggingface_hub`` finds (``HF_TOKEN``, ``hf auth login``). Needs ``pip install
    'openenv[hub]'``."""
    directory = Path(output_dir)
    serializer = RolloutSerializer(directory)
    if not serializer.results_path.is_file():
        raise FileNotFoundError(f"no {RESULTS_FILE} in {directory}: nothing to push")
    try:
        from huggingface_hub import HfApi
    except ImportError:
        raise ImportError("pushing to the Hub needs huggingface_hub: pip install 'openenv[hub]'") from None
    count = len(serializer.read_records())
    (directory / README_FILE).write_text(build_dataset_readme(directory))
    api = HfApi(token=token)
    api.create_repo(repo_id=repo_id, repo_type="dataset", private=private, exist_ok=True)
    api.upload_folder(
        folder_path=str(directory),
        repo_id=repo_id,
        repo_type="dataset",
        commit_message=commit_message or f"Add {count} collected episode(s)",
        allow_patterns=[RESULTS_FILE, METADATA_FILE, README_FILE],
    )
    return f"https://huggingface.co/datasets/{repo_id}"
