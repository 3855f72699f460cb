"""``check_env``: an environment checked in this process, the way the server drives it, with no server.

The environment runs under the server's own :class:`~openenv.core.env_server.sessions.SessionManager`,
so it is called exactly as a served one is: sync methods in a worker thread, async ones on the event
loop (``RUNS_ON_EVENT_LOOP`` honoured), keyword arguments filtered by its signatures, MCP actions
answered by ``step_async``, every call bounded by ``timeout_s``. What it returns then goes through
the wire serializer the server uses, and is read back the way a client reads it.
"""

from __future__ import annotations

import inspect
import math
import typing
from typing import Any, List, Optional, Tuple

from ..utils import run_async_safely
from ._common import SEED, comparable, example, first_difference, seed_verdict, short
from .report import CheckReport, Status

_TITLES = {
    "env.construct": "Environment is built",
    "env.types": "Declared types",
    "env.metadata": "Metadata and schemas",
    "env.reset": "reset returns the declared observation",
    "mcp.tools": "MCP tools listed and callable",
    "env.step": "step returns the declared observation",
    "env.state": "state is the declared State",
    "env.wire": "Action, observations and state survive the wire",
    "env.seed_determinism": "Same seed, same episode",
    "env.step_after_done": "A step after the episode ended",
    "env.snapshot": "Snapshot, restore, and continue the same",
    "env.close": "close releases the environment",
}


def check_env(
    env: Any,
    *,
    action: Any = None,
    action_cls: Optional[type] = None,
    observation_cls: Optional[type] = None,
    state_cls: Optional[type] = None,
    max_episode_steps: int = 100,
    timeout_s: float = 30.0,
    raise_on_failure: bool = True,
) -> CheckReport:
    """Check an environment in this process against what a trainer relies on, as Gymnasium's
    ``check_env`` does for its environments.

    ``env`` is an :class:`~openenv.core.env_server.interfaces.Environment` instance, or its class
    (built with no arguments). It is reset, stepped and read as the server would, and checked:
    ``reset`` and ``step`` return the declared observation type with a finite (or None) reward and
    a bool ``done``; ``state`` is the declared :class:`State` with ``episode_id`` and a
    ``step_count`` that counts; action, observations and state survive our wire serializer and
    come back as a client reads them; metadata and JSON schemas are available; an
    :class:`MCPEnvironment` lists its tools and a tool call works; the same seed gives the same
    episode; a step after the episode ended is refused or keeps ``done``; ``close`` works twice.
    The environment is left closed.

    The types come from ``class MyEnv(Environment[MyAction, MyObservation, MyState])`` unless
    given (``action_cls`` ...). ``action`` is a valid step action (an Action, or its JSON data);
    by default one is made from the action schema (for an MCP environment, a call of its first
    tool). ``max_episode_steps`` bounds the steps taken to end an episode; ``timeout_s`` each call.

    Raises :class:`~openenv.core.checks.EnvCheckError` naming every failed check and what was
    wrong, and issues soft problems as :class:`~openenv.core.checks.EnvCheckWarning`; with
    ``raise_on_failure=False``, returns the :class:`~openenv.core.checks.CheckReport` instead
    (``report.ok``, ``report.checks``). A ``TypeError`` when ``env`` is no environment at all.
    """
    from ..env_server.interfaces import Environment

    cls = env if isinstance(env, type) else type(env)
    if not issubclass(cls, Environment):
        what = env.__name__ if isinstance(env, type) else f"a {type(env).__name__}"
        raise TypeError(f"check_env takes an Environment (an instance or its class), not {what}")
    report = CheckReport(target=f"{cls.__module__}.{cls.__qualname__}", kind="environment", name=cls.__name__)
    probe = _EnvProbe(env, cls, report, action, (action_cls, observation_cls, state_cls), timeout_s)
    run_async_safely(probe.run(max_episode_steps))
    return report.finish(raise_on_failure)


def declared_types(cls: type) -> Tuple[Optional[type], Optional[type], Optional[type]]:
    """The action, observation and state classes of ``class C(Environment[A, O, S])`` (None for
    each one ``cls`` does not name)."""
    from ..env_server.interfaces import Environment

    found: List[Optional[type]] = [None, None, None]
    for klass in cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            origin = typing.get_origin(base)
            if isinstance(origin, type) and issubclass(origin, Environment):
                for i, arg in enumerate(typing.get_args(base)[:3]):
                    if found[i] is None and isinstance(arg, type):
                        found[i] = arg
    return found[0], found[1], found[2]


def _raised(exc: BaseException) -> str:
    """``ValueError: why (at file.py:12 in step)``: the exception and where it was raised."""
    from ..env_server.exceptions import EnvironmentCallError

    if isinstance(exc, EnvironmentCallError) and exc.__cause__ is not None:
        exc = exc.__cause__  # (the manager's wrapper of a SystemExit or a ValidationError)
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    frames = inspect.getinnerframes(exc.__traceback__) if exc.__traceback__ is not None else []
    if frames:
        last = frames[-1]
        text += f" (at {last.filename.rsplit('/', 1)[-1]}:{last.lineno} in {last.function})"
    return text


def _number_problem(reward: Any) -> Optional[str]:
    if reward is None:
        return None
    if not isinstance(reward, (int, float)):
        return f"reward is a {type(reward).__name__} ({short(reward, 40)}), not a number or None"
    if not math.isfinite(float(reward)):
        return f"reward is {reward}, not a finite number: it reaches the client as null (None)"
    return None


class _EnvProbe:
    """Runs the checks on one environment, adding them to the report in order."""

    def __init__(
        self,
        env: Any,
        cls: type,
        report: CheckReport,
        action: Any,
        given: Tuple[Optional[type], Optional[type], Optional[type]],
        timeout_s: float,
    ) -> None:
        from ..env_server.sessions import env_traits
        from ..env_server.types import Action

        self.env = env
        self.cls = cls
        self.report = report
        self.given_action = action
        self.given = given
        self.timeout_s = timeout_s
        self.traits = env_traits(cls)
        self.action_cls: type = Action
        self.observation_cls: Optional[type] = None
        self.state_cls: Optional[type] = None
        self.manager: Any = None
        self.session: Any = None
        self.action: Any = None  # an action the environment stepped with

    def add(self, id: str, status: Status, detail: str) -> None:
        self.report.add(id, _TITLES[id], status, detail)

    def skip_rest(self, reason: str, but_close: bool = False) -> None:
        """Mark every check not run yet as skipped (``but_close``: all but the close, still to come)."""
        done = {c.id for c in self.report.checks}
        for id in _TITLES:
            if id not in done and not (but_close and id == "env.close"):
                self.add(id, Status.SKIPPED, reason)

    # --- calls, as the server makes them -----------------------------------------------------

    async def reset(self, seed: Optional[int]) -> Any:
        return await self.manager.reset(self.session, {} if seed is None else {"seed": seed})

    async def step(self, action: Any) -> Any:
        return await self.manager.step(self.session, action)

    async def state(self) -> Any:
        return await self.manager.state(self.session)

    # --- the checks --------------------------------------------------------------------------

    async def run(self, max_episode_steps: int) -> None:
        from ..env_server.sessions import SessionKind, SessionManager

        if not self._constructible():
            self.skip_rest("the environment could not be built")
            return
        factory = self.cls if isinstance(self.env, type) else (lambda: self.env)
        # One worker thread: every sync call on the one thread, as one that requires it gets on a server.
        self.manager = SessionManager(factory, max_sessions=1, step_timeout_s=self.timeout_s, worker_threads=1)
        try:
            try:
                self.session = await self.manager.create(SessionKind.SOCKET)
            except Exception as exc:
                cause = exc.__cause__ or exc
                self.add("env.construct", Status.FAILED, f"{self.cls.__name__}() raised {_raised(cause)}")
                self.skip_rest("the environment could not be built")
                return
            built = "given an instance" if self.env is self.session.env else f"{self.cls.__name__}() built"
            self.add("env.construct", Status.PASSED, built)
            self._types()
            await self._metadata()
            if not await self._episode_checks(max_episode_steps):
                self.skip_rest("needs a working reset (see env.reset)", but_close=True)
            await self._close()
        finally:
            await self.manager.shutdown()

    def _constructible(self) -> bool:
        if not isinstance(self.env, type):
            return True
        try:
            parameters = inspect.signature(self.cls).parameters.values()
        except (TypeError, ValueError):
            return True
        kinds = (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            inspect.Parameter.KEYWORD_ONLY,
        )
        needed = [p.name for p in parameters if p.default is p.empty and p.kind in kinds]
        if not needed:
            return True
        name = self.cls.__name__
        arguments = ", ".join(f"{n}=..." for n in needed)
        self.add(
            "env.construct",
            Status.FAILED,
            f"{name}() needs the argument{'s' if len(needed) > 1 else ''} {', '.join(needed)}: build it yourself "
            f"and check the instance, check_env({name}({arguments})); a server builds it from a factory that "
            "passes them (create_app(functools.partial(...), ...))",
        )
        return False

    def _types(self) -> None:
        from ..env_server.mcp_types import CallToolAction
        from ..env_server.types import Action, Observation, State

        names = [given or found for given, found in zip(self.given, declared_types(self.cls), strict=True)]
        action, observation, state = names
        if self.traits.mcp and action is None:
            action = CallToolAction
        wrong = [
            f"{role} class {cls!r} is not a subclass of openenv's {base.__name__}"
            for role, cls, base in (
                ("action", action, Action),
                ("observation", observation, Observation),
                ("state", state, State),
            )
            if cls is not None and not (isinstance(cls, type) and issubclass(cls, base))
        ]
        if wrong:
            self.add("env.types", Status.FAILED, "; ".join(wrong))
            return
        self.action_cls = action or Action
        self.observation_cls = observation
        self.state_cls = state
        shown = ", ".join(
            f"{role} {cls.__name__}"
            for role, cls in (("action", action), ("observation", observation), ("state", state))
            if cls
        )
        if self.traits.mcp:
            self.add("env.types", Status.PASSED, f"an MCP environment: {shown}")
        elif all(cls is None for cls in names):
            self.add(
                "env.types",
                Status.WARNING,
                f"{self.cls.__name__} declares no types, so neither a trainer nor this check can tell what "
                f"reset and step return or make an action: write class {self.cls.__name__}(Environment[MyAction, "
                "MyObservation, MyState]), or pass action_cls=, observation_cls=, state_cls=",
            )
        else:
            origin = "given" if any(self.given) else f"from Environment[...] of {self.cls.__name__}"
            self.add("env.types", Status.PASSED, f"{shown} ({origin})")

    async def _metadata(self) -> None:
        from ..env_server.types import EnvironmentMetadata, Observation, State

        try:
            metadata = await self.manager.call(self.session, "get_metadata", lambda env: env.get_metadata())
            if not isinstance(metadata, EnvironmentMetadata):  # a dict of its fields passes on the server too
                metadata = EnvironmentMetadata.model_validate(metadata)
        except Exception as exc:
            self.add("env.metadata", Status.FAILED, f"get_metadata() (GET /metadata) failed: {_raised(exc)}")
            return
        models = [self.action_cls, self.observation_cls or Observation, self.state_cls or State]
        for model in models:
            try:
                model.model_json_schema()
            except Exception as exc:
                self.add(
                    "env.metadata",
                    Status.FAILED,
                    f"{model.__name__}.model_json_schema() (GET /schema) failed: {_raised(exc)}",
                )
                return
        version = f" {metadata.version}" if metadata.version else ""
        schemas = ", ".join(m.__name__ for m in models)
        self.add("env.metadata", Status.PASSED, f"{metadata.name}{version}; JSON schemas of {schemas}")

    async def _episode_checks(self, max_episode_steps: int) -> bool:
        """reset, the MCP tools, step, state and the wire; then seeds and the end of an episode.
        False when reset did not work."""
        try:
            reset = await self.reset(SEED)
        except Exception as exc:
            self.add("env.reset", Status.FAILED, f"reset(seed={SEED}) raised {_raised(exc)}")
            return False
        problems = self._observation_problems(reset, self.observation_cls if not self.traits.mcp else None)
        if problems:
            self.add("env.reset", Status.FAILED, f"reset(seed={SEED}): {'; '.join(problems)}")
        else:
            self.add("env.reset", Status.PASSED, _described(reset))
        before = await self._read_state()
        await self._mcp_tools()
        step = await self._step()
        after = await self._read_state()
        self._state(before, after)
        observations = [o for o in (reset, step) if o is not None and not self._observation_problems(o, None)]
        self._wire(observations, after)
        stepped = self.report.get("env.step")
        if problems or step is None or (stepped is not None and not stepped.ok):
            self.skip_rest("needs reset and step to return observations (see env.reset and env.step)", but_close=True)
            return True
        await self._determinism()
        await self._after_done(max_episode_steps)
        await self._snapshot()
        return True

    def _observation_problems(self, observation: Any, declared: Optional[type]) -> List[str]:
        from ..env_server.types import Observation

        if not isinstance(observation, Observation):
            return [f"returned a {type(observation).__name__}, not an Observation"]
        problems = []
        if declared is not None and not isinstance(observation, declared):
            problems.append(f"returned a {type(observation).__name__}, not the declared {declared.__name__}")
        if not isinstance(observation.done, bool):
            problems.append(f"done is {observation.done!r} (a {type(observation.done).__name__}), not a bool")
        reward = _number_problem(observation.reward)
        if reward:
            problems.append(reward)
        return problems

    async def _read_state(self) -> Any:
        """The state as it is now (a copy: many environments hand out the object they update), or
        the exception reading it raised."""
        try:
            state = await self.state()
        except Exception as exc:
            return exc
        try:
            return state.model_copy(deep=True)
        except Exception:
            return state

    async def _mcp_tools(self) -> None:
        from ..env_server.mcp_types import CallToolAction, CallToolObservation, ListToolsAction, ListToolsObservation

        if not self.traits.mcp:
            self.add("mcp.tools", Status.SKIPPED, "not an MCP environment")
            return
        try:
            listed = await self.step(ListToolsAction())
        except Exception as exc:
            self.add("mcp.tools", Status.FAILED, f"step(ListToolsAction()) raised {_raised(exc)}")
            return
        error = listed.metadata.get("error") if isinstance(listed, ListToolsObservation) else None
        if not isinstance(listed, ListToolsObservation) or error:
            why = error or f"a {type(listed).__name__}, not a ListToolsObservation"
            self.add("mcp.tools", Status.FAILED, f"step(ListToolsAction()) answered {why}")
            return
        if not listed.tools:
            self.add("mcp.tools", Status.FAILED, "step(ListToolsAction()) lists no tools: an agent has nothing to call")
            return
        try:
            call, origin = self._given(CallToolAction)
        except Exception:  # (an action given that does not validate: env.step says so)
            call, origin = None, ""
        if call is None:
            tool = listed.tools[0]
            call = CallToolAction(tool_name=tool.name, arguments=example(tool.input_schema, tool.input_schema) or {})
            origin = "generated"
        names = ", ".join(t.name for t in listed.tools)
        shown = f"{call.tool_name}({short(call.arguments, 60)})"
        try:
            called = await self.step(call)
        except Exception as exc:
            self.add("mcp.tools", Status.FAILED, f"lists {names}; step(CallToolAction {shown}) raised {_raised(exc)}")
            return
        if not isinstance(called, CallToolObservation):
            self.add("mcp.tools", Status.FAILED, f"lists {names}; {shown} answered a {type(called).__name__}")
            return
        if called.error is not None:
            hint = (
                ""
                if origin != "generated"
                else (
                    "; if those arguments are not valid for it, pass a valid call: "
                    f"check_env(env, action=CallToolAction(tool_name={call.tool_name!r}, arguments={{...}}))"
                )
            )
            self.add(
                "mcp.tools",
                Status.FAILED,
                f"lists {names}; the call {shown} ({origin}) failed, {called.error.error_type.value}: "
                f"{called.error.message}{hint}",
            )
            return
        self.action = self.action or call
        value = getattr(called.result, "data", called.result)
        self.add("mcp.tools", Status.PASSED, f"lists {names}; {shown} -> {short(value, 60)}")

    def _given(self, cls: Optional[type] = None) -> Tuple[Any, str]:
        """The action given to check_env (made an Action as the server would), and where it came from."""
        from ..env_server.serialization import deserialize_action

        given = self.given_action
        if given is None:
            return None, ""
        if isinstance(given, dict):
            given = deserialize_action(given, self.action_cls)
        if cls is not None and not isinstance(given, cls):
            return None, ""
        return given, "given"

    def _step_action(self) -> Tuple[Any, str]:
        """The action to step with, where it came from; (None, why) when there is none."""
        from ..env_server.serialization import deserialize_action
        from ..env_server.types import Action

        try:
            given, origin = self._given()
        except Exception as exc:
            return None, f"the action given does not validate as {self.action_cls.__name__}: {_raised(exc)}"
        if given is not None:
            return given, origin
        if self.action is not None:  # the MCP tool call that worked
            return self.action, "generated: a call of the first tool"
        if self.action_cls is Action:
            return None, "no action type declared to make an action from: pass action= (or action_cls=)"
        schema = self.action_cls.model_json_schema()
        try:
            action = deserialize_action(example(schema, schema) or {}, self.action_cls)
        except Exception as exc:
            return None, f"no valid {self.action_cls.__name__} could be made from its schema ({exc}): pass action="
        return action, "generated from the action schema"

    async def _step(self) -> Any:
        action, origin = self._step_action()
        if action is None:
            self.add("env.step", Status.WARNING, origin)
            return None
        try:
            observation = await self.step(action)
        except Exception as exc:
            text = f"step({_shown(action)}) ({origin}) raised {_raised(exc)}"
            if origin == "given":
                self.add("env.step", Status.FAILED, text)
            else:
                self.add("env.step", Status.WARNING, f"{text}; pass a valid action with check_env(env, action=...)")
            return None
        self.action = action
        declared = self.observation_cls if not self.traits.mcp or not _is_mcp_action(action) else None
        problems = self._observation_problems(observation, declared)
        if problems:
            self.add("env.step", Status.FAILED, f"step({_shown(action)}): {'; '.join(problems)}")
        else:
            self.add("env.step", Status.PASSED, f"{_shown(action)} ({origin}) -> {_described(observation)}")
        return observation

    def _state(self, before: Any, after: Any) -> None:
        from ..env_server.types import State

        problems = []
        for read in (before, after):
            if isinstance(read, Exception):
                self.add("env.state", Status.FAILED, f"reading env.state raised {_raised(read)}")
                return
            if not isinstance(read, State):
                problems.append(
                    f"state is a {type(read).__name__}, not an openenv State (which carries episode_id and "
                    "step_count): derive its class from openenv.core.env_server.types.State"
                )
            elif self.state_cls is not None and not isinstance(read, self.state_cls):
                problems.append(f"state is a {type(read).__name__}, not the declared {self.state_cls.__name__}")
            else:
                if not isinstance(read.step_count, int) or read.step_count < 0:
                    problems.append(f"step_count is {read.step_count!r}, not a whole number of at least 0")
                if read.episode_id is not None and not isinstance(read.episode_id, str):
                    problems.append(f"episode_id is a {type(read.episode_id).__name__}, not a string or None")
            if problems:
                self.add("env.state", Status.FAILED, "; ".join(problems))
                return
        detail = f"{type(after).__name__}: episode_id {after.episode_id!r}, step_count {after.step_count}"
        stepped = self.report.get("env.step")
        if stepped is not None and stepped.status is Status.PASSED and after.step_count <= before.step_count:
            self.add(
                "env.state",
                Status.WARNING,
                f"step_count is {after.step_count} after a step (it was {before.step_count} after reset): "
                "count each step in it, trainers and GET /state read it",
            )
        else:
            self.add("env.state", Status.PASSED, detail)

    def _wire(self, observations: List[Any], state: Any) -> None:
        """What the server sends, read back as a client reads it, must be what was sent."""
        from ..env_server.serialization import (
            deserialize_action,
            dumps_json,
            observation_payload_json,
            parse_json,
            to_jsonable,
        )
        from ..env_server.types import State

        problems = []
        checked = []
        if self.action is not None:
            server_cls = type(self.action) if _is_mcp_action(self.action) else self.action_cls
            sent = _jsonable(self.action)
            try:
                back = to_jsonable(deserialize_action(parse_json(dumps_json(self.action)), server_cls))
            except Exception as exc:
                back, problems = None, [f"the action {short(sent)} does not validate once sent: {exc}"]
            if back is not None and back != sent:
                problems.append(f"the action changes when sent ({first_difference(sent, back)})")
            checked.append("action")
        for observation in observations:
            name = type(observation).__name__
            client_cls = type(observation) if self.traits.mcp else self.observation_cls or type(observation)
            try:
                payload = parse_json(observation_payload_json(observation))
            except Exception as exc:
                problems.append(f"the {name} cannot be sent as JSON: {exc}")
                continue
            fields = {**payload["observation"], "reward": payload["reward"], "done": payload["done"]}
            try:
                read = client_cls.model_validate(fields)
            except Exception as exc:
                problems.append(f"a client cannot read the {name} it is sent as a {client_cls.__name__}: {exc}")
                continue
            again = parse_json(observation_payload_json(read))
            if again != payload:
                problems.append(f"the {name} changes on its way to a client ({first_difference(payload, again)})")
            checked.append(name)
        if isinstance(state, State):
            try:
                data = parse_json(dumps_json(state))
                back = to_jsonable((self.state_cls or type(state)).model_validate(data))
            except Exception as exc:
                problems.append(f"the {type(state).__name__} does not survive the wire: {exc}")
            else:
                if back != data:
                    problems.append(f"the state changes when sent ({first_difference(data, back)})")
                checked.append(type(state).__name__)
        if problems:
            self.add("env.wire", Status.FAILED, "; ".join(problems))
        elif checked:
            self.add("env.wire", Status.PASSED, f"{', '.join(dict.fromkeys(checked))} sent and read back unchanged")
        else:
            self.add("env.wire", Status.SKIPPED, "nothing to send (see env.reset, env.step and env.state)")

    async def _determinism(self) -> None:
        from ..env_server.serialization import observation_payload_json, parse_json

        def wire(observation: Any) -> Any:
            return comparable(parse_json(observation_payload_json(observation)))

        async def episode(seed: Optional[int]) -> Tuple[Any, Any]:
            reset = await self.reset(seed)
            if reset.done:
                return wire(reset), None
            try:
                step = await self.step(self.action)
            except Exception:  # as over /ws, where a refused step is compared as no step
                return wire(reset), None
            return wire(reset), wire(step)

        accepts = self.traits.reset_kwargs is None or "seed" in self.traits.reset_kwargs
        status, detail = await seed_verdict(episode, (Exception,), self.cls.__name__, accepts)
        self.add("env.seed_determinism", status, detail)

    async def _after_done(self, max_episode_steps: int) -> None:
        try:
            observation = await self.reset(SEED)
            steps = 0
            while not observation.done and steps < max_episode_steps:
                observation = await self.step(self.action)
                steps += 1
        except Exception as exc:
            self.add("env.step_after_done", Status.FAILED, f"playing an episode to its end raised {_raised(exc)}")
            return
        if not observation.done:
            self.add(
                "env.step_after_done",
                Status.SKIPPED,
                f"no episode ended within {max_episode_steps} steps of {_shown(self.action)} (max_episode_steps)",
            )
            return
        ended = f"the episode ended after {steps} step{'s' if steps != 1 else ''}"
        try:
            after = await self.step(self.action)
        except Exception as exc:
            self.add("env.step_after_done", Status.PASSED, f"{ended}; a step after it was refused: {_raised(exc)}")
            return
        problems = self._observation_problems(after, None)
        if problems:
            self.add("env.step_after_done", Status.FAILED, f"{ended}; a step after it: {'; '.join(problems)}")
        elif after.done:
            self.add("env.step_after_done", Status.PASSED, f"{ended}; a step after it answered done=True again")
        else:
            self.add(
                "env.step_after_done",
                Status.WARNING,
                f"{ended}; a step after it answered done=False (reward {after.reward}), as if the episode went "
                "on: refuse such a step (raise) or keep done=True until reset(), so that a trainer stepping past "
                "the end notices",
            )

    async def _snapshot(self) -> None:
        """With ``SUPPORTS_SNAPSHOT``: save after a step, take two more, load the save back, take
        the same two again: the observations must be the same (as a fork's would be)."""
        from ..env_server.serialization import observation_payload_json, parse_json
        from ..env_server.snapshots import SnapshotSeal

        if not getattr(self.cls, "SUPPORTS_SNAPSHOT", False):
            self.add("env.snapshot", Status.SKIPPED, f"{self.cls.__name__} does not set SUPPORTS_SNAPSHOT")
            return
        seal = SnapshotSeal(env_name=self.cls.__name__)

        async def two_steps() -> List[Any]:
            seen = []
            for _ in range(2):
                try:
                    observation = await self.step(self.action)
                except Exception as exc:
                    seen.append(f"refused: {type(exc).__name__}")
                    break
                seen.append(comparable(parse_json(observation_payload_json(observation))))
                if observation.done:
                    break
            return seen

        try:
            await self.reset(SEED)
            await self.step(self.action)
            blob = await self.manager.call(self.session, "snapshot", seal.seal)
        except Exception as exc:
            self.add("env.snapshot", Status.FAILED, f"saving the session raised {_raised(exc)}")
            return
        first = await two_steps()
        try:
            await self.manager.call(self.session, "restore", lambda env: seal.restore(env, blob))
        except Exception as exc:
            self.add("env.snapshot", Status.FAILED, f"loading the snapshot back raised {_raised(exc.__cause__ or exc)}")
            return
        again = await two_steps()
        if again != first:
            where = first_difference(first, again)
            self.add(
                "env.snapshot",
                Status.FAILED,
                f"after the snapshot was loaded back, the same actions gave other observations ({where}): "
                "snapshot_state must carry everything the next steps depend on (random generators included)",
            )
            return
        self.add(
            "env.snapshot",
            Status.PASSED,
            f"a {len(blob)}-byte snapshot; loaded back, {len(first)} step(s) repeated exactly",
        )

    async def _close(self) -> None:
        for which in ("close()", "a second close()"):
            try:
                await self.manager.call(self.session, "close", lambda env: env.close())
            except Exception as exc:
                must = " (close must be safe to call twice)" if which != "close()" else ""
                self.add("env.close", Status.FAILED, f"{which} raised {_raised(exc)}{must}")
                break
        else:
            self.add("env.close", Status.PASSED, "close() returned, twice")
        self.session.env = None  # closed by the check: the manager's shutdown must not close it again


def _is_mcp_action(action: Any) -> bool:
    from ..env_server.mcp_types import CallToolAction, ListToolsAction

    return isinstance(action, (CallToolAction, ListToolsAction))


def _shown(action: Any) -> str:
    """An action as JSON for a report, less its metadata when empty."""
    data = _jsonable(action)
    if isinstance(data, dict) and not data.get("metadata"):
        data.pop("metadata", None)
    return short(data, 80)


def _jsonable(value: Any) -> Any:
    from ..env_server.serialization import to_jsonable

    try:
        return to_jsonable(value)
    except Exception:
        return repr(value)


def _described(observation: Any) -> str:
    names = [n for n in type(observation).model_fields if n not in ("metadata", "reward", "done")]
    shown = ", ".join(names) if names else "no fields of its own"
    return f"{type(observation).__name__} ({shown}), reward {observation.reward}, done {observation.done}"
