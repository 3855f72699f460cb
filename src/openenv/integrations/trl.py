"""Train with TRL's ``GRPOTrainer`` in OpenEnv environments.

TRL (1.16) has two hooks for environments, and this module fills each:

* :class:`EnvRollout` is a ``rollout_func``. For each prompt of a batch it plays one episode in
  its own environment session: the prompt, plus the text of the observation ``reset`` returned,
  goes to the trainer's own generation backend (transformers ``generate`` or vLLM, as configured);
  ``to_action`` turns the completion into an action; the episode goes on for up to ``max_turns``
  turns. It returns the token ids TRL trains on and each episode's total reward as the extra
  field ``env_reward``, which the :func:`env_reward` reward function hands back to TRL::

      rollout = EnvRollout(ReasoningGymEnv.from_env("reasoning_gym_env"),
                           to_action=lambda text, obs: ReasoningGymAction(answer=text.strip()),
                           reset_kwargs=lambda prompt: {"dataset_name": "aiw", "seed": seed_of(prompt)})
      trainer = GRPOTrainer(model, reward_funcs=env_reward, rollout_func=rollout, ...)

* :class:`EnvironmentFactory` is an ``environment_factory`` for tool-calling models. Each
  instance TRL makes holds one session; the environment's MCP tools (or, for a typed
  environment, one tool whose arguments are the action's fields) become its public methods,
  which TRL shows the model as tools. ``get_reward`` returns the reward the episode earned.

Both take an async client that has not been used yet: ``MyEnv(base_url=...)`` for a running
server, or ``MyEnv.from_env("name")`` to serve an installed environment in a sandbox (started on
first use, stopped by :meth:`close`). Further sessions are opened on the same server. GRPO
compares the completions of one prompt, so every session that receives the same prompt must
face the same task: ``reset_kwargs(prompt)`` chooses the reset options, and by default seeds
the reset with a hash of the prompt.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import threading
import typing
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..core.client_types import StepResult
from ..core.env_client import EnvClient
from ..core.loop_thread import LoopThread
from ..core.utils import prompt_seed

__all__ = ["EnvRollout", "EnvironmentFactory", "env_reward", "observation_text", "prompt_seed", "require_trl"]

_INSTALL_HINT = "install it with: pip install 'trl>=1.16' (or pip install 'openenv[trl]')"

ToAction = Callable[[str, Any], Any]
ObservationText = Callable[[Any], Optional[str]]
ResetKwargs = Callable[[Any], Dict[str, Any]]


def require_trl(feature: str) -> None:
    """Raise ImportError, saying what to install, unless TRL's ``GRPOTrainer`` accepts ``feature``."""
    try:
        import trl
        from trl import GRPOTrainer
    except ImportError as exc:
        raise ImportError(f"openenv.integrations.trl needs TRL, which is not installed; {_INSTALL_HINT}") from exc
    if feature not in inspect.signature(GRPOTrainer.__init__).parameters:
        raise ImportError(f"TRL {trl.__version__} has no GRPOTrainer({feature}=...); {_INSTALL_HINT}")


def _seed_from_prompt(prompt: Any) -> Dict[str, Any]:
    return {"seed": prompt_seed(prompt)}


_HIDDEN_FIELDS = {"reward", "done", "metadata"}


def observation_text(observation: Any) -> Optional[str]:
    """The default text of an observation: a tool's result, a string as it is, else one
    ``field: value`` line per field that is set (``reward``, ``done`` and ``metadata`` left out)."""
    if observation is None:
        return None
    if isinstance(observation, str):
        return observation
    if hasattr(observation, "tool_name") and hasattr(observation, "result"):
        error = getattr(observation, "error", None)
        if error is not None:
            return f"error: {getattr(error, 'message', error)}"
        result = observation.result
        return result if isinstance(result, str) else json.dumps(result, default=str)
    fields = observation.model_dump() if hasattr(observation, "model_dump") else dict(observation)
    lines = [f"{key}: {value}" for key, value in fields.items() if key not in _HIDDEN_FIELDS and value is not None]
    return "\n".join(lines) if lines else None


def env_reward(completions: Sequence[Any], env_reward: Optional[Sequence[float]] = None, **kwargs: Any) -> List[float]:
    """TRL reward function: the reward each completion's episode earned in the environment.

    Pass it in ``reward_funcs`` together with an :class:`EnvRollout`, which supplies ``env_reward``.
    """
    if env_reward is None:
        raise ValueError(
            "env_reward got no 'env_reward' values: use it with rollout_func=EnvRollout(...), "
            "which returns them with each batch"
        )
    return [float(r) for r in env_reward]


class _Sessions:
    """Sessions of one environment server, driven from a private event loop.

    The client given first becomes the first session; the others are opened on its server.
    """

    def __init__(self, client: EnvClient[Any, Any, Any]) -> None:
        if not isinstance(client, EnvClient):
            raise TypeError(
                f"expected an async OpenEnv client such as MyEnv(base_url=...) or MyEnv.from_env('name'), "
                f"got {type(client).__name__} (pass the client itself, not client.sync())"
            )
        self.client = client
        self._loop = LoopThread(name="openenv-trl-loop")
        self._idle: List[EnvClient[Any, Any, Any]] = []
        self._opened = 0
        self._lock = threading.Lock()
        self._closed = False

    def run(self, coro: Any) -> Any:
        return self._loop.run(coro)

    def call(self, method: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Call a client's dual-mode ``method`` on the private loop (where it returns a coroutine)."""
        return self.call_all([functools.partial(method, *args, **kwargs)])[0]

    def call_all(self, calls: Sequence[Callable[[], Any]]) -> List[Any]:
        """Run ``calls`` (each returning a coroutine once on the loop) concurrently; their results in order."""

        async def gather() -> List[Any]:
            return list(await asyncio.gather(*(call() for call in calls)))

        return self.run(gather())

    async def _open(self) -> EnvClient[Any, Any, Any]:
        if self._opened == 0:
            await self.client.connect()
            session = self.client
        else:
            session = await self.client.new_session()
        self._opened += 1
        return session

    def acquire(self, count: int) -> List[EnvClient[Any, Any, Any]]:
        """``count`` sessions for the caller's exclusive use until :meth:`release`."""
        if self._closed:
            raise RuntimeError("the environment sessions are closed")
        with self._lock:
            taken, self._idle = self._idle[:count], self._idle[count:]
            missing = count - len(taken)

        async def open_many() -> List[EnvClient[Any, Any, Any]]:
            opened = []
            for _ in range(missing):  # one at a time: the first one may start the server
                opened.append(await self._open())
            return opened

        return taken + (self.run(open_many()) if missing else [])

    def release(self, sessions: Sequence[EnvClient[Any, Any, Any]]) -> None:
        with self._lock:
            self._idle.extend(sessions)

    def close(self) -> None:
        """Close every session (and stop the server the client started, if any)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._opened:
                self.call(self.client.close)
        finally:
            self._loop.stop()


def _reward_of(result: StepResult[Any]) -> float:
    return float(result.reward) if result.reward is not None else 0.0


class _Episode:
    __slots__ = ("completion_ids", "done", "env_mask", "logprobs", "observation", "prompt_ids", "reward", "turns")

    def __init__(self, prompt_ids: List[int], observation: Any) -> None:
        self.prompt_ids = prompt_ids
        self.observation = observation
        self.completion_ids: List[int] = []
        self.env_mask: List[int] = []
        self.logprobs: Optional[List[float]] = []  # None once the backend gave none
        self.reward = 0.0
        self.turns = 0
        self.done = False

    def context(self) -> List[int]:
        return self.prompt_ids + self.completion_ids

    def add(self, ids: Sequence[int], logprobs: Optional[Sequence[float]], from_model: bool) -> None:
        self.completion_ids.extend(int(i) for i in ids)
        self.env_mask.extend([1 if from_model else 0] * len(ids))
        if from_model and logprobs is None:
            self.logprobs = None
        elif self.logprobs is not None:
            self.logprobs.extend([float(x) for x in logprobs] if logprobs is not None else [0.0] * len(ids))


class EnvRollout:
    """A TRL ``rollout_func`` that plays one environment episode per prompt.

    Per prompt: ``reset(**reset_kwargs(prompt))``; the prompt with the observation's text appended
    (``observation_text``; for chat prompts, appended to the last message) is generated from with
    the trainer's backend; ``step(to_action(completion_text, observation))``; while the episode
    is not done and fewer than ``max_turns`` turns were played, the new observation's text is
    appended to the sequence (tokenized as plain text, masked out of the loss) and the model
    continues. The episode's reward is the sum of its step rewards (None counts as 0).

    Returns ``prompt_ids``, ``completion_ids``, ``logprobs`` (None when the backend gives none),
    ``env_mask`` (when ``max_turns > 1``), ``env_reward`` and ``env_turns`` per prompt. At most
    ``max_sessions`` episodes run at once (default: the whole batch). Call :meth:`close` (or use
    ``with``) when training ends. With several processes and vLLM, every process must make the
    same number of generation calls: use ``max_turns=1`` there.
    """

    def __init__(
        self,
        client: EnvClient[Any, Any, Any],
        *,
        to_action: ToAction,
        observation_text: ObservationText = observation_text,
        reset_kwargs: ResetKwargs = _seed_from_prompt,
        max_turns: int = 1,
        max_sessions: Optional[int] = None,
    ) -> None:
        require_trl("rollout_func")
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        if max_sessions is not None and max_sessions < 1:
            raise ValueError(f"max_sessions must be at least 1 or None, got {max_sessions}")
        self._sessions = _Sessions(client)
        self.to_action = to_action
        self.observation_text = observation_text
        self.reset_kwargs = reset_kwargs
        self.max_turns = max_turns
        self.max_sessions = max_sessions

    @property
    def client(self) -> EnvClient[Any, Any, Any]:
        """The client of the first session (its ``base_url`` is the server's)."""
        return self._sessions.client

    def __call__(self, prompts: List[Any], trainer: Any) -> Dict[str, Any]:
        wave = self.max_sessions or len(prompts)
        episodes: List[_Episode] = []
        for start in range(0, len(prompts), wave):
            episodes.extend(self._play(prompts[start : start + wave], trainer))
        logprobs = [e.logprobs for e in episodes]
        output: Dict[str, Any] = {
            "prompt_ids": [e.prompt_ids for e in episodes],
            "completion_ids": [e.completion_ids for e in episodes],
            "logprobs": None if any(lp is None for lp in logprobs) else logprobs,
            "env_reward": [e.reward for e in episodes],
            "env_turns": [e.turns for e in episodes],
        }
        if self.max_turns > 1:
            output["env_mask"] = [e.env_mask for e in episodes]
        return output

    def _play(self, prompts: List[Any], trainer: Any) -> List[_Episode]:
        tokenizer = _tokenizer_of(trainer)
        sessions = self._sessions.acquire(len(prompts))
        try:
            resets = self._sessions.call_all(
                [functools.partial(s.reset, **self.reset_kwargs(p)) for s, p in zip(sessions, prompts, strict=True)]
            )
            episodes = [
                _Episode(_prompt_ids(tokenizer, p, self.observation_text(r.observation)), r.observation)
                for p, r in zip(prompts, resets, strict=True)
            ]
            for prompt, result in zip(prompts, resets, strict=True):
                if result.done:
                    error = (getattr(result.observation, "metadata", None) or {}).get("error", "no error given")
                    raise RuntimeError(
                        f"reset with {self.reset_kwargs(prompt)} ended the episode before any action "
                        f"({error}); check reset_kwargs"
                    )
            for turn in range(self.max_turns):
                active = [i for i, e in enumerate(episodes) if not e.done]
                if not active:
                    break
                completion_ids, logprobs = _generate(trainer, [episodes[i].context() for i in active])
                texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
                actions = [self.to_action(text, episodes[i].observation) for i, text in zip(active, texts, strict=True)]
                results = self._sessions.call_all(
                    [functools.partial(sessions[i].step, a) for i, a in zip(active, actions, strict=True)]
                )
                last_turn = turn == self.max_turns - 1
                for k, (i, result) in enumerate(zip(active, results, strict=True)):
                    episode = episodes[i]
                    episode.add(completion_ids[k], logprobs[k] if logprobs is not None else None, from_model=True)
                    episode.observation, episode.done = result.observation, result.done
                    episode.reward += _reward_of(result)
                    episode.turns += 1
                    if not episode.done and not last_turn:
                        feedback = self.observation_text(result.observation) or ""
                        episode.add(tokenizer.encode(feedback, add_special_tokens=False), None, from_model=False)
            return episodes
        finally:
            self._sessions.release(sessions)

    def close(self) -> None:
        """Close the sessions (and the server the client started, if any)."""
        self._sessions.close()

    def __enter__(self) -> EnvRollout:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _tokenizer_of(trainer: Any) -> Any:
    processing_class = trainer.processing_class
    return getattr(processing_class, "tokenizer", processing_class)


def _prompt_ids(tokenizer: Any, prompt: Any, text: Optional[str]) -> List[int]:
    if isinstance(prompt, str):
        return list(tokenizer.encode(prompt + (text or ""), add_special_tokens=False))
    messages = [dict(m) for m in prompt]
    if text:
        messages[-1]["content"] = f"{messages[-1].get('content') or ''}{text}"
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    return list(ids)


def _generate(trainer: Any, prompt_ids: List[List[int]]) -> Tuple[List[List[int]], Optional[List[List[float]]]]:
    """Completions of ``prompt_ids`` (one each) from the trainer's configured backend."""
    generate = getattr(trainer, "_generate_single_turn", None)
    if generate is None:
        import trl

        raise RuntimeError(
            f"EnvRollout drives GRPOTrainer._generate_single_turn, which TRL {trl.__version__} lacks; "
            "use TRL 1.16 (pip install 'trl~=1.16')"
        )
    completion_ids, logprobs = generate(prompt_ids, None, {}, 1)
    return [list(c) for c in completion_ids], logprobs


# --- environment_factory ------------------------------------------------------------------------

_JSON_TYPES: Dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list,
    "object": dict,
}


def _python_type(schema: Mapping[str, Any]) -> Any:
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    if kind is None:
        options = [s for s in schema.get("anyOf", []) if s.get("type") != "null"]
        if len(options) == 1:
            return _python_type(options[0])
        return Any
    return _JSON_TYPES.get(kind, Any)


def _tool_method(name: str, description: str, schema: Mapping[str, Any]) -> Callable[..., str]:
    """A method ``name(self, **arguments) -> str`` whose signature and docstring state the tool's
    arguments the way ``transformers.utils.get_json_schema`` reads them."""
    properties: Mapping[str, Any] = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: Dict[str, Any] = {}
    doc_args = []
    for arg, spec in properties.items():
        kind = _python_type(spec)
        annotations[arg] = kind
        default = inspect.Parameter.empty if arg in required else spec.get("default")
        params.append(inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=kind))
        text = " ".join(str(spec.get("description") or spec.get("title") or f"The {arg}.").split())
        doc_args.append(f"    {arg}: {text}")
    annotations["return"] = str

    def method(self: _ToolEnvironment, **arguments: Any) -> str:
        return self._call(name, arguments)

    method.__name__ = method.__qualname__ = name
    method.__signature__ = inspect.Signature(params, return_annotation=str)  # type: ignore[attr-defined]
    method.__annotations__ = annotations
    summary = " ".join((description or f"Call the {name} tool.").split())
    method.__doc__ = summary + ("\n\nArgs:\n" + "\n".join(doc_args) if doc_args else "") + "\n"
    return method


class _ToolEnvironment:
    """Base of the classes :class:`EnvironmentFactory` builds; public methods are the tools."""

    _factory: EnvironmentFactory

    def __init__(self, factory: EnvironmentFactory) -> None:
        self._factory = factory
        self._session = factory._sessions.acquire(1)[0]
        self.reward = 0.0
        self.done = False
        self.observation: Any = None

    def reset(self, **kwargs: Any) -> Optional[str]:
        """Start an episode; TRL passes the dataset row. Returns the text appended to the prompt."""
        factory = self._factory
        result = factory._sessions.call(self._session.reset, **factory.reset_kwargs(kwargs))
        self.reward, self.done, self.observation = 0.0, result.done, result.observation
        return factory.observation_text(result.observation)

    def get_reward(self) -> float:
        """The reward the episode earned so far (the sum of its step rewards)."""
        return self.reward

    def _call(self, name: str, arguments: Dict[str, Any]) -> str:
        if self.done:
            raise RuntimeError("the episode is over: no more tool calls are accepted")
        factory = self._factory
        action = factory._action(name, arguments)
        result = factory._sessions.call(self._session.step, action)
        self.reward += _reward_of(result)
        self.done, self.observation = result.done, result.observation
        error = getattr(result.observation, "error", None)
        if error is not None:
            raise RuntimeError(getattr(error, "message", str(error)))
        return factory.observation_text(result.observation) or ""


def _reset_from_row(row: Dict[str, Any]) -> Dict[str, Any]:
    return _seed_from_prompt(row.get("prompt", ""))


class EnvironmentFactory:
    """A TRL ``environment_factory``: each call returns an object holding one environment session.

    For an MCP environment (a client with ``list_tools``) the object's public methods are the
    environment's tools (all of them, or those named in ``tools``); calling one steps the
    environment with a ``CallToolAction``. For a typed environment it has one method,
    ``action_tool`` (default ``"act"``), whose arguments are the fields of ``action_cls``
    (default: the client's action type). Tools return the observation's text
    (``observation_text``); a tool error, or a call after the episode ended, raises.

    ``reset(**row)`` (TRL passes the dataset row) resets with ``reset_kwargs(row)`` (default: a
    seed from the row's prompt) and returns the observation's text. ``get_reward()`` is the sum of
    the episode's step rewards, ``reward`` the same as an attribute (for reward functions that
    read ``environments``), ``done`` whether the episode has ended. Call :meth:`close` when done.
    """

    def __init__(
        self,
        client: EnvClient[Any, Any, Any],
        *,
        tools: Optional[Sequence[str]] = None,
        action_cls: Optional[type] = None,
        action_tool: str = "act",
        observation_text: ObservationText = observation_text,
        reset_kwargs: Callable[[Dict[str, Any]], Dict[str, Any]] = _reset_from_row,
    ) -> None:
        require_trl("environment_factory")
        self._sessions = _Sessions(client)
        self._wanted_tools = list(tools) if tools is not None else None
        self._action_cls = action_cls
        self._action_tool = action_tool
        self.observation_text = observation_text
        self.reset_kwargs = reset_kwargs
        self._mcp = hasattr(client, "list_tools")
        self._cls: Optional[type] = None

    def __call__(self) -> Any:
        if self._cls is None:
            self._cls = self._build_class()
        return self._cls(self)

    @property
    def tool_names(self) -> List[str]:
        """The names of the tools the environment objects expose."""
        if self._cls is None:
            self._cls = self._build_class()
        return sorted(n for n, v in vars(self._cls).items() if inspect.isfunction(v) and not n.startswith("_"))

    def _build_class(self) -> type:
        if self._mcp:
            session = self._sessions.acquire(1)
            try:
                listed = self._sessions.call(session[0].list_tools)
            finally:
                self._sessions.release(session)
            by_name = {t.name: t for t in listed}
            names = self._wanted_tools if self._wanted_tools is not None else sorted(by_name)
            unknown = [n for n in names if n not in by_name]
            if unknown:
                raise ValueError(f"the environment has no tools {unknown}; it has {sorted(by_name)}")
            specs = [(n, by_name[n].description, by_name[n].input_schema) for n in names]
        else:
            action_cls = self._action_cls or _action_type(self._sessions.client)
            self._action_cls = action_cls
            schema = action_cls.model_json_schema()
            hidden = {"metadata"}
            schema = {
                "properties": {k: v for k, v in schema.get("properties", {}).items() if k not in hidden},
                "required": [k for k in schema.get("required", []) if k not in hidden],
            }
            description = (action_cls.__doc__ or "").strip()
            specs = [(self._action_tool, description, schema)]
        reserved = [n for n, _, _ in specs if n in ("reset", "get_reward") or not n.isidentifier()]
        if reserved:
            raise ValueError(f"tools {reserved} cannot be methods: rename them or leave them out with tools=[...]")
        namespace = {n: _tool_method(n, d, s) for n, d, s in specs}
        env_name = type(self._sessions.client).__name__
        return type(f"{env_name}Tools", (_ToolEnvironment,), namespace)

    def _action(self, name: str, arguments: Dict[str, Any]) -> Any:
        if self._mcp:
            from ..core.env_server.mcp_types import CallToolAction

            return CallToolAction(tool_name=name, arguments=arguments)
        assert self._action_cls is not None
        return self._action_cls(**arguments)

    def close(self) -> None:
        """Close every session (and the server the client started, if any)."""
        self._sessions.close()

    def __enter__(self) -> EnvironmentFactory:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _action_type(client: EnvClient[Any, Any, Any]) -> type:
    for klass in type(client).__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            if typing.get_origin(base) is EnvClient:
                action = typing.get_args(base)[0]
                if isinstance(action, type) and hasattr(action, "model_json_schema"):
                    return action
    raise TypeError(
        f"cannot tell the action type of {type(client).__name__}: pass action_cls=... to EnvironmentFactory"
    )
